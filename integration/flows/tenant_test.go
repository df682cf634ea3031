package flows

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/cotal-ai/authplane/client"
	"github.com/cotal-ai/authplane/integration/internal/harness"
	"github.com/cotal-ai/authplane/internal/capability/supervisor"
	"github.com/cotal-ai/authplane/internal/core/audit"
	"github.com/cotal-ai/authplane/internal/core/issue"
	"github.com/cotal-ai/authplane/internal/testkit"
	"github.com/cotal-ai/authplane/service"
	"github.com/cotal-ai/authplane/subjects"
)

// TestARunKeyClaimedByAnotherInstanceIsRefusedAndMintsNothing: an attempt naming, as its
// driver or mediator, a key another instance claimed (another owner's supervisor key, the same
// owner's other instance's executor key) is refused already-exists before anything is signed:
// no credential, no `minted` record, no claim, no run fence. A fresh key is claimed for the
// attempt's instance in its commit. (An owner once named another owner's supervisor key as its
// driver; ending the first instance then revoked the second owner's key at the broker.)
func TestARunKeyClaimedByAnotherInstanceIsRefusedAndMintsNothing(t *testing.T) {
	t.Parallel()
	p := harness.StartPlane(t, nil)
	env := harness.NewRunEnv(t, p)
	harness.Grant(t, p, harness.OwnerB, "cli", "supervise")
	otherOwner := harness.NewManagerKeys(t)
	harness.Registered(t, harness.CallerConn(t, p, harness.OwnerB, "cli"), harness.OwnerB, "cli", otherOwner)
	sameOwner := harness.NewManagerKeys(t)
	harness.Registered(t, env.Cli.Conn(), harness.OwnerA, "cli", sameOwner)

	for _, tt := range []struct {
		name, field string
		set         func(a *client.Attempt)
	}{
		{"the driver is another owner's supervisor", "attempt.driverId", func(a *client.Attempt) { a.DriverID = otherOwner.Pub(t, subjects.DutySupervisor) }},
		{"the mediator is the same owner's other instance's executor", "attempt.mediatorId", func(a *client.Attempt) { a.MediatorID = sameOwner.Pub(t, subjects.DutyExecutor) }},
	} {
		t.Run(tt.name, func(t *testing.T) {
			tk := env.NewTakeover(env.Admitted(), 1, 1)
			tt.set(&tk.Attempt)
			before := harness.StoreSeqs(t, p)
			rm, err := env.Attempt(tk)
			harness.WantRefusal(t, err, "already-exists", tt.field)
			if rm != nil {
				t.Errorf("got %d credentials, want none", len(rm.Credentials))
			}
			harness.WantUnwritten(t, p, tt.name, before)
			if _, err := harness.FenceEntry(t, p, subjects.RunFenceKey(tk.Attempt.RunID)); err == nil {
				t.Errorf("the refused attempt wrote the run fence")
			}
		})
	}

	t.Run("a fresh key is claimed for the attempt's instance", func(t *testing.T) {
		tk := env.NewTakeover(env.Admitted(), 1, 1)
		env.MustAttempt(tk)
		for _, k := range []string{tk.Attempt.DriverID, tk.Attempt.MediatorID} {
			var c struct {
				InstanceID string `json:"instanceId"`
			}
			harness.ReadRecord(t, p, subjects.AuthBucket(harness.TestSpace), "$KV."+subjects.AuthBucket(harness.TestSpace)+"."+subjects.NKeyClaimKey(k), &c)
			if c.InstanceID != env.M.Iid {
				t.Errorf("the claim on %s names instance %q, want %s", k, c.InstanceID, env.M.Iid)
			}
		}
	})
}

// TestAnEndRevokesOnlyTheKeysItsInstanceClaimed: a `minted` record filed under the ended
// instance for a key another instance claimed (what a mint discarded at its claim leaves) does
// not make the end revoke that key: it is not on the end's list, the other instance's signing
// key stays listed at the broker, and the other owner's connection with it stays up; the
// ended instance's own signing key is off the broker.
func TestAnEndRevokesOnlyTheKeysItsInstanceClaimed(t *testing.T) {
	t.Parallel()
	p, pa, s := harness.SupervisedPlane(t, nil, time.Now().Add(time.Hour))
	harness.Grant(t, p, harness.OwnerB, "cli", "supervise")
	other := harness.NewManagerKeys(t)
	prep, _ := harness.Registered(t, harness.CallerConn(t, p, harness.OwnerB, "cli"), harness.OwnerB, "cli", other)
	foreign := other.Pub(t, subjects.DutySupervisor)
	forged, err := json.Marshal(audit.Minted{V: 1, Request: audit.Request{Endpoint: subjects.EndpointManagerAuthority, Caller: harness.OwnerA + ".cli", InstanceID: s.M.Iid},
		Credentials: []audit.Credential{{Duty: string(subjects.DutySupervisor), NKey: foreign, Exp: time.Now().Add(time.Hour).Unix()}}, At: time.Now().UnixMilli()})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.JS(t).Publish(harness.CallCtx(t), subjects.MintedSubject(harness.TestSpace, s.M.Iid, []string{foreign}), forged); err != nil {
		t.Fatal(err)
	}
	otherConn := harness.DutyConn(t, p, other, harness.OwnerB, subjects.DutySupervisor, prep.Credentials["supervisor"].JWT)

	report, err := pa.End(s)
	if err != nil {
		t.Fatalf("end: %v", err)
	}
	harness.WantEndReport(t, s, report, harness.IdentityKeys(t, s.M))
	if strings.Contains(fmt.Sprint(report.Revoked.NKeys), foreign) || !harness.Listed(t, p, other.Iid) {
		t.Errorf("the other owner's key %s was revoked by the end (its instance's key listed: %t)", foreign, harness.Listed(t, p, other.Iid))
	}
	if harness.Listed(t, p, s.M.Iid) {
		t.Error("the ended instance's signing key is still listed")
	}
	if err := otherConn.FlushTimeout(5 * time.Second); err != nil || otherConn.IsClosed() {
		t.Errorf("the other owner's connection: %v (closed %t), want it up", err, otherConn.IsClosed())
	}
}

// TestACrashedEndBlocksANewAssignmentUntilItsRetryCompletes: an end stopped after each of its
// steps (a test hook, as a crash would stop it) leaves the owner's assignment ending; a new
// assignment for the owner is refused failed-precondition naming the pending end, the retried
// end completes, revoking the old lifecycle's keys at the broker, and then the new assignment
// is accepted. (A new assignment once buried a half-done end, whose retry was then refused and
// whose keys were never revoked.)
func TestACrashedEndBlocksANewAssignmentUntilItsRetryCompletes(t *testing.T) {
	t.Parallel()
	var crashAfter atomicStep
	p := harness.StartPlane(t, func(c *service.Config) {
		c.Hooks = &service.Hooks{AfterEndStep: crashAfter.hook}
	})
	pa := harness.NewPlatformAdmin(t, p, "admin")
	for step := 1; step <= supervisor.EndSteps; step++ {
		t.Run(fmt.Sprintf("after step %d", step), func(t *testing.T) {
			s := pa.Assign(time.Now().Add(time.Hour))
			pa.Register(s)
			crashAfter.arm(s.M.Iid, step)
			if _, err := pa.End(s); err == nil || !strings.Contains(err.Error(), "stopped after step") {
				t.Fatalf("the crashed end: got %v, want it stopped", err)
			}
			next := &harness.Supervised{Owner: s.Owner, M: harness.NewManagerKeys(t)}
			_, err := pa.C.Assign(harness.CallCtx(t), next.AssignBody(time.Now().Add(time.Hour)))
			if step < supervisor.EndSteps {
				harness.WantRefusalOf(t, "a new assignment while the end is pending", err, "failed-precondition", "still ending")
			} else if err != nil {
				t.Fatalf("a new assignment after the end's last step: %v", err)
			} else {
				return // the end was complete; its crash came after it
			}
			report, err := pa.End(s)
			if err != nil {
				t.Fatalf("the retried end: %v", err)
			}
			if !report.Done || report.Assignment.State != client.StateEnded {
				t.Fatalf("the retried end: got %+v, want it done and the assignment ended", report)
			}
			if harness.Listed(t, p, s.M.Iid) {
				t.Error("the old lifecycle's signing key is still listed at the broker")
			}
			harness.WantRefusedToConnect(t, p.NATSURL(), s, subjects.DutySupervisor, s.Prep.Credentials["supervisor"].JWT)
			if _, err := pa.C.Assign(harness.CallCtx(t), next.AssignBody(time.Now().Add(time.Hour))); err != nil {
				t.Fatalf("a new assignment after the retried end: %v", err)
			}
		})
	}
}

// siblingHold is a BeforeCommit that makes two mints meet at the commit: it holds the first
// mint after arm until another mint reaches the commit too, so that both signed before either
// committed. A sibling sent to the worker the first one holds waits behind it: after
// siblingHoldFor, well inside the request deadline, the first one goes on alone (and that
// sibling is refused before signing).
type siblingHold struct {
	mu       sync.Mutex
	armed    bool
	held     chan struct{} // closed once the armed mint is held
	released chan struct{} // closed by the next mint to reach the commit
}

const siblingHoldFor = 2 * time.Second

// arm makes the next mint to reach the commit wait for a sibling; the channel it returns is
// closed once that mint is held.
func (h *siblingHold) arm() <-chan struct{} {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.armed, h.held, h.released = true, make(chan struct{}), make(chan struct{})
	return h.held
}

// disarm holds no mint after all (the one meant to be held was answered before its commit).
func (h *siblingHold) disarm() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.armed = false
}

func (h *siblingHold) hook() {
	h.mu.Lock()
	if h.held == nil {
		h.mu.Unlock()
		return
	}
	if h.armed {
		h.armed = false
		held, released := h.held, h.released
		h.mu.Unlock()
		close(held)
		select {
		case <-released:
		case <-time.After(siblingHoldFor):
		}
		return
	}
	select {
	case <-h.released:
	default:
		close(h.released)
	}
	h.mu.Unlock()
}

// TestRacingPreparesLeaveTheQuotaExact: nine first registrations of an owner with a quota of
// four race, in three groups that each share an executor key, so that at most three win and
// the others are refused already-exists (before signing, or at their commit). In each group
// the first is held before its commit until a sibling has signed too, so the two meet at the
// commit and one is discarded there, however loaded the machine. Afterwards the owner's quota
// counts exactly its live gates: it registers new instances up to four, and the next is
// refused resource-exhausted. (A prepare discarded at its commit once kept its slot for good,
// and the fourth registration was refused.)
func TestRacingPreparesLeaveTheQuotaExact(t *testing.T) {
	t.Parallel()
	hold := &siblingHold{}
	p := harness.StartPlane(t, func(c *service.Config) {
		c.MaxInstancesPerOwner = 4
		c.Rate = 0
		c.Workers = 32 // a sibling meets the held worker 1 time in 32
		c.Hooks = &service.Hooks{BeforeCommit: hold.hook}
	})
	harness.Grant(t, p, harness.OwnerA, "cli", "supervise")
	cli := harness.CallerConn(t, p, harness.OwnerA, "cli")
	var racers []*harness.ManagerKeys
	var outcomes []harness.Outcome
	for range 3 {
		first := harness.NewManagerKeys(t)
		group := []*harness.ManagerKeys{first}
		for range 2 {
			m := harness.NewManagerKeys(t)
			m.Keys[subjects.DutyExecutor] = first.Keys[subjects.DutyExecutor]
			m.Identities.Executor.ID = first.Identities.Executor.ID
			group = append(group, m)
		}
		got := make([]harness.Outcome, len(group))
		ask := func(i int) {
			got[i] = harness.AskAsync(cli, harness.OwnerA, "cli", subjects.EndpointManagerAuthority, group[i].Body(t, "prepare", "cli"))
		}
		held := hold.arm()
		answered := make(chan struct{})
		go func() { defer close(answered); ask(0) }()
		select { // the siblings start while the first waits at its commit
		case <-held:
		case <-answered: // answered before its commit: the outcomes below say why
			hold.disarm()
		}
		var wg sync.WaitGroup
		for i := 1; i < len(group); i++ {
			wg.Go(func() { ask(i) })
		}
		wg.Wait()
		<-answered
		racers, outcomes = append(racers, group...), append(outcomes, got...)
	}
	registered := 0
	for i, o := range outcomes {
		switch o.Code {
		case "":
			registered++
		case "already-exists", "resource-exhausted":
		default:
			t.Errorf("racer %d: got %s %q, want issued, already-exists or resource-exhausted", i, o.Code, o.Message)
		}
	}
	if n := countMsgs(t, p, subjects.AuditStream(harness.TestSpace), subjects.AuditSubject(harness.TestSpace, "discarded", harness.OwnerA, "cli")); n == 0 {
		t.Errorf("no racer was discarded at its commit: the test did not race")
	}
	live := liveGates(t, p, racers)
	if live != registered || registered > 3 {
		t.Fatalf("%d racers registered and %d gates are live; want them equal and at most one a group", registered, live)
	}
	for n := registered; n < 4; n++ {
		m := harness.NewManagerKeys(t)
		if o := harness.AskAsync(cli, harness.OwnerA, "cli", subjects.EndpointManagerAuthority, m.Body(t, "prepare", "cli")); o.Code != "" {
			t.Fatalf("registration %d of 4 after the race: got %s %q, want it issued", n+1, o.Code, o.Message)
		}
	}
	o := harness.AskAsync(cli, harness.OwnerA, "cli", subjects.EndpointManagerAuthority, harness.NewManagerKeys(t).Body(t, "prepare", "cli"))
	if o.Code != "resource-exhausted" {
		t.Fatalf("a fifth registration: got %s %q, want resource-exhausted", o.Code, o.Message)
	}
}

// countMsgs counts the messages of stream on subject.
func countMsgs(t testing.TB, p *harness.TestPlane, stream, subject string) uint64 {
	t.Helper()
	st, err := p.JS(t).Stream(harness.CallCtx(t), stream)
	if err != nil {
		t.Fatal(err)
	}
	info, err := st.Info(harness.CallCtx(t), jetstream.WithSubjectFilter(subject))
	if err != nil {
		t.Fatal(err)
	}
	return info.State.Subjects[subject]
}

// liveGates counts the open gates of ms's instances.
func liveGates(t testing.TB, p *harness.TestPlane, ms []*harness.ManagerKeys) int {
	t.Helper()
	n := 0
	for _, m := range ms {
		e, err := harness.FenceEntry(t, p, subjects.GateKey(subjects.GateEndpointManager, m.Iid))
		if err != nil {
			continue
		}
		if row, err := issue.ParseGate(e.Data); err == nil && row.State != issue.GateRetired {
			n++
		}
	}
	return n
}

// atomicStep is a test hook that stops the end of one instance after one step, once.
type atomicStep struct {
	mu   sync.Mutex
	iid  string
	step int
}

func (a *atomicStep) arm(iid string, step int) {
	a.mu.Lock()
	a.iid, a.step = iid, step
	a.mu.Unlock()
}

func (a *atomicStep) hook(iid string, step int) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if iid == a.iid && step == a.step {
		a.iid = ""
		return errors.New("crashed (test hook)")
	}
	return nil
}

// budgetRefusals is what the plane's metrics count of refusals past the tenant budget b.
func budgetRefusals(t testing.TB, p *harness.TestPlane, b string) float64 {
	t.Helper()
	fam := harness.Scrape(t, p.HTTPURL())["authplane_tenant_budget_refused_total"]
	if fam == nil {
		t.Fatalf("no authplane_tenant_budget_refused_total series")
	}
	for _, m := range fam.GetMetric() {
		for _, l := range m.GetLabel() {
			if l.GetName() == "budget" && l.GetValue() == b {
				return m.GetCounter().GetValue()
			}
		}
	}
	t.Fatalf("no series of budget %s", b)
	return 0
}

// TestReRegisteringOneInstanceIsBoundedPerInstanceAndPerOwner: re-registering one instance
// with fresh keys (what once filled the shared minted stream from one principal) is refused
// resource-exhausted past --reregistrations-per-instance, writing nothing and counted; another
// instance of the owner still re-registers until the owner's own budget is spent; another
// owner's is untouched, and renewals of a refused instance go on.
func TestReRegisteringOneInstanceIsBoundedPerInstanceAndPerOwner(t *testing.T) {
	t.Parallel()
	// A tenth of each hourly budget at once: two re-registrations of an instance, four of the owner.
	p := harness.StartPlane(t, func(c *service.Config) { c.ReregistrationsPerInstance, c.ReregistrationsPerOwner = 20, 40 })
	harness.Grant(t, p, harness.OwnerA, "cli", "supervise")
	harness.Grant(t, p, harness.OwnerB, "cli", "supervise")
	cli := harness.CallerConn(t, p, harness.OwnerA, "cli")
	one, other := harness.NewManagerKeys(t), harness.NewManagerKeys(t)
	harness.Registered(t, cli, harness.OwnerA, "cli", one)
	harness.Registered(t, cli, harness.OwnerA, "cli", other)
	again := func(m *harness.ManagerKeys) harness.Outcome {
		fresh := harness.NewManagerKeys(t) // the same instance and lifecycle, fresh keys
		fresh.Iid, fresh.Uid = m.Iid, m.Uid
		fresh.Manager.InstanceID, fresh.Manager.LifecycleUID = m.Iid, m.Uid
		return harness.AskAsync(cli, harness.OwnerA, "cli", subjects.EndpointManagerAuthority, fresh.Body(t, "prepare", "cli"))
	}
	for i := range 2 {
		if o := again(one); o.Code != "" {
			t.Fatalf("re-registration %d of the instance: got %s %q, want it issued", i+1, o.Code, o.Message)
		}
	}
	before := harness.StoreSeqs(t, p)
	o := again(one)
	if o.Code != "resource-exhausted" || !strings.Contains(o.Message, "--reregistrations-per-instance") || len(o.Material.Credentials) != 0 {
		t.Fatalf("a third re-registration of the instance: got %s %q, want resource-exhausted naming the budget and nothing", o.Code, o.Message)
	}
	harness.WantUnwritten(t, p, "a re-registration past the instance's budget", before)
	if n := budgetRefusals(t, p, "reregistrations_instance"); n != 1 {
		t.Errorf("the metric counts %v refusals of the instance's budget, want 1", n)
	}
	for i := range 2 {
		if o := again(other); o.Code != "" {
			t.Fatalf("re-registration %d of the owner's other instance: got %s %q, want it issued", i+1, o.Code, o.Message)
		}
	}
	if o := again(newRegistered(t, p, cli, harness.OwnerA)); o.Code != "resource-exhausted" || !strings.Contains(o.Message, "--reregistrations-per-owner") {
		t.Fatalf("a re-registration past the owner's budget: got %s %q, want resource-exhausted naming it", o.Code, o.Message)
	}
	cliB := harness.CallerConn(t, p, harness.OwnerB, "cli")
	b := harness.NewManagerKeys(t)
	harness.Registered(t, cliB, harness.OwnerB, "cli", b)
	fresh := harness.NewManagerKeys(t)
	fresh.Iid, fresh.Uid, fresh.Manager.InstanceID, fresh.Manager.LifecycleUID = b.Iid, b.Uid, b.Iid, b.Uid
	if o := harness.AskAsync(cliB, harness.OwnerB, "cli", subjects.EndpointManagerAuthority, fresh.Body(t, "prepare", "cli")); o.Code != "" {
		t.Fatalf("another owner's re-registration: got %s %q, want it issued", o.Code, o.Message)
	}
}

// newRegistered registers a fresh manager of owner through nc and returns its keys.
func newRegistered(t testing.TB, p *harness.TestPlane, nc *nats.Conn, owner string) *harness.ManagerKeys {
	t.Helper()
	m := harness.NewManagerKeys(t)
	harness.Registered(t, nc, owner, "cli", m)
	return m
}

// TestAnOwnersNewKeysAreBoundedAndAnotherOwnersAreNot: an owner that has claimed its budget of
// new keys (--new-keys-per-owner, over the minted records' retention) gets no registration or
// run attempt with fresh keys (resource-exhausted, nothing written, counted), while renewals of
// the keys it holds go on and another owner registers.
func TestAnOwnersNewKeysAreBoundedAndAnotherOwnersAreNot(t *testing.T) {
	t.Parallel()
	p := harness.StartPlane(t, func(c *service.Config) { c.NewKeysPerOwner = 12 })
	harness.Grant(t, p, harness.OwnerB, "cli", "supervise")
	r := harness.NewRegisteredManager(t, p) // ownerA: 6 keys (five identities, the instance's signing key)
	harness.Registered(t, r.Cli, harness.OwnerA, "cli", harness.NewManagerKeys(t))
	before := harness.StoreSeqs(t, p)
	o := harness.AskAsync(r.Cli, harness.OwnerA, "cli", subjects.EndpointManagerAuthority, harness.NewManagerKeys(t).Body(t, "prepare", "cli"))
	if o.Code != "resource-exhausted" || !strings.Contains(o.Message, "--new-keys-per-owner") || len(o.Material.Credentials) != 0 {
		t.Fatalf("a third registration of fresh keys: got %s %q, want resource-exhausted naming the budget and nothing", o.Code, o.Message)
	}
	harness.WantUnwritten(t, p, "a registration past the owner's new keys", before)
	if n := budgetRefusals(t, p, "new_keys_owner"); n != 1 {
		t.Errorf("the metric counts %v refusals of the new-keys budget, want 1", n)
	}
	harness.MustMint(t, r.Cli, harness.OwnerA, "cli", r.Renewal(t, "renewStandingBundle"))
	harness.Registered(t, harness.CallerConn(t, p, harness.OwnerB, "cli"), harness.OwnerB, "cli", harness.NewManagerKeys(t))
}

// TestAConnectionNamedAfterAnotherKeyDoesNotHoldUpItsEnd: another owner's manager connects
// with its own credential but sends, as its user name, the supervisor key of an instance about
// to be ended (the broker's connection listing shows that name as its user, and filters on
// it). The end still sees every connection of its keys closed, and the other owner's
// connection stays up: who a connection is is the JWT the broker accepted.
func TestAConnectionNamedAfterAnotherKeyDoesNotHoldUpItsEnd(t *testing.T) {
	t.Parallel()
	p, pa, s := harness.SupervisedPlane(t, nil, time.Now().Add(time.Hour))
	harness.Grant(t, p, harness.OwnerB, "cli", "supervise")
	other := harness.NewManagerKeys(t)
	prep, _ := harness.Registered(t, harness.CallerConn(t, p, harness.OwnerB, "cli"), harness.OwnerB, "cli", other)
	target := s.M.Pub(t, subjects.DutySupervisor)
	impostor := harness.DutyConn(t, p, other, harness.OwnerB, subjects.DutySupervisor, prep.Credentials["supervisor"].JWT, nats.UserInfo(target, "x"))
	report, err := pa.End(s)
	if err != nil {
		t.Fatalf("end: %v", err)
	}
	if !report.Done || !report.Evicted.Complete {
		t.Fatalf("end report: got %+v, want done with every connection of its keys gone", report)
	}
	if err := impostor.FlushTimeout(5 * time.Second); err != nil {
		t.Errorf("the other owner's connection: %v, want it up", err)
	}
}

// TestAnOwnersCalloutConnectionsAreBoundedABearersLife: every connection the auth callout lets
// in gets a key the broker chose, whose `minted` record stays 48 h in the stream every tenant
// shares. An owner may have as many chosen a bearer's life as it may hold connections
// (--max-connections-per-owner), so each can connect again with every new bearer, and no
// more: an agent that connects and disconnects is refused past that, with nothing written and
// without touching its owner's --new-keys-per-owner, and another owner's agent still connects.
// (Each such connection was once free: one agent churning its connections filled the minted
// stream, and every owner's mints then failed.)
func TestAnOwnersCalloutConnectionsAreBoundedABearersLife(t *testing.T) {
	t.Parallel()
	const perOwner = 12
	ip := testkit.NewIdP(t)
	p := harness.StartFacesPlane(t, ip, func(c *service.Config) {
		c.MaxConnectionsPerPrincipal, c.MaxConnectionsPerOwner, c.NewKeysPerOwner = 4, perOwner, 10
	})
	b := harness.FetchBundle(t, p.PublicURL())
	churner := harness.AgentBearer(t, p, harness.OwnerA, "worker")
	other := harness.AgentBearer(t, p, harness.OwnerB, "worker")
	closedAll := func() error {
		if n := harness.Sample(harness.Scrape(t, p.HTTPURL()), "authplane_data_connections", map[string]string{"who": "tenants"}); n != 0 {
			return fmt.Errorf("the plane counts %v tenants' connections, want them all closed", n)
		}
		return nil
	}
	for i := range perOwner {
		nc, err := harness.BearerConnect(t, b, churner, harness.OwnerA, "worker", nats.MaxReconnects(0))
		if err != nil {
			t.Fatalf("connection %d of %d a bearer's life: %v", i+1, perOwner, err)
		}
		nc.Close()
		testkit.CheckFor(t, 5*time.Second, 10*time.Millisecond, closedAll) // not held to the connection cap
	}
	before := harness.StoreSeqs(t, p)
	if nc, err := harness.BearerConnect(t, b, churner, harness.OwnerA, "worker", nats.MaxReconnects(0)); err == nil {
		nc.Close()
		t.Fatalf("connection %d in a bearer's life, past the owner's %d, was let in", perOwner+1, perOwner)
	}
	if n := budgetRefusals(t, p, "connection_keys_owner"); n != 1 {
		t.Errorf("the metric counts %v refusals of the connection keys' budget, want 1", n)
	}
	harness.WantUnwritten(t, p, "a connection past the owner's keys a bearer's life", before)
	nc, err := harness.BearerConnect(t, b, other, harness.OwnerB, "worker", nats.MaxReconnects(0))
	if err != nil {
		t.Fatalf("another owner's agent: %v", err)
	}
	nc.Close()
	// The owner's new keys (10) were never touched: it still registers an instance (5).
	harness.Grant(t, p, harness.OwnerA, "cli", "supervise")
	harness.Registered(t, harness.CallerConn(t, p, harness.OwnerA, "cli"), harness.OwnerA, "cli", harness.NewManagerKeys(t))
}
