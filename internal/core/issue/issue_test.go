package issue_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nkeys"

	"github.com/cotal-ai/authplane/internal/core/audit"
	"github.com/cotal-ai/authplane/internal/core/fault"
	"github.com/cotal-ai/authplane/internal/core/issue"
	"github.com/cotal-ai/authplane/internal/core/store"
	"github.com/cotal-ai/authplane/internal/testkit"
	"github.com/cotal-ai/authplane/subjects"
)

const owner = "u_aaaaaaaaaaaaaaaaaaaaaaaaaa"

// env is a pipeline on the in-memory stores: a fence bucket holding two open gates (the
// fences a run mint commits on, in order), and the record streams.
type env struct {
	p       *issue.Pipeline
	fences  *testkit.KV
	records *testkit.Stream
	first   *issue.Gate
	second  *issue.Gate
	now     time.Time
	iid     string
}

func newEnv(t testing.TB) *env {
	t.Helper()
	acct, signer := newKP(t, nkeys.CreateAccount), newKP(t, nkeys.CreateAccount)
	e := &env{fences: testkit.NewKV(), records: testkit.NewStream(), now: time.Now(), iid: subjects.NewUID()}
	clock := func() time.Time { return e.now }
	iss, err := issue.NewIssuer(pub(t, acct), signer, clock)
	if err != nil {
		t.Fatal(err)
	}
	e.p = &issue.Pipeline{Issuer: iss, Audit: audit.New("default", e.records, slog.New(slog.DiscardHandler), clock), Claims: &issue.Claims{KV: e.fences}, Now: clock}
	e.first = e.openGate(t, e.iid)
	e.second = e.openGate(t, subjects.NewUID())
	return e
}

func (e *env) openGate(t testing.TB, iid string) *issue.Gate {
	t.Helper()
	absent, err := issue.GateOf(e.fences, subjects.GateEndpointManager, iid).Observe(ctx(t))
	if err != nil {
		t.Fatal(err)
	}
	g, err := absent.Write(ctx(t), issue.GateRow{State: issue.GateOpen, Generation: 1, RegistrationRevision: 1,
		Principal: subjects.Principal(owner, subjects.ServeActor(iid))})
	if err != nil {
		t.Fatal(err)
	}
	return g
}

func ctx(t testing.TB) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	t.Cleanup(cancel)
	return c
}

func newKP(t testing.TB, create func() (nkeys.KeyPair, error)) nkeys.KeyPair {
	t.Helper()
	kp, err := create()
	if err != nil {
		t.Fatal(err)
	}
	return kp
}

func pub(t testing.TB, kp nkeys.KeyPair) string {
	t.Helper()
	p, err := kp.PublicKey()
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// plan asks for the supervisor and executor of the env's instance, committing on both gates.
func (e *env) plan(t testing.TB) issue.Plan {
	t.Helper()
	var grants []issue.Grant
	for _, d := range []subjects.Duty{subjects.DutySupervisor, subjects.DutyExecutor} {
		actor, perms, err := subjects.PermissionsOf(d, subjects.Holder{Space: "default", Owner: owner, Instance: e.iid})
		if err != nil {
			t.Fatal(err)
		}
		grants = append(grants, issue.Grant{Duty: d, Key: pub(t, newKP(t, nkeys.CreateUser)),
			Principal: subjects.Principal(owner, actor), TTL: time.Hour, Permissions: perms})
	}
	return issue.Plan{
		Instance: issue.MustInstance(owner, e.iid),
		Request:  audit.Request{Endpoint: subjects.EndpointManagerAuthority, Caller: owner + ".cli", InstanceID: e.iid, RequestID: subjects.NewRequestID()},
		Grants:   grants,
		Steps:    []issue.Step{issue.Unchanged(e.first), issue.Unchanged(e.second)},
	}
}

// decisions returns the audit decisions recorded, and how many keys the minted records name
// (each record one mint's keys).
func (e *env) decisions(t *testing.T) (decided []audit.Decision, minted int) {
	t.Helper()
	for _, m := range e.records.Msgs() {
		if strings.Contains(m.Subject, ".minted.") {
			var rec audit.Minted
			if err := json.Unmarshal(m.Data, &rec); err != nil {
				t.Fatal(err)
			}
			minted += len(rec.Credentials)
			continue
		}
		var d audit.Decision
		if err := json.Unmarshal(m.Data, &d); err != nil {
			t.Fatal(err)
		}
		decided = append(decided, d)
	}
	return decided, minted
}

// wantDiscarded checks a mint that signed and then did not commit: code, nothing returned,
// every credential recorded minted and then one `discarded` naming them all.
func (e *env) wantDiscarded(t *testing.T, got *issue.Issued, err error, code fault.Code) {
	t.Helper()
	if got != nil || fault.CodeOf(err) != code || !errors.Is(err, issue.ErrDiscarded) {
		t.Fatalf("got %v, %v; want nothing and %s, marked discarded", got, err, code)
	}
	decided, minted := e.decisions(t)
	if minted != 2 || len(decided) != 1 || decided[0].Decision != audit.Discarded || decided[0].Code != string(code) || len(decided[0].Credentials) != 2 {
		t.Fatalf("got %d keys recorded minted and decisions %+v, want 2 and one discarded %s naming both", minted, decided, code)
	}
}

// unchanged fails unless g still reads exactly as it did at revision rev.
func (e *env) unchanged(t *testing.T, g *issue.Gate, rev uint64) {
	t.Helper()
	now, err := issue.GateOf(e.fences, subjects.GateEndpointManager, strings.TrimPrefix(g.Key(), "epgate.manager.")).Observe(ctx(t))
	if err != nil {
		t.Fatal(err)
	}
	if now.Revision != rev {
		t.Fatalf("gate %s: got revision %d, want %d: it must not have committed", g.Key(), now.Revision, rev)
	}
}

func TestAPlanThatCommitsReturnsValidCredentialsRecordedBeforeTheirCommit(t *testing.T) {
	e := newEnv(t)
	plan := e.plan(t)
	var mintedAtFirstCommit int
	first := plan.Steps[0]
	plan.Steps[0].Commit = func(c context.Context) (uint64, error) {
		_, mintedAtFirstCommit = e.decisions(t)
		return first.Commit(c)
	}
	got, err := e.p.Issue(ctx(t), plan)
	if err != nil {
		t.Fatal(err)
	}
	if mintedAtFirstCommit != 2 {
		t.Fatalf("got %d keys recorded minted when the first commit ran, want both", mintedAtFirstCommit)
	}
	if len(got.Credentials) != 2 || got.Earliest() != e.now.Add(time.Hour).Unix() {
		t.Fatalf("got %v, earliest %d; want two credentials expiring in an hour", got.Credentials, got.Earliest())
	}
	for i, c := range got.Credentials {
		claims, err := jwt.DecodeUserClaims(c.JWT)
		if err != nil {
			t.Fatal(err)
		}
		if claims.Subject != plan.Grants[i].Key || claims.Name != plan.Grants[i].Principal || claims.Expires != c.Exp {
			t.Fatalf("credential %d: got sub %s name %s exp %d, want %+v", i, claims.Subject, claims.Name, claims.Expires, plan.Grants[i])
		}
	}
	if decided, _ := e.decisions(t); len(decided) != 0 {
		t.Fatalf("got decisions %+v for a mint that committed, want none (its record is `minted`)", decided)
	}
	// Each step's revision is where its commit landed: the fence's revision now, past the one
	// observed before signing.
	for i, g := range []*issue.Gate{e.first, e.second} {
		now, err := e.fences.Get(ctx(t), g.Key())
		if err != nil {
			t.Fatal(err)
		}
		if len(got.Revisions) != 2 || got.Revisions[i] != now.Revision || now.Revision <= g.Revision {
			t.Fatalf("step %d: got revisions %v, want the commit's revision %d (observed at %d)", i, got.Revisions, now.Revision, g.Revision)
		}
	}
}

func TestASecondFenceThatMovesAfterSigningDiscardsTheMintAndTheFirstCommitIsHarmless(t *testing.T) {
	e := newEnv(t)
	plan := e.plan(t)
	plan.Hook = func(c context.Context, _ []issue.Credential) error {
		// A fence writer lands on the second fence between signing and committing.
		moved := e.second.Row
		moved.State, moved.Op = issue.GateFrozen, &issue.GateOp{OpID: "end", Kind: issue.OpRetirement}
		_, err := e.second.Write(c, moved)
		return err
	}
	got, err := e.p.Issue(ctx(t), plan)
	e.wantDiscarded(t, got, err, fault.Conflict)
	// The first fence committed: a rewrite of the row as it was, which changes nothing a
	// reader decides on, and a later mint observed on it still commits.
	now, err := issue.GateOf(e.fences, subjects.GateEndpointManager, e.iid).Observe(ctx(t))
	if err != nil {
		t.Fatal(err)
	}
	if now.Revision == e.first.Revision || string(now.Raw) != string(e.first.Raw) {
		t.Fatalf("first fence: got revision %d bytes %s, want its commit as read", now.Revision, now.Raw)
	}
	if _, err := e.first.Commit(ctx(t)); err != nil {
		t.Fatalf("a later commit on the first fence: got %v, want it to land", err)
	}
}

func TestACeilingClampsEveryExpiryAndRefusesOnceItHasPassed(t *testing.T) {
	e := newEnv(t)
	plan := e.plan(t)
	plan.Grants[0].TTL = 24 * time.Hour
	plan.Grants[1].TTL = 5 * time.Minute
	plan.Ceiling = issue.Ceiling{At: e.now.Add(10 * time.Minute), What: "the assignment"}
	got, err := e.p.Issue(ctx(t), plan)
	if err != nil {
		t.Fatal(err)
	}
	if want := e.now.Add(10 * time.Minute).Unix(); got.Credentials[0].Exp != want {
		t.Errorf("a 24h credential under a 10m ceiling: got exp %d, want %d", got.Credentials[0].Exp, want)
	}
	if want := e.now.Add(5 * time.Minute).Unix(); got.Credentials[1].Exp != want {
		t.Errorf("a 5m credential under a 10m ceiling: got exp %d, want its own %d", got.Credentials[1].Exp, want)
	}

	// Past, now, and later but within the second a JWT's expiry is counted in.
	for _, offset := range []time.Duration{-time.Second, 0, time.Millisecond} {
		t.Run(fmt.Sprintf("ceiling %s from now", offset), func(t *testing.T) {
			e := newEnv(t)
			e.now = time.Unix(e.now.Unix(), 0) // at the start of a second
			plan := e.plan(t)
			plan.Ceiling = issue.Ceiling{At: e.now.Add(offset), What: "the platform supervisor assignment of owner " + owner}
			got, err := e.p.Issue(ctx(t), plan)
			if got != nil || fault.CodeOf(err) != fault.PermissionDenied || !strings.Contains(err.Error(), "the platform supervisor assignment") {
				t.Fatalf("got %v, %v; want permission-denied naming what ended", got, err)
			}
			if errors.Is(err, issue.ErrDiscarded) {
				t.Fatal("a refusal before signing is marked discarded; the guard would not record it")
			}
			if decided, minted := e.decisions(t); len(decided) != 0 || minted != 0 {
				t.Fatalf("a refusal before signing recorded %d minted and %v", minted, decided)
			}
			e.unchanged(t, e.first, e.first.Revision)
		})
	}
}

func TestAHookThatFailsReturnsNothingAndCommitsNoFence(t *testing.T) {
	for name, fail := range map[string]error{
		"a refusal":     fault.New(fault.FailedPrecondition, "the generation could not be staged"),
		"a store error": errors.New("nats: timeout"),
	} {
		t.Run(name, func(t *testing.T) {
			e := newEnv(t)
			plan := e.plan(t)
			var staged []issue.Credential
			plan.Hook = func(_ context.Context, creds []issue.Credential) error {
				staged = creds
				return fail
			}
			got, err := e.p.Issue(ctx(t), plan)
			want := fault.Unavailable
			if f, ok := fail.(*fault.Error); ok {
				want = f.Code
			}
			e.wantDiscarded(t, got, err, want)
			if len(staged) != 2 || staged[0].JWT == "" {
				t.Fatalf("the hook saw %v, want the two signed credentials", staged)
			}
			e.unchanged(t, e.first, e.first.Revision)
			e.unchanged(t, e.second, e.second.Revision)
		})
	}
}

func TestAMintedWriteOfUnknownOutcomeIsRetriedWithoutADuplicateRecord(t *testing.T) {
	for _, lands := range []bool{true, false} {
		t.Run(fmt.Sprintf("the first write landed %v", lands), func(t *testing.T) {
			e := newEnv(t)
			e.records.Fault = testkit.FailOnce(lands)
			got, err := e.p.Issue(ctx(t), e.plan(t))
			if err != nil || len(got.Credentials) != 2 {
				t.Fatalf("got %v, %v; want the mint to commit", got, err)
			}
			keys := []string{got.Credentials[0].Key, got.Credentials[1].Key}
			if msgs := e.records.Msgs(); len(msgs) != 1 || msgs[0].Subject != subjects.MintedSubject("default", e.iid, keys) {
				t.Fatalf("got %d records (%v), want exactly one, on the subject of the mint's two keys", len(msgs), msgs)
			}
		})
	}
}

func TestAMintedRecordThatCannotBeWrittenCommitsNothing(t *testing.T) {
	e := newEnv(t)
	e.records.Fault = func(subject string) (error, bool) {
		if strings.Contains(subject, ".minted.") {
			return fmt.Errorf("append %s: maximum bytes exceeded: %w", subject, store.ErrFull), false
		}
		return nil, true
	}
	got, err := e.p.Issue(ctx(t), e.plan(t))
	if got != nil || fault.CodeOf(err) != fault.ResourceExhausted {
		t.Fatalf("got %v, %v; want resource-exhausted and nothing", got, err)
	}
	e.unchanged(t, e.first, e.first.Revision)
	if decided, _ := e.decisions(t); len(decided) != 1 || decided[0].Decision != audit.Discarded {
		t.Fatalf("got %+v, want one discarded record", decided)
	}
}

func TestADeadlineThatExpiresMidPipelineReturnsNothing(t *testing.T) {
	e := newEnv(t)
	plan := e.plan(t)
	plan.Hook = func(c context.Context, _ []issue.Credential) error {
		<-c.Done() // the request's time runs out while the mint is staged
		return nil
	}
	// Two seconds, so the tenth kept back (200 ms) outlasts a loaded machine's scheduling
	// delays: with 300 ms, 30 ms were kept back, and a goroutine descheduled longer than
	// that under load found the deadline gone before the discard was written.
	c, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	got, err := e.p.Issue(c, plan)
	if got != nil || fault.CodeOf(err) != fault.Unavailable {
		t.Fatalf("got %v, %v; want unavailable and nothing", got, err)
	}
	e.unchanged(t, e.first, e.first.Revision)
	e.unchanged(t, e.second, e.second.Revision)
	// The discard is written in the time the pipeline kept back for it.
	if decided, _ := e.decisions(t); len(decided) != 1 || decided[0].Decision != audit.Discarded {
		t.Fatalf("got %+v, want the discard recorded within the deadline", decided)
	}
}

func TestAFencedPlaneDiscardsBeforeCommitting(t *testing.T) {
	e := newEnv(t)
	e.p.Fenced = func() bool { return true }
	got, err := e.p.Issue(ctx(t), e.plan(t))
	e.wantDiscarded(t, got, err, fault.Unavailable)
	e.unchanged(t, e.first, e.first.Revision)
}

func TestAMintCommittedAsThePlaneWasFencedIsWithheldAndDiscarded(t *testing.T) {
	e := newEnv(t)
	var fenced atomic.Bool
	e.p.Fenced = fenced.Load
	plan := e.plan(t)
	last := plan.Steps[1]
	plan.Steps[1].Commit = func(c context.Context) (uint64, error) {
		rev, err := last.Commit(c)
		fenced.Store(true) // the fence lands as the mint commits
		return rev, err
	}
	got, err := e.p.Issue(ctx(t), plan)
	e.wantDiscarded(t, got, err, fault.Unavailable)
}

func TestAPlanWithNoFenceToCommitOnSignsNothing(t *testing.T) {
	e := newEnv(t)
	plan := e.plan(t)
	plan.Steps = nil
	if got, err := e.p.Issue(ctx(t), plan); got != nil || fault.CodeOf(err) != fault.Internal {
		t.Fatalf("got %v, %v; want internal and nothing", got, err)
	}
	if decided, minted := e.decisions(t); len(decided) != 0 || minted != 0 {
		t.Fatalf("got %d minted and %v, want nothing recorded", minted, decided)
	}
}

func TestAFenceWithADeleteMarkerDiscardsTheMint(t *testing.T) {
	e := newEnv(t)
	e.fences.Delete(e.second.Key())
	got, err := e.p.Issue(ctx(t), e.plan(t))
	e.wantDiscarded(t, got, err, fault.FailedPrecondition)
}

// TestAPlanThatNamesNoInstanceIsRefusedBeforeAnythingIsSigned: a plan must name the instance
// its keys are claimed by and its records filed under; one that does not is refused internal
// with nothing signed, recorded or committed. (A plan's keys are its grants' and binds': a key
// is never signed without being claimed.)
func TestAPlanThatNamesNoInstanceIsRefusedBeforeAnythingIsSigned(t *testing.T) {
	e := newEnv(t)
	plan := e.plan(t)
	plan.Instance = issue.Instance{}
	before := e.fences.Revision()
	got, err := e.p.Issue(ctx(t), plan)
	if got != nil || fault.CodeOf(err) != fault.Internal || !strings.Contains(err.Error(), "instance") {
		t.Fatalf("got %v, %v; want nothing and internal naming the instance", got, err)
	}
	if decided, minted := e.decisions(t); len(decided) != 0 || minted != 0 || e.fences.Revision() != before {
		t.Fatalf("got %d decisions, %d keys recorded minted, fences at %d (from %d); want nothing written", len(decided), minted, e.fences.Revision(), before)
	}
}

// TestAKeyAnotherInstanceClaimedIsRefusedBeforeSigningAndANewOneIsClaimedInTheCommit: a plan
// naming a key another instance claimed is refused already-exists, naming the field that named
// it, with nothing signed or recorded; a plan of new keys claims each for its instance when it
// commits, and files its minted records under it.
func TestAKeyAnotherInstanceClaimedIsRefusedBeforeSigningAndANewOneIsClaimedInTheCommit(t *testing.T) {
	e := newEnv(t)
	other := e.plan(t)
	other.Instance = issue.MustInstance(owner, subjects.NewUID())
	if err := e.p.Claims.Take(ctx(t), other.Instance, []string{other.Grants[0].Key}); err != nil {
		t.Fatal(err)
	}
	plan := e.plan(t)
	plan.Grants[1].Key, plan.Grants[1].Field = other.Grants[0].Key, "attempt.driverId"
	got, err := e.p.Issue(ctx(t), plan)
	if got != nil || fault.CodeOf(err) != fault.AlreadyExists || !strings.Contains(err.Error(), "attempt.driverId") {
		t.Fatalf("got %v, %v; want nothing and already-exists naming attempt.driverId", got, err)
	}
	if _, minted := e.decisions(t); minted != 0 {
		t.Fatalf("got %d keys recorded minted for a refused plan, want none", minted)
	}
	plan = e.plan(t)
	if _, err := e.p.Issue(ctx(t), plan); err != nil {
		t.Fatal(err)
	}
	for _, g := range plan.Grants {
		if iid, err := e.p.Claims.Holder(ctx(t), g.Key); err != nil || iid != e.iid {
			t.Errorf("the claim on %s: %q, %v; want instance %s", g.Key, iid, err, e.iid)
		}
	}
	for _, m := range e.records.Msgs() {
		if strings.Contains(m.Subject, ".minted.") && !strings.Contains(m.Subject, ".minted."+e.iid+".") {
			t.Errorf("a minted record on %s, not under the plan's instance %s", m.Subject, e.iid)
		}
	}
}
