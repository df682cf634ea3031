package races

import (
	"sync"
	"testing"

	"github.com/cotal-ai/authplane/client"
	"github.com/cotal-ai/authplane/integration/internal/harness"
	"github.com/cotal-ai/authplane/service"
)

// Attempts and renewals of one run race a revoke, round after round, each round checked
// against the invariants of docs/SECURITY.md: no run credential comes back whose run-fence commit came
// after the revocation's (or the takeover's, for the old hold's renewals), every one has its
// `minted` record, and every refusal is one a manager can act on.
func TestNoRunCredentialCommitsAfterItsRevocation(t *testing.T) {
	harness.Long(t, "a race's volume")
	t.Parallel()
	const rounds = 200
	env := harness.NewRunEnv(t, harness.StartPlane(t, func(c *service.Config) { harness.Unbudgeted(c); c.Workers = 4 }))
	owner := env.Revoker(harness.OwnerA, "owner")
	inv := newInvariants(env.P)
	var renewals, attempts tally
	for round := range rounds {
		rm, _, _ := env.Running()
		inv.runMaterial(t, rm, env.Cur.Epoch)
		var wg sync.WaitGroup
		record := func(of *tally, m *client.RunMaterial, err error) {
			if of.of(err) {
				inv.runMaterial(t, m, env.Cur.Epoch)
			} else if code := client.CodeOf(err); code != "permission-denied" && code != "conflict" {
				t.Errorf("got %v, want credentials, or permission-denied or conflict", err)
			}
		}
		for range 2 {
			wg.Go(func() {
				m, err := env.RenewDriver(rm.Hold)
				record(&renewals, m, err)
			})
		}
		wg.Go(func() {
			m, err := env.Attempt(env.NewTakeover(rm.RunID, 2, 2))
			record(&attempts, m, err)
		})
		wg.Go(func() {
			r, err := env.Revoke(owner, rm.RunID, "race")
			if err != nil {
				t.Errorf("revoke: %v", err)
				return
			}
			inv.revokedRun(r)
		})
		wg.Wait()
		inv.check(t)
		if t.Failed() {
			t.Fatalf("round %d of %d failed", round+1, rounds)
		}
	}
	harness.Report(t, "%d rounds: driver renewals: %s; takeovers: %s", rounds, &renewals, &attempts)
	if renewals.count("") == 0 || renewals.count("permission-denied")+renewals.count(commitLost) == 0 {
		t.Errorf("renewals %s, takeovers %s: the revoke never won or never lost; the test did not race", &renewals, &attempts)
	}
}

// Two plane replicas on one broker serve admissions of the same witness: over 100 trials, one
// witness is admitted at most once (here: exactly once), whichever replica each request meets.
func TestTwoReplicasAdmitAWitnessOnce(t *testing.T) {
	harness.Long(t, "a race's volume")
	t.Parallel()
	s := harness.StartStandalone(t, harness.TestSpace)
	a := harness.StartPlane(t, func(c *service.Config) { harness.AgainstStandalone(s)(c); c.Rate = 0 })
	harness.StartPlane(t, func(c *service.Config) { harness.AgainstStandalone(s)(c); c.Rate = 0 })
	env := harness.NewRunEnv(t, a)
	for trial := range 100 {
		subject := env.RunStart("one", "")
		var wg sync.WaitGroup
		errs := make([]error, 2)
		for i := range errs {
			wg.Go(func() {
				_, errs[i] = env.Cli.Admit(env.Ctx(), env.M.Manager, env.Cur, client.NewRunID(), subject)
			})
		}
		wg.Wait()
		admitted := 0
		for _, err := range errs {
			if err == nil {
				admitted++
				continue
			}
			harness.WantRefusal(t, err, "permission-denied", "already consumed")
		}
		if admitted != 1 {
			t.Fatalf("trial %d: the witness was admitted %d times, want once", trial, admitted)
		}
	}
}
