package integration

import (
	"errors"
	"sync"
	"testing"

	"github.com/cotal-ai/authplane/client"
	"github.com/cotal-ai/authplane/service"
)

// Attempts and renewals of one run race a revoke, round after round: no credential comes back
// whose run-fence commit came after the revocation's, and every refusal is one a manager can
// act on.
func TestNoRunCredentialCommitsAfterItsRevocation(t *testing.T) {
	t.Parallel()
	const rounds = 200
	env := newRunEnv(t, startPlane(t, func(c *service.Config) { c.Rate = 0; c.Workers = 4 }))
	owner := env.revoker(ownerA, "owner")
	var before, after int
	for range rounds {
		rm, _, _ := env.running()
		var wg sync.WaitGroup
		var mu sync.Mutex
		var minted []uint64
		var revokedAt uint64
		record := func(m *client.RunMaterial, err error) {
			mu.Lock()
			defer mu.Unlock()
			var r *client.Refusal
			switch {
			case err == nil:
				minted = append(minted, m.RunFenceRevision)
			case !errors.As(err, &r) || (r.Code != "permission-denied" && r.Code != "conflict"):
				t.Errorf("got %v, want credentials, or permission-denied or conflict", err)
			}
		}
		for range 2 {
			wg.Go(func() { record(env.renewDriver(rm.Hold)) })
		}
		wg.Go(func() { record(env.attempt(env.newTakeover(rm.RunID, 2, 2))) })
		wg.Go(func() {
			r, err := env.revoke(owner, rm.RunID, "race")
			if err != nil {
				t.Errorf("revoke: %v", err)
				return
			}
			mu.Lock()
			revokedAt = r.RunFenceRevision
			mu.Unlock()
		})
		wg.Wait()
		for _, rev := range minted {
			if rev >= revokedAt {
				t.Fatalf("a run credential committed at run-fence revision %d, at or after its revocation at %d", rev, revokedAt)
			}
			before++
		}
		if len(minted) < 3 {
			after += 3 - len(minted)
		}
	}
	t.Logf("%d rounds: %d credentials committed before their revocation, %d refused", rounds, before, after)
}

// Two plane replicas on one broker serve admissions of the same witness: over 100 trials, one
// witness is admitted at most once (here: exactly once), whichever replica each request meets.
func TestTwoReplicasAdmitAWitnessOnce(t *testing.T) {
	t.Parallel()
	s := startStandalone(t, testSpace)
	a := startPlane(t, func(c *service.Config) { againstStandalone(s)(c); c.Rate = 0 })
	startPlane(t, func(c *service.Config) { againstStandalone(s)(c); c.Rate = 0 })
	env := newRunEnv(t, a)
	for trial := range 100 {
		subject := env.runStart("one", "")
		var wg sync.WaitGroup
		errs := make([]error, 2)
		for i := range errs {
			wg.Go(func() {
				_, errs[i] = env.cli.Admit(env.ctx(), env.m.Manager, env.cur, client.NewRunID(), subject)
			})
		}
		wg.Wait()
		admitted := 0
		for _, err := range errs {
			if err == nil {
				admitted++
				continue
			}
			wantRefusal(t, err, "permission-denied", "already consumed")
		}
		if admitted != 1 {
			t.Fatalf("trial %d: the witness was admitted %d times, want once", trial, admitted)
		}
	}
}
