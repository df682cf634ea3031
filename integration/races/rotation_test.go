package races

import (
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/cotal-ai/authplane/admin"
	"github.com/cotal-ai/authplane/integration/internal/harness"
	"github.com/cotal-ai/authplane/internal/capability/signers"
	"github.com/cotal-ai/authplane/internal/testkit"
	"github.com/cotal-ai/authplane/service"
)

// wantGeneration fails the test unless the rotation is over with generation gen signing, and
// the broker's data account JWT lists exactly gen's keys: its own and live instance iid's,
// and neither of the generation before.
func wantGeneration(t *testing.T, p *harness.TestPlane, keys *signers.Keys, gen uint64, iid, what string) {
	t.Helper()
	st, rep := harness.SigningStatus(t, p)
	if !rep.Done || st.Current != gen {
		t.Fatalf("%s: generation %d signs, rotation %+v; want %d and none under way", what, st.Current, rep, gen)
	}
	claims, _ := harness.DataAccountAtBroker(t, p)
	for g, want := range map[uint64]bool{gen - 1: false, gen: true} {
		own := harness.MainKey(t, keys, g) // loads generation g
		inst, err := keys.PublicOf(g, iid)
		if err != nil {
			t.Fatal(err)
		}
		for _, k := range []string{own, inst} {
			if _, listed := claims.SigningKeys[k]; listed != want {
				t.Errorf("%s: generation %d's key %s listed %v, want %v", what, g, k, listed, want)
			}
		}
	}
}

// TestARotationCrashedAfterEachStepIsCompletedByARestart: for every step of an emergency and
// of a scheduled rotation, the rotation stops there as a crash would: the command stops after
// it, or (the steps a scheduled rotation makes only once its old keys may leave) a replica
// hangs for good right after it. A replica started then (a restart) completes the rotation on
// its tick: the generation signs, the JWT every server holds lists its keys and the live
// instance's, and none of the generation before. A replica that stays up with its tick an
// hour away serves throughout and never rotates.
func TestARotationCrashedAfterEachStepIsCompletedByARestart(t *testing.T) {
	harness.Long(t, "thirteen rotations and as many replica starts")
	t.Parallel()
	sa := harness.StartStandalone(t, harness.TestSpace)
	clock := &harness.FakeClock{}
	replica := func(hooks *service.Hooks) *harness.TestPlane {
		return harness.StartPlane(t, func(c *service.Config) {
			harness.AgainstStandalone(sa)(c)
			c.Now = clock.Now
			c.Hooks = hooks
		})
	}
	p := replica(&service.Hooks{RotationTick: time.Hour})
	harness.Grant(t, p, harness.OwnerA, "cli", "supervise")
	m := harness.NewManagerKeys(t)
	harness.Registered(t, harness.CallerConn(t, p, harness.OwnerA, "cli"), harness.OwnerA, "cli", m)
	keys := harness.Generations(t, p)

	restart := func(what string) {
		t.Helper()
		r := replica(&service.Hooks{RotationTick: 50 * time.Millisecond})
		testkit.CheckFor(t, 30*time.Second, 50*time.Millisecond, func() error {
			st, rep := harness.SigningStatus(t, p)
			if rep.Step == signers.StepSwitched && clock.Now().Before(rep.RemoveAfter.Add(time.Minute)) {
				// A scheduled rotation the restarted replica switched: its old keys may
				// leave a day later on the test clock.
				clock.Advance(rep.RemoveAfter.Sub(clock.Now()) + 2*time.Minute)
			}
			if !rep.Done {
				return fmt.Errorf("%s: generation %d signs; the rotation is at step %s", what, st.Current, rep.Step)
			}
			return nil
		})
		harness.ClosePlane(t, r.Plane)
	}
	// crash stops a rotation of kind after step, through the command.
	crash := func(kind, step string) {
		t.Helper()
		rep, err := harness.RotateWith(t, p, admin.RotateOptions{Kind: kind, StopAfter: func(s string) bool { return s == step }})
		if !errors.Is(err, signers.ErrStopped) {
			t.Fatalf("a %s rotation stopped after %s: got %+v, %v", kind, step, rep, err)
		}
		want := step
		if step == signers.StepGenerated {
			want = signers.StepBegun // the generation is stored; the row still says begun
		}
		if _, rep := harness.SigningStatus(t, p); rep.Done || rep.Step != want {
			t.Fatalf("a %s rotation stopped after %s: the row says %+v", kind, step, rep)
		}
	}
	// hang begins a scheduled rotation and lets a replica make it up to step once the old
	// keys may leave, then hang there for good (until the test ends).
	hang := func(step string) {
		t.Helper()
		crash(signers.Scheduled, signers.StepSwitched)
		clock.Advance(admin.RotationLongest + admin.RotationSlack + time.Minute)
		reached, release := make(chan struct{}), make(chan struct{})
		var once sync.Once
		replica(&service.Hooks{RotationTick: 50 * time.Millisecond, RotationStopAfter: func(s string) bool {
			if s != step {
				return false
			}
			once.Do(func() { close(reached) })
			<-release
			return true
		}})
		t.Cleanup(func() { close(release) }) // before the hung replica closes
		select {
		case <-reached:
		case <-time.After(30 * time.Second):
			t.Fatalf("the replica never made step %s", step)
		}
	}

	gen := uint64(0)
	for _, step := range []string{signers.StepBegun, signers.StepGenerated, signers.StepListed, signers.StepBearers,
		signers.StepSwitched, signers.StepRemoved, signers.StepEvicted} {
		gen++
		crash(signers.Emergency, step)
		restart("emergency, after " + step)
		wantGeneration(t, p, keys, gen, m.Iid, "an emergency rotation crashed after "+step)
	}
	for _, step := range []string{signers.StepBegun, signers.StepGenerated, signers.StepListed, signers.StepSwitched,
		signers.StepRemoved, signers.StepEvicted} {
		gen++
		if step == signers.StepRemoved || step == signers.StepEvicted {
			hang(step)
		} else {
			crash(signers.Scheduled, step)
			clock.Advance(admin.RotationLongest + admin.RotationSlack + time.Minute)
		}
		restart("scheduled, after " + step)
		wantGeneration(t, p, keys, gen, m.Iid, "a scheduled rotation crashed after "+step)
	}
	if st, _ := harness.SigningStatus(t, p); st.Trust != 7 {
		t.Fatalf("the proofs are keyed by generation %d, want 7 (the last emergency rotation's)", st.Trust)
	}
}

// TestTwoReplicasAskedToRotateAtOnceRotateOnce: two commands ask for an emergency rotation at
// once: one makes it (generation 1), the other is refused conflict. Then two replicas whose
// schedule falls due at the same tick (--rotate-signing-every, on one test clock, counted from
// the emergency rotation's switch) make one scheduled rotation: generation 2, and no generation
// 3 stored. (The commands run on the wall clock: they go first, while the test clock is on it.)
func TestTwoReplicasAskedToRotateAtOnceRotateOnce(t *testing.T) {
	t.Parallel()
	sa := harness.StartStandalone(t, harness.TestSpace)
	clock := &harness.FakeClock{}
	var ps []*harness.TestPlane
	for range 2 {
		ps = append(ps, harness.StartPlane(t, func(c *service.Config) {
			harness.AgainstStandalone(sa)(c)
			c.Now = clock.Now
			c.RotateSigningEvery = 72 * time.Hour
			c.Hooks = &service.Hooks{RotationTick: 20 * time.Millisecond}
		}))
	}
	p := ps[0]
	keys := harness.Generations(t, p)

	var wg sync.WaitGroup
	errs := make([]error, 2)
	for i := range 2 {
		wg.Go(func() { _, errs[i] = harness.Rotate(t, ps[i], signers.Emergency) })
	}
	wg.Wait()
	made, refused := 0, 0
	for _, err := range errs {
		switch {
		case err == nil:
			made++
		case harness.IsConflict(err):
			refused++
		default:
			t.Errorf("an emergency rotation asked twice at once: %v", err)
		}
	}
	if made != 1 || refused != 1 {
		t.Fatalf("two emergency rotations at once: %d made, %d refused conflict; want one of each (%v)", made, refused, errs)
	}
	if st, rep := harness.SigningStatus(t, p); !rep.Done || st.Current != 1 {
		t.Fatalf("after them: generation %d signs, rotation %+v; want 1, done", st.Current, rep)
	}
	if err := keys.Load(harness.GrantCtx(t), 2); !errors.Is(err, signers.ErrNoGeneration) {
		t.Fatalf("generation 2 after one emergency rotation: got %v, want none stored", err)
	}

	clock.Advance(72*time.Hour + time.Minute)
	testkit.CheckFor(t, 20*time.Second, 50*time.Millisecond, func() error {
		if st, rep := harness.SigningStatus(t, p); rep.Step != signers.StepSwitched || st.Current != 2 {
			return fmt.Errorf("generation %d signs, step %s; want 2, switched", st.Current, rep.Step)
		}
		return nil
	})
	clock.Advance(48 * time.Hour) // past the old keys' last credential, and not due again
	testkit.CheckFor(t, 20*time.Second, 50*time.Millisecond, func() error {
		if st, rep := harness.SigningStatus(t, p); !rep.Done || st.Current != 2 {
			return fmt.Errorf("generation %d signs, step %s; want 2, done", st.Current, rep.Step)
		}
		return nil
	})
	if err := keys.Load(harness.GrantCtx(t), 3); !errors.Is(err, signers.ErrNoGeneration) {
		t.Fatalf("generation 3 after one scheduled rotation: got %v, want none stored", err)
	}
}
