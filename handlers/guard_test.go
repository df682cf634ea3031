package handlers

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nkeys"

	"github.com/cotal-ai/authplane/client"
	"github.com/cotal-ai/authplane/internal/capability/manager"
	"github.com/cotal-ai/authplane/internal/core/audit"
	"github.com/cotal-ai/authplane/internal/core/fault"
	"github.com/cotal-ai/authplane/internal/core/issue"
	"github.com/cotal-ai/authplane/internal/testkit"
	"github.com/cotal-ai/authplane/subjects"
)

const owner = "u_aaaaaaaaaaaaaaaaaaaaaaaaaa"

// guardEnv is a guard recording into an in-memory audit stream.
type guardEnv struct {
	g        *Guard
	records  *testkit.Stream
	fenced   atomic.Bool
	draining atomic.Bool
	unsynced atomic.Bool
}

func newGuardEnv(rate float64, burst int) *guardEnv {
	e := &guardEnv{records: testkit.NewStream()}
	w := audit.New("default", e.records, slog.New(slog.DiscardHandler), time.Now)
	e.g = &Guard{Limiter: issue.NewBuckets(rate, burst, nil), Audit: w, Fenced: e.fenced.Load, Draining: e.draining.Load,
		Unsynced: e.unsynced.Load}
	return e
}

func call(actor, body string) Call {
	return Call{Endpoint: subjects.EndpointManagerAuthority, Owner: owner, Actor: actor, Body: []byte(body), Deadline: time.Now().Add(2 * time.Second)}
}

// refused returns the `refused` records written.
func (e *guardEnv) refused(t *testing.T) []audit.Decision {
	t.Helper()
	var out []audit.Decision
	for _, m := range e.records.Msgs() {
		if !strings.Contains(m.Subject, ".audit.refused.") {
			continue
		}
		var d audit.Decision
		if err := json.Unmarshal(m.Data, &d); err != nil {
			t.Fatal(err)
		}
		out = append(out, d)
	}
	return out
}

// counting is a Func that counts its calls and answers with reply or err.
func counting(n *atomic.Int32, reply any, err error) Func {
	return func(_ context.Context, c Call) (any, audit.Request, error) {
		n.Add(1)
		about := c.About()
		about.Kind = "manager-service-authority"
		return reply, about, err
	}
}

func TestTheGuardRecordsARefusalWithWhatTheHandlerParsed(t *testing.T) {
	e := newGuardEnv(0, 0)
	var n atomic.Int32
	_, refusal := e.g.Serve(call("cli", "{}"), counting(&n, nil, fault.New(fault.PermissionDenied, "no scope")))
	if refusal == nil || refusal.Code != fault.PermissionDenied || n.Load() != 1 {
		t.Fatalf("got %v after %d calls, want permission-denied from the one call", refusal, n.Load())
	}
	got := e.refused(t)
	if len(got) != 1 || got[0].Code != "permission-denied" || got[0].Kind != "manager-service-authority" ||
		got[0].Caller != owner+".cli" || got[0].Endpoint != subjects.EndpointManagerAuthority {
		t.Fatalf("got records %+v, want one refused naming the caller, endpoint and kind", got)
	}
}

func TestTheGuardDoesNotRecordADiscardedMintAgain(t *testing.T) {
	e := newGuardEnv(0, 0)
	var n atomic.Int32
	discarded := &fault.Error{Code: fault.Conflict, Message: "moved", Cause: errors.Join(issue.ErrDiscarded, errors.New("cas"))}
	if _, refusal := e.g.Serve(call("cli", "{}"), counting(&n, nil, discarded)); refusal == nil || refusal.Code != fault.Conflict {
		t.Fatalf("got %v, want the conflict answered", refusal)
	}
	if got := e.refused(t); len(got) != 0 {
		t.Fatalf("got refused records %+v, want none: the pipeline recorded it discarded", got)
	}
}

func TestThrottledCallsAreRefusedUncalledAndUnrecorded(t *testing.T) {
	e := newGuardEnv(0.001, 2)
	var n atomic.Int32
	for range 2 {
		if _, refusal := e.g.Serve(call("cli", "{}"), counting(&n, "ok", nil)); refusal != nil {
			t.Fatalf("within the burst: got %v", refusal)
		}
	}
	_, refusal := e.g.Serve(call("cli", "{}"), counting(&n, "ok", nil))
	if refusal == nil || refusal.Code != fault.ResourceExhausted || !errors.Is(refusal, ErrThrottled) {
		t.Fatalf("past the burst: got %v, want resource-exhausted wrapping ErrThrottled", refusal)
	}
	if n.Load() != 2 || len(e.refused(t)) != 0 {
		t.Fatalf("got %d calls and %d records, want the throttled call neither served nor recorded", n.Load(), len(e.refused(t)))
	}
	if _, refusal := e.g.Serve(call("other", "{}"), counting(&n, "ok", nil)); refusal != nil {
		t.Fatalf("another principal: got %v, want its own budget", refusal)
	}
}

func TestACallWithoutAValidPrincipalIsRefusedUncalled(t *testing.T) {
	e := newGuardEnv(0, 0)
	var n atomic.Int32
	for _, c := range []Call{call("a.b", "{}"), call("", "{}"), {Owner: "x_y", Actor: "cli", Deadline: time.Now().Add(time.Second)}} {
		if _, refusal := e.g.Serve(c, counting(&n, "ok", nil)); refusal == nil || refusal.Code != fault.BadRequest {
			t.Errorf("%+v: got %v, want bad-request", c, refusal)
		}
	}
	if n.Load() != 0 {
		t.Fatalf("the handler ran %d times, want never", n.Load())
	}
}

func TestAFencedPlaneAnswersUnavailableBeforeAndDuringACall(t *testing.T) {
	e := newGuardEnv(0, 0)
	var n atomic.Int32
	e.fenced.Store(true)
	if _, refusal := e.g.Serve(call("cli", "{}"), counting(&n, "ok", nil)); refusal == nil || refusal.Code != fault.Unavailable || n.Load() != 0 {
		t.Fatalf("fenced before: got %v after %d calls, want unavailable and no call", refusal, n.Load())
	}
	e.fenced.Store(false)
	during := func(_ context.Context, c Call) (any, audit.Request, error) {
		e.fenced.Store(true) // the fence lands while the call is served
		return nil, c.About(), fault.New(fault.PermissionDenied, "no scope")
	}
	if _, refusal := e.g.Serve(call("cli", "{}"), during); refusal == nil || refusal.Code != fault.Unavailable {
		t.Fatalf("fenced during: got %v, want unavailable", refusal)
	}
	if got := e.refused(t); len(got) != 2 || got[1].Code != "permission-denied" {
		t.Fatalf("got %+v, want both refusals recorded, the second with the handler's own code", got)
	}
}

func TestASuccessAsTheFenceCameIsAnsweredUnavailable(t *testing.T) {
	e := newGuardEnv(0, 0)
	during := func(_ context.Context, c Call) (any, audit.Request, error) {
		e.fenced.Store(true)
		return "credentials", c.About(), nil
	}
	reply, refusal := e.g.Serve(call("cli", "{}"), during)
	if reply != nil || refusal == nil || refusal.Code != fault.Unavailable {
		t.Fatalf("got %v, %v; want nothing sent and unavailable", reply, refusal)
	}
	if got := e.refused(t); len(got) != 0 {
		t.Fatalf("got %+v, want no refused record: a mint withheld is the pipeline's to record", got)
	}
}

func TestTheHandlersWorkEndsBeforeTheCallsDeadline(t *testing.T) {
	e := newGuardEnv(0, 0)
	c := call("cli", "{}")
	var left time.Duration
	e.g.Serve(c, func(ctx context.Context, c Call) (any, audit.Request, error) {
		d, _ := ctx.Deadline()
		left = c.Deadline.Sub(d)
		return "ok", c.About(), nil
	})
	if left <= 0 {
		t.Fatalf("the handler's deadline is %s before the call's, want time kept back for the records", left)
	}
}

// A stopping plane takes no new call (unavailable, recorded, the handler never called), and a
// call already in the handler when the stop begins gets its own answer.
func TestADrainingPlaneRefusesNewCallsAndFinishesTheOneInFlight(t *testing.T) {
	e := newGuardEnv(0, 0)
	inside, release := make(chan struct{}), make(chan struct{})
	var n atomic.Int32
	done := make(chan *fault.Error, 1)
	go func() {
		_, refusal := e.g.Serve(call("cli", "{}"), func(ctx context.Context, c Call) (any, audit.Request, error) {
			n.Add(1)
			close(inside)
			<-release
			return "minted", c.About(), nil
		})
		done <- refusal
	}()
	<-inside
	e.draining.Store(true)
	if _, refusal := e.g.Serve(call("cli", "{}"), counting(&n, "x", nil)); refusal == nil || refusal.Code != fault.Unavailable ||
		!strings.Contains(refusal.Message, "stopping") {
		t.Errorf("a call after the stop began: got %v, want unavailable saying the plane is stopping", refusal)
	}
	close(release)
	if refusal := <-done; refusal != nil {
		t.Errorf("the call in flight: got %v, want its answer", refusal)
	}
	if n.Load() != 1 {
		t.Errorf("the handler ran %d times, want once (the call in flight only)", n.Load())
	}
	if got := e.refused(t); len(got) != 1 || got[0].Code != string(fault.Unavailable) {
		t.Errorf("records: got %+v, want the one unavailable refusal", got)
	}
}

// While a server of the broker does not sync every write (and the operator did not accept it),
// every call is answered unavailable, recorded, without its handler; once it does, calls are
// served again.
func TestAPlaneOnAnUnsyncedServerRefusesEveryCallUntilItSyncs(t *testing.T) {
	e := newGuardEnv(0, 0)
	var n atomic.Int32
	e.unsynced.Store(true)
	if _, refusal := e.g.Serve(call("cli", "{}"), counting(&n, "x", nil)); refusal == nil || refusal.Code != fault.Unavailable ||
		!strings.Contains(refusal.Message, "does not sync every write") {
		t.Errorf("a call on an unsynced server: got %v, want unavailable saying a server does not sync", refusal)
	}
	if n.Load() != 0 {
		t.Errorf("the handler ran %d times, want never", n.Load())
	}
	if got := e.refused(t); len(got) != 1 || got[0].Code != string(fault.Unavailable) {
		t.Errorf("records: got %+v, want the one unavailable refusal", got)
	}
	e.unsynced.Store(false)
	if _, refusal := e.g.Serve(call("cli", "{}"), counting(&n, "x", nil)); refusal != nil || n.Load() != 1 {
		t.Errorf("once every server syncs: got %v after %d handler runs, want the call served", refusal, n.Load())
	}
}

// The manager-authority endpoint on the in-memory stores: a prepare through the guard mints,
// and a refusal of a known kind is recorded with what parsed.
func TestManagerAuthorityServesPreparesAndRecordsItsRefusals(t *testing.T) {
	e := newGuardEnv(0, 0)
	acct, err := nkeys.CreateAccount()
	if err != nil {
		t.Fatal(err)
	}
	acctPub, err := acct.PublicKey()
	if err != nil {
		t.Fatal(err)
	}
	iss, err := issue.NewIssuer(acctPub, acct, time.Now)
	if err != nil {
		t.Fatal(err)
	}
	actors := testkit.NewKV()
	if _, err := manager.SetScope(context.Background(), actors, owner, "cli", []string{manager.Supervise}, time.Now()); err != nil {
		t.Fatal(err)
	}
	gates := testkit.NewKV()
	engine := &manager.Engine{Space: "default", Account: acctPub, Gates: gates, Ledger: actors,
		Pipeline:    &issue.Pipeline{Issuer: iss, Audit: audit.New("default", e.records, slog.New(slog.DiscardHandler), time.Now), Claims: &issue.Claims{KV: gates}, Now: time.Now},
		ProofKey:    []byte(strings.Repeat("k", 32)),
		StandingTTL: time.Hour, MaxInstancesPerOwner: 64}
	fn := ManagerAuthority(engine)
	m, _, err := client.NewManager()
	if err != nil {
		t.Fatal(err)
	}
	ids := m.Identities
	body, err := json.Marshal(client.ServiceAuthority{Operation: client.OpPrepare, Envelope: client.Envelope{V: 1, Kind: client.KindServiceAuthority,
		Space: "default", Actor: "cli", InstanceID: m.InstanceID, ManagerLifecycleUID: m.LifecycleUID,
		RequestID: strings.Repeat("r", 22), Identities: &ids}})
	if err != nil {
		t.Fatal(err)
	}
	reply, refusal := e.g.Serve(call("cli", string(body)), fn)
	if refusal != nil {
		t.Fatal(refusal)
	}
	if mat, ok := reply.(*client.Material); !ok || len(mat.Credentials) != 2 || mat.RegistrationProof == "" {
		t.Fatalf("got %#v, want the supervisor and executor and a proof", reply)
	}

	// Another principal without scope: refused, recorded with the kind, operation and ids.
	if _, refusal := e.g.Serve(call("nobody", strings.Replace(string(body), `"actor":"cli"`, `"actor":"nobody"`, 1)), fn); refusal == nil || refusal.Code != fault.PermissionDenied {
		t.Fatalf("got %v, want permission-denied", refusal)
	}
	got := e.refused(t)
	if len(got) != 1 || got[0].Operation != "prepare" || got[0].InstanceID != m.InstanceID || got[0].RequestID != strings.Repeat("r", 22) {
		t.Fatalf("got %+v, want one refused record naming operation, instance and request", got)
	}
	// A kind nobody knows is named nowhere in the record.
	if _, refusal := e.g.Serve(call("cli", `{"kind":"<script>"}`), fn); refusal == nil || refusal.Code != fault.BadRequest {
		t.Fatalf("got %v, want bad-request", refusal)
	}
	if got := e.refused(t); len(got) != 2 || got[1].Kind != "" {
		t.Fatalf("got %+v, want the unknown kind kept out of the record", got)
	}
}

// An owner holds at most OwnerInFlight calls of one endpoint at once: past it a call is
// refused resource-exhausted before its work runs, counted with the throttled and not
// recorded; another owner, another endpoint and the callout are not held back, and a call that
// leaves gives its slot back (once, however often leave is called).
func TestAnOwnersCallsUnderWayAreBoundedPerEndpoint(t *testing.T) {
	e := newGuardEnv(0, 0)
	e.g.OwnerInFlight = 2
	var leaves []func()
	for i := range 2 {
		leave, refusal := e.g.Enter(call("cli", "{}"))
		if refusal != nil {
			t.Fatalf("call %d of 2: %v", i+1, refusal)
		}
		leaves = append(leaves, leave)
	}
	_, refusal := e.g.Enter(call("other", "{}"))
	if refusal == nil || refusal.Code != fault.ResourceExhausted || !errors.Is(refusal, ErrOwnerBusy) || !errors.Is(refusal, ErrThrottled) ||
		!strings.Contains(refusal.Message, "--owner-in-flight") {
		t.Fatalf("a third call of the owner, another principal's: got %v, want resource-exhausted naming --owner-in-flight", refusal)
	}
	others := []Call{
		{Endpoint: subjects.EndpointManagerAuthority, Owner: "u_bbbbbbbbbbbbbbbbbbbbbbbbbb", Actor: "cli"},
		{Endpoint: subjects.EndpointSupervisorEnd, Owner: owner, Actor: "cli"},
		{Endpoint: EndpointCallout, Owner: owner, Actor: "cli"},
		{Endpoint: EndpointCallout, Owner: owner, Actor: "cli"},
		{Endpoint: EndpointCallout, Owner: owner, Actor: "cli"},
	}
	for _, c := range others {
		if _, refusal := e.g.Enter(c); refusal != nil {
			t.Errorf("%s of %s while the owner holds its manager-authority slots: %v", c.Endpoint, c.Owner, refusal)
		}
	}
	leaves[0]()
	leaves[0]()
	if _, refusal := e.g.Enter(call("cli", "{}")); refusal != nil {
		t.Fatalf("after one call left: %v", refusal)
	}
	if _, refusal := e.g.Enter(call("cli", "{}")); refusal == nil {
		t.Fatal("a leave called twice gave back two slots")
	}
	if got := e.refused(t); len(got) != 0 {
		t.Errorf("refusals past --owner-in-flight were recorded: %v", got)
	}
}
