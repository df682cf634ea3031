package races

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cotal-ai/authplane/client"
	"github.com/cotal-ai/authplane/integration/internal/harness"
	"github.com/cotal-ai/authplane/service"
	"github.com/cotal-ai/authplane/subjects"
)

// replicaRace is two plane replicas serving one broker (one queue group, the same stores), a
// manager of ownerA registered through them by ownerA.cli (who holds supervise), the
// manager's own supervisor on its own connection, and the checker every round reports to.
// Which replica serves a request is the broker's choice.
type replicaRace struct {
	t      *testing.T
	planes []*harness.TestPlane
	m      *harness.ManagerKeys
	cli    *client.Client
	sup    *client.Client
	inv    *invariants
	cur    client.Renewal
	// pairs counts mints released together from the commit rendezvous; across counts pairs of
	// two replicas.
	pairs, across atomic.Int64
}

// newReplicaRace starts the broker and two replicas with mutate applied to each (nil: none).
func newReplicaRace(t *testing.T, mutate func(i int, c *service.Config)) *replicaRace {
	t.Helper()
	s := harness.StartStandalone(t, harness.TestSpace)
	r := &replicaRace{t: t, m: harness.NewManagerKeys(t)}
	for i := range 2 {
		r.planes = append(r.planes, harness.StartPlane(t, func(c *service.Config) {
			harness.AgainstStandalone(s)(c)
			harness.Unbudgeted(c)
			c.Workers = 4
			if mutate != nil {
				mutate(i, c)
			}
		}))
	}
	p := r.planes[0]
	r.inv = newInvariants(p)
	harness.Grant(t, p, harness.OwnerA, "cli", "supervise")
	var err error
	if r.cli, err = harness.PrincipalClient(harness.CallerConn(t, p, harness.OwnerA, "cli"), harness.OwnerA, "cli"); err != nil {
		t.Fatal(err)
	}
	prep, act := harness.Registered(t, r.cli.Conn(), harness.OwnerA, "cli", r.m)
	r.inv.material(t, &prep)
	r.inv.material(t, &act)
	r.cur = act.Renewal()
	nc := harness.DutyConn(t, p, r.m, harness.OwnerA, subjects.DutySupervisor, prep.Credentials["supervisor"].JWT)
	if r.sup, err = client.New(nc, harness.TestSpace, harness.OwnerA, subjects.DutyActor(subjects.DutySupervisor, r.m.Iid, "")); err != nil {
		t.Fatal(err)
	}
	return r
}

// renew asks c for operation op (renew or renewStandingBundle) of the manager with cur,
// counts the outcome in counts, and reports credentials to the checker.
func (r *replicaRace) renew(c *client.Client, op string, cur client.Renewal, counts *tally) {
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	var m *client.Material
	var err error
	if op == client.OpRenew {
		m, err = c.Renew(ctx, r.m.Manager, cur)
	} else {
		m, err = c.RenewStandingBundle(ctx, r.m.Manager, cur)
	}
	if counts.of(err) {
		r.inv.material(r.t, m)
	}
}

// served logs how many manager-authority requests each replica served, and fails the test if
// one served none: the race was not between replicas.
func (r *replicaRace) served() {
	r.t.Helper()
	var counts []float64
	for _, p := range r.planes {
		var n float64
		if f, ok := harness.Scrape(r.t, p.HTTPURL())["authplane_requests_total"]; ok {
			for _, m := range f.Metric {
				for _, l := range m.Label {
					if l.GetName() == "endpoint" && l.GetValue() == subjects.EndpointManagerAuthority {
						n += m.Counter.GetValue()
					}
				}
			}
		}
		counts = append(counts, n)
	}
	r.t.Logf("manager-authority requests served by each replica: %v", counts)
	for i, n := range counts {
		if n == 0 {
			r.t.Errorf("replica %d served no request", i+1)
		}
	}
}

// TestReRegistrationRacingRenewalsFromTwoReplicasOrdersEveryCredential: 200 rounds in which
// the manager's preparer re-registers it (prepare: a new epoch on its gate) while the preparer
// and the manager's own supervisor renew it under the epoch it replaces, through two replicas.
// After each round the checker reads the stores (every renewal that came back committed at a
// gate revision before the re-registration's; the others were refused conflict, at their
// commit or before signing for a stale epoch), and the new registration is activated.
func TestReRegistrationRacingRenewalsFromTwoReplicasOrdersEveryCredential(t *testing.T) {
	harness.Long(t, "a race's volume")
	t.Parallel()
	const rounds = 200
	r := newReplicaRace(t, nil)
	var renewals, prepares tally
	for round := range rounds {
		cur := r.cur
		var prep *client.Material
		var wg sync.WaitGroup
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
			defer cancel()
			var err error
			prep, err = r.cli.Prepare(ctx, r.m.Manager)
			prepares.of(err)
		})
		wg.Go(func() { r.renew(r.cli, client.OpRenew, cur, &renewals) })
		wg.Go(func() { r.renew(r.sup, client.OpRenew, cur, &renewals) })
		wg.Go(func() { r.renew(r.sup, client.OpRenewStandingBundle, cur, &renewals) })
		wg.Wait()
		if prep == nil {
			t.Fatalf("round %d: the re-registration was refused (%s)", round+1, &prepares)
		}
		r.inv.material(t, prep)
		r.inv.check(t)
		if t.Failed() {
			t.Fatalf("round %d of %d failed", round+1, rounds)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
		act, err := r.cli.Activate(ctx, r.m.Manager, prep.RegistrationProof)
		cancel()
		if err != nil {
			t.Fatalf("round %d: activate epoch %d: %v", round+1, prep.ProcessEpoch, err)
		}
		r.inv.material(t, act) // checked with the next round's
		r.cur = act.Renewal()
	}
	r.inv.check(t)
	harness.Report(t, "%d rounds: renewals: %s; re-registrations: %s", rounds, &renewals, &prepares)
	r.served()
	if renewals.count("") == 0 || renewals.count(commitLost) == 0 {
		t.Errorf("renewals: %s; want some issued and some lost at their commit: the test did not race", &renewals)
	}
	for code, n := range renewals.n {
		if code != "issued" && code != "conflict" && code != commitLost {
			t.Errorf("%d renewals refused %s, want only conflict", n, code)
		}
	}
}

// rendezvous is a commit hook that holds each mint reaching the commit fence until a second
// one reaches it (from either replica, whose index each one's hook carries), then releases both
// at once: they send their CAS on one gate together, so one loses it and must retry. A mint left
// without a partner goes on after a short wait.
type rendezvous struct {
	mu      sync.Mutex
	waiting chan int // the plane of the mint waiting, and where its partner says its own
	race    *replicaRace
}

// hook is plane i's BeforeCommit.
func (rv *rendezvous) hook(i int) func() {
	return func() {
		rv.mu.Lock()
		if w := rv.waiting; w != nil {
			rv.waiting = nil
			rv.mu.Unlock()
			w <- i
			return
		}
		w := make(chan int, 1)
		rv.waiting = w
		rv.mu.Unlock()
		select {
		case j := <-w:
			rv.race.pairs.Add(1)
			if j != i {
				rv.race.across.Add(1)
			}
		case <-time.After(20 * time.Millisecond):
			rv.mu.Lock()
			if rv.waiting == w {
				rv.waiting = nil
			}
			rv.mu.Unlock()
			select { // a partner that came as the wait ended is released now
			case <-w:
			default:
			}
		}
	}
}

// TestGateCASContendedByTwoReplicasIssuesEveryRenewal: 200 rounds of six renewals of one
// instance at once (three renew by its preparer, three renewStandingBundle by its own
// supervisor), through two replicas whose commits are released in pairs onto the one gate.
// A CAS lost to another mint's commit (the gate's bytes unchanged) is retried, never refused:
// every renewal is issued, and the checker finds each ordered and recorded.
func TestGateCASContendedByTwoReplicasIssuesEveryRenewal(t *testing.T) {
	harness.Long(t, "a race's volume")
	t.Parallel()
	const rounds, together = 200, 6
	rv := &rendezvous{}
	r := newReplicaRace(t, func(i int, c *service.Config) { c.Hooks = &service.Hooks{BeforeCommit: rv.hook(i)} })
	rv.race = r
	var renewals tally
	for round := range rounds {
		var wg sync.WaitGroup
		for i := range together {
			c, op := r.cli, client.OpRenew
			if i%2 == 1 {
				c, op = r.sup, client.OpRenewStandingBundle
			}
			wg.Go(func() { r.renew(c, op, r.cur, &renewals) })
		}
		wg.Wait()
		r.inv.check(t)
		if t.Failed() {
			t.Fatalf("round %d of %d failed", round+1, rounds)
		}
	}
	harness.Report(t, "%d rounds: renewals: %s; commits released in pairs: %d, %d of them across the replicas", rounds, &renewals, r.pairs.Load(), r.across.Load())
	r.served()
	if n := renewals.count(""); n != rounds*together {
		t.Errorf("renewals: %s; want all %d issued", &renewals, rounds*together)
	}
	if r.across.Load() == 0 {
		t.Errorf("no two replicas' commits were released together: the test did not contend")
	}
}
