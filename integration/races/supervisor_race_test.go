package races

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/cotal-ai/authplane/client"
	"github.com/cotal-ai/authplane/integration/internal/harness"
	"github.com/cotal-ai/authplane/internal/capability/supervisor"
	"github.com/cotal-ai/authplane/internal/core/issue"
	"github.com/cotal-ai/authplane/service"
	"github.com/cotal-ai/authplane/subjects"
)

// raceWatch is a plane whose hooks watch ends racing mints: each end's freeze is read from
// the store the moment it lands (the end waits for the hook), and told to the round's checker.
type raceWatch struct {
	p  *harness.TestPlane
	pa *harness.PlatformAdmin
	mu sync.Mutex
	// rounds are the checkers of the rounds under way, by instance.
	rounds map[string]*invariants
	// authority counts supervisor-authority renewals, own the manager's own renewals.
	authority, own tally
	// repeats counts the ends repeated after they answered unavailable.
	repeats atomic.Int64
}

func newRaceWatch(t testing.TB) *raceWatch {
	w := &raceWatch{rounds: map[string]*invariants{}}
	w.p = harness.StartPlane(t, func(c *service.Config) {
		c.Rate, c.OwnerInFlight = 0, 0 // the platform admin ends many at once
		c.Workers = 8
		c.Hooks = &service.Hooks{
			AfterEndStep: func(iid string, step int) error {
				if step == supervisor.StepFrozen {
					return w.frozen(t, iid)
				}
				return nil
			},
			// Widen the window between signing and committing, so that mints straddle the
			// freeze: signed before it, committing after it.
			BeforeCommit: func() { time.Sleep(time.Millisecond) },
		}
	})
	w.pa = harness.NewPlatformAdmin(t, w.p, "admin")
	return w
}

// frozen reads the gate of instance iid just after its end froze it (nothing writes it again
// before the end's next step) and tells the round's checker at which revision it froze.
func (w *raceWatch) frozen(t testing.TB, iid string) error {
	w.mu.Lock()
	inv := w.rounds[iid]
	w.mu.Unlock()
	if inv != nil && inv.isFrozen(iid) {
		return nil // a repeated end passing the freeze again: the first is the one mints raced
	}
	m, err := harness.FenceEntry(t, w.p, subjects.GateKey(subjects.GateEndpointManager, iid))
	if err == nil {
		var row issue.GateRow
		if row, err = issue.ParseGate(m.Data); err == nil && row.State != issue.GateFrozen {
			err = fmt.Errorf("the gate is %s after the freeze", row.State)
		}
	}
	if err != nil || inv == nil {
		t.Errorf("the freeze of %s: %v (checker: %t)", iid, err, inv != nil)
		return fmt.Errorf("reading the freeze: %v", err)
	}
	inv.frozenAt(iid, m.Sequence)
	return nil
}

// round runs one assignment: supervised renewals and the manager's own renewals race its end;
// then the round's checker reads the stores.
func (w *raceWatch) round(t testing.TB) {
	pa := w.pa
	end := time.Now().Add(time.Hour).Truncate(time.Second)
	s := pa.Assign(end)
	inv := newInvariants(w.p)
	inv.supervised(s.Owner, s.M.Iid)
	w.mu.Lock()
	w.rounds[s.M.Iid] = inv
	w.mu.Unlock()
	defer func() {
		w.mu.Lock()
		delete(w.rounds, s.M.Iid)
		w.mu.Unlock()
	}()
	pa.Register(s)
	inv.material(t, s.Prep)
	inv.material(t, s.Act)
	quiet := (&harness.AsyncErrors{}).Option() // the end closes them
	sup := harness.DutyConn(t, w.p, s.M, s.Owner, subjects.DutySupervisor, s.Prep.Credentials["supervisor"].JWT, quiet, nats.NoReconnect())

	var wg sync.WaitGroup
	ended := make(chan struct{})
	// Each asks until two of its requests were sent after the freeze had landed (or the end
	// returned without one).
	mint := func(counts *tally, ask func() (*client.Material, string, string)) {
		defer wg.Done()
		for after := 0; after < 2; {
			select {
			case <-ended:
				after++
			default:
				if inv.isFrozen(s.M.Iid) {
					after++
				}
			}
			m, code, message := ask()
			counts.add(code, message)
			if code == "" {
				inv.material(t, m)
			}
		}
	}
	wg.Add(2)
	go mint(&w.authority, func() (*client.Material, string, string) {
		ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
		defer cancel()
		m, err := pa.C.SupervisorAuthority(ctx, pa.Body(s, client.OpRenewStandingBundle))
		var r *client.Refusal
		switch {
		case err == nil:
			return m, "", ""
		case errors.As(err, &r):
			return nil, r.Code, r.Message
		}
		return nil, "transport", err.Error()
	})
	go mint(&w.own, func() (*client.Material, string, string) {
		o := harness.OwnRenewal(sup, s, subjects.DutySupervisor, client.OpRenew)
		return &o.Material, o.Code, o.Message
	})
	report, err := w.endAsACallerWould(s)
	close(ended)
	if err != nil {
		t.Errorf("end: %v", err)
	}
	wg.Wait()
	if err != nil {
		return
	}
	inv.check(t)
	// What the end reports: every key any mint of the instance recorded, committed or not, is
	// on its list, revoked and evicted.
	revoked := map[string]bool{}
	for _, k := range report.Revoked.NKeys {
		revoked[k] = true
	}
	for _, k := range harness.MintedKeys(t, w.p, s.M.Iid) {
		if !revoked[k] {
			t.Errorf("minted key %s is not on the revocation list the end returned", k)
		}
	}
	if !report.Revoked.Done || !report.Evicted.Complete || !slices.Equal(report.Revoked.NKeys, harness.IdentityKeys(t, s.M)) {
		t.Errorf("end report: got %+v %+v, want every key revoked and evicted", report.Revoked, report.Evicted)
	}
}

// endAttempts bounds how often a round sends an end that answers unavailable.
const endAttempts = 5

// endAsACallerWould ends s and repeats the end while it answers unavailable, as docs/PROTOCOL.md
// tells a caller to: an end that could not confirm every eviction (or reach a store) before its
// deadline is re-entered from where it stopped. On a slow machine twenty ends at once under the
// race detector can outlast one request's deadline; the repeat is what is then under test, and
// the invariants are checked against what the last end reports. The repeats are counted.
func (w *raceWatch) endAsACallerWould(s *harness.Supervised) (*client.EndReport, error) {
	for attempt := 1; ; attempt++ {
		report, err := w.pa.End(s)
		var r *client.Refusal
		if err == nil || !errors.As(err, &r) || r.Code != "unavailable" || attempt == endAttempts {
			return report, err
		}
		w.repeats.Add(1)
	}
}

// laneT is a test's T for a goroutine of its own: a fatal failure there fails the test and
// ends that goroutine (its deferred calls run), never the test's own goroutine.
type laneT struct{ *testing.T }

func (l laneT) Fatal(args ...any) { l.Error(args...); runtime.Goexit() }

func (l laneT) Fatalf(format string, args ...any) { l.Errorf(format, args...); runtime.Goexit() }

func (l laneT) FailNow() { l.Fail(); runtime.Goexit() }

// TestEndRacingSupervisorMintsAndSelfRenewalsLeavesNothingValid: 200 rounds, twenty at a time on
// one plane, of supervisor-authority renewals and the manager's own renewals running while
// supervisor-end runs, each round checked against the invariants of docs/SECURITY.md: no mint commits at or
// after the freeze's revision; every credential is signed by its instance's key, which is off
// the signer set and the broker once the end returns, and every key minted is on the list the
// end returns; no credential's exp passes the assignment's end; the generations' evidence is
// what was staged. (Ends that run together share their pushes to the broker.)
func TestEndRacingSupervisorMintsAndSelfRenewalsLeavesNothingValid(t *testing.T) {
	harness.Long(t, "a race's volume")
	t.Parallel()
	const rounds, together = 200, 20
	w := newRaceWatch(t)
	turns := make(chan struct{}, together)
	var wg sync.WaitGroup
	for range rounds {
		wg.Add(1)
		turns <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-turns }()
			w.round(laneT{t})
		}()
	}
	wg.Wait()
	harness.Report(t, "%d rounds: supervisor-authority renewals: %s; own renewals: %s; ends repeated after unavailable: %d", rounds, &w.authority, &w.own, w.repeats.Load())
	// The race was run, not dodged: mints lost to a freeze at their commit (conflict; the
	// checker would have caught one issued after it).
	if w.authority.count(commitLost)+w.own.count(commitLost) == 0 && !t.Failed() {
		t.Errorf("no mint lost to a freeze at its commit in %d rounds; the test did not race", rounds)
	}
}
