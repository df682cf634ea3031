package integration

import (
	"context"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/cotal-ai/authplane/client"
	"github.com/cotal-ai/authplane/service"
	"github.com/cotal-ai/authplane/subjects"
)

// raceWatch is a plane whose hooks watch ends racing mints: when each end's freeze had landed,
// by instance.
type raceWatch struct {
	p      *testPlane
	pa     *platformAdmin
	mu     sync.Mutex
	frozen map[string]int64 // instance → unix ms its freeze had landed by
	// conflicts counts mints refused at their commit because a fence moved: the race was run.
	conflicts atomic.Int64
}

func newRaceWatch(t testing.TB) *raceWatch {
	w := &raceWatch{frozen: map[string]int64{}}
	w.p = startPlane(t, func(c *service.Config) {
		c.Rate = 0
		c.Workers = 8
		c.Hooks = &service.Hooks{
			AfterEndStep: func(iid string, step int) error {
				if step == 1 {
					w.mu.Lock()
					w.frozen[iid] = time.Now().UnixMilli()
					w.mu.Unlock()
				}
				return nil
			},
			// Widen the window between signing and committing, so that mints straddle the
			// freeze: signed before it, committing after it.
			BeforeCommit: func() { time.Sleep(time.Millisecond) },
		}
	})
	w.pa = newPlatformAdmin(t, w.p, "admin")
	return w
}

// frozenAt is when the freeze of instance iid had landed by (unix ms), 0 before it.
func (w *raceWatch) frozenAt(iid string) int64 {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.frozen[iid]
}

// round runs one assignment: supervised renewals and the manager's own renewals race its end.
func (w *raceWatch) round(t testing.TB) {
	pa := w.pa
	end := time.Now().Add(time.Hour).Truncate(time.Second)
	s := pa.assign(end)
	pa.register(s)
	quiet := (&asyncErrors{}).option() // the end closes them
	sup := dutyConn(t, w.p, s.m, s.owner, subjects.DutySupervisor, s.prep.Credentials["supervisor"].JWT, quiet, nats.NoReconnect())

	var mu sync.Mutex
	issued := []*client.Material{s.prep, s.act}
	var wg sync.WaitGroup
	mint := func(ask func() (*client.Material, string)) {
		defer wg.Done()
		for after := 0; after < 2; {
			if w.frozenAt(s.m.iid) != 0 {
				after++
			}
			m, code := ask()
			switch {
			case code == "":
				mu.Lock()
				issued = append(issued, m)
				mu.Unlock()
			case code == "conflict":
				w.conflicts.Add(1)
			}
		}
	}
	for _, op := range []string{client.OpRenewStandingBundle} {
		wg.Add(1)
		go mint(func() (*client.Material, string) {
			ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
			defer cancel()
			m, err := pa.c.SupervisorAuthority(ctx, pa.body(s, op))
			if err != nil && client.CodeOf(err) == "" {
				return nil, "transport"
			}
			return m, client.CodeOf(err)
		})
	}
	for _, own := range []struct {
		nc *nats.Conn
		d  subjects.Duty
	}{{sup, subjects.DutySupervisor}} {
		wg.Add(1)
		go mint(func() (*client.Material, string) {
			o := ownRenewal(own.nc, s, own.d, client.OpRenew)
			return &o.material, o.code
		})
	}
	report, err := pa.end(s)
	if err != nil {
		t.Errorf("end: %v", err)
	}
	wg.Wait()
	if err != nil {
		return
	}

	frozen := w.frozenAt(s.m.iid)
	revoked := map[string]bool{}
	for _, k := range report.Revoked.NKeys {
		revoked[k] = true
	}
	for _, m := range issued {
		// A credential is valid only if its commit landed, and none lands after the freeze: so
		// every one issued was signed before the freeze had landed.
		if m.IssuedAt > frozen {
			t.Errorf("%s issued at %d ms, after the freeze had landed (%d ms)", m.Operation, m.IssuedAt, frozen)
		}
		for duty, c := range m.Credentials {
			if c.Exp > end.Unix() {
				t.Errorf("%s %s: exp %d past the assignment's end %d", m.Operation, duty, c.Exp, end.Unix())
			}
			if key := s.m.pub(t, subjects.Duty(duty)); !revoked[key] {
				t.Errorf("%s %s: key %s is not on the revocation list the end returned", m.Operation, duty, key)
			}
		}
	}
	// Every key any mint of the instance recorded, committed or not, is on the list.
	for _, k := range mintedKeys(t, w.p, s.m.iid) {
		if !revoked[k] {
			t.Errorf("minted key %s is not on the revocation list the end returned", k)
		}
	}
	if !report.Revoked.Done || !report.Evicted.Complete || !slices.Equal(report.Revoked.NKeys, identityKeys(t, s.m)) {
		t.Errorf("end report: got %+v %+v, want every key revoked and evicted", report.Revoked, report.Evicted)
	}
}

// mintedKeys lists the keys of instance iid's `minted` records, read as an auditor would.
func mintedKeys(t testing.TB, p *testPlane, iid string) []string {
	t.Helper()
	ctx := callCtx(t)
	st, err := p.JS(t).Stream(ctx, subjects.MintedStream(testSpace))
	if err != nil {
		t.Fatal(err)
	}
	filter := subjects.MintedInstanceFilter(testSpace, iid)
	info, err := st.Info(ctx, jetstream.WithSubjectFilter(filter))
	if err != nil {
		t.Fatal(err)
	}
	var keys []string
	for subject := range info.State.Subjects {
		keys = append(keys, subject[len(filter)-1:])
	}
	return keys
}

// laneT is a test's T for a goroutine of its own: a fatal failure there fails the test and
// ends that goroutine (its deferred calls run), never the test's own goroutine.
type laneT struct{ *testing.T }

func (l laneT) Fatal(args ...any) { l.Error(args...); runtime.Goexit() }

func (l laneT) Fatalf(format string, args ...any) { l.Errorf(format, args...); runtime.Goexit() }

func (l laneT) FailNow() { l.Fail(); runtime.Goexit() }

// TestEndRacingSupervisorMintsAndSelfRenewalsLeavesNothingValid: 100 rounds, ten at a time on
// one plane, of supervisor-authority renewals and the manager's own renewals running while
// supervisor-end runs. No mint commits after the freeze; every key minted is on the revocation
// list when the end returns; no credential's exp passes the assignment's end. (Ends that run
// together share their pushes to the broker.)
func TestEndRacingSupervisorMintsAndSelfRenewalsLeavesNothingValid(t *testing.T) {
	t.Parallel()
	const rounds, together = 100, 10
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
	// The race was run, not dodged: mints lost to a freeze at their commit (and were refused:
	// the checks above would have caught one issued).
	if w.conflicts.Load() == 0 && !t.Failed() {
		t.Errorf("no mint lost to a freeze at its commit in %d rounds; the test did not race", rounds)
	}
	t.Logf("%d mints lost to a freeze at their commit", w.conflicts.Load())
}
