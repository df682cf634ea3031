package flows

import (
	"strings"
	"testing"

	"github.com/cotal-ai/authplane/integration/internal/harness"
	"github.com/cotal-ai/authplane/service"
	"github.com/cotal-ai/authplane/subjects"
)

// Issue 29's tenant fairness: budgets that hold per space, endpoints one owner cannot flood
// for another, and connection caps that hold against reconnect churn.

// TestEveryTenantBudgetHoldsPerSpaceAcrossRestartsAndReplicas: an owner's new keys
// (--new-keys-per-owner) and an instance's re-registrations (--reregistrations-per-instance)
// are spent half through one replica and half through another that served beside it; the
// next is refused by the second (they share one budget, not one each), and after a restart
// of the plane it is still refused (the budget is the store's, not the process's). Each
// refusal names its budget and writes nothing. Kept in memory, each replica and each start
// had a budget of its own: one owner once got 40 more keys from a restart.
func TestEveryTenantBudgetHoldsPerSpaceAcrossRestartsAndReplicas(t *testing.T) {
	t.Parallel()
	s := harness.StartStandalone(t, harness.TestSpace)
	replica := func() *harness.TestPlane {
		return harness.StartPlane(t, func(c *service.Config) {
			harness.AgainstStandalone(s)(c)
			// Two registrations of fresh keys (5 each); re-registrations: 2 of an instance at once.
			c.NewKeysPerOwner = 10
			c.ReregistrationsPerInstance, c.ReregistrationsPerOwner = 20, 1000
		})
	}
	a := replica()
	harness.Grant(t, a, harness.OwnerA, "cli", "supervise")
	cli := harness.CallerConn(t, a, harness.OwnerA, "cli")
	m := harness.NewManagerKeys(t)
	_, act := harness.Registered(t, cli, harness.OwnerA, "cli", m) // 5 of the 10 new keys, through a
	again := func() harness.Outcome {
		fresh := harness.NewManagerKeys(t) // the same instance and lifecycle; fresh keys are new keys too
		fresh.Iid, fresh.Uid, fresh.Manager.InstanceID, fresh.Manager.LifecycleUID = m.Iid, m.Uid, m.Iid, m.Uid
		return harness.AskAsync(cli, harness.OwnerA, "cli", subjects.EndpointManagerAuthority, fresh.Body(t, "prepare", "cli"))
	}
	reregs := harness.NewManagerKeys(t)
	harness.Registered(t, cli, harness.OwnerA, "cli", reregs) // the other 5
	// Re-registrations of reregs's instance spend no new key: the same keys again.
	same := func() harness.Outcome {
		return harness.AskAsync(cli, harness.OwnerA, "cli", subjects.EndpointManagerAuthority, reregs.Body(t, "prepare", "cli"))
	}
	if o := same(); o.Code != "" {
		t.Fatalf("the first re-registration, through a: got %s %q, want it issued", o.Code, o.Message)
	}

	b := replica() // b serves beside a; then a stops, and every request is b's
	harness.ClosePlane(t, a.Plane)
	if o := same(); o.Code != "" {
		t.Fatalf("the second re-registration, through b: got %s %q, want it issued", o.Code, o.Message)
	}
	refusedBy := func(who, what, flag string, o harness.Outcome) {
		t.Helper()
		if o.Code != "resource-exhausted" || !strings.Contains(o.Message, flag) || len(o.Material.Credentials) != 0 {
			t.Fatalf("%s, through %s: got %s %q, want resource-exhausted naming %s and nothing", what, who, o.Code, o.Message, flag)
		}
	}
	before := harness.StoreSeqs(t, b)
	refusedBy("b", "a third re-registration", "--reregistrations-per-instance", same())
	refusedBy("b", "a third registration of fresh keys", "--new-keys-per-owner", harness.AskAsync(cli, harness.OwnerA, "cli", subjects.EndpointManagerAuthority, harness.NewManagerKeys(t).Body(t, "prepare", "cli")))
	harness.WantUnwritten(t, b, "refusals past the budgets", before)

	harness.ClosePlane(t, b.Plane)
	c := replica() // the plane restarted
	before = harness.StoreSeqs(t, c)
	refusedBy("a restarted plane", "a third re-registration", "--reregistrations-per-instance", same())
	refusedBy("a restarted plane", "fresh keys for a registered instance", "--new-keys-per-owner", again())
	harness.WantUnwritten(t, c, "refusals past the budgets after a restart", before)
	// Renewals of the keys the owner holds take nothing from either budget.
	harness.MustMint(t, cli, harness.OwnerA, "cli", harness.Renewal(m.Body(t, "renewStandingBundle", "cli"), act.NextRegistrationProof, c.Account(), 0))
}
