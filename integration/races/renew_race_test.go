package races

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cotal-ai/authplane/client"
	"github.com/cotal-ai/authplane/integration/internal/harness"
	"github.com/cotal-ai/authplane/internal/testkit"
	"github.com/cotal-ai/authplane/service"
	"github.com/cotal-ai/authplane/subjects"
)

// Sixteen requesters renew one instance, round after round, while its gate is re-registered (a
// new prepare of the same instance: a fence write that advances its process epoch and
// registration). Every credential that comes back committed on the gate before the
// re-registration did, under the epoch it replaced; once the re-registration has landed, the
// old registration renews nothing: every requester ends on a conflict. Half the requesters are
// the instance's own supervisor (a manager renewing itself), half the person who prepared it,
// each on its own connection, so both ways a renewal is authorized race the fence.
func TestNoRenewalCommitsAfterItsInstanceIsReRegistered(t *testing.T) {
	harness.Long(t, "a race's volume")
	t.Parallel()
	const rounds, requesters = 20, 16
	p := harness.StartPlane(t, func(c *service.Config) { harness.Unbudgeted(c); c.Workers = 8 })
	harness.Grant(t, p, harness.OwnerA, "cli", "supervise")
	person, err := harness.PrincipalClient(harness.CallerConn(t, p, harness.OwnerA, "cli"), harness.OwnerA, "cli")
	if err != nil {
		t.Fatal(err)
	}
	m := harness.NewManagerKeys(t)
	prep, act := harness.Registered(t, person.Conn(), harness.OwnerA, "cli", m)
	ctx := func() (context.Context, context.CancelFunc) {
		return context.WithTimeout(context.Background(), 15*time.Second)
	}

	var renewers []*client.Client
	for i := range requesters {
		var c *client.Client
		if i%2 == 0 {
			actor := subjects.SupervisorActor(m.Iid)
			c, err = harness.PrincipalClient(harness.DutyConn(t, p, m, harness.OwnerA, subjects.DutySupervisor, prep.Credentials["supervisor"].JWT), harness.OwnerA, actor)
		} else {
			c, err = harness.PrincipalClient(harness.CallerConn(t, p, harness.OwnerA, "cli"), harness.OwnerA, "cli")
		}
		if err != nil {
			t.Fatal(err)
		}
		renewers = append(renewers, c)
	}

	committed := 0
	for round := range rounds {
		cur := act.Renewal()
		var reRegistered atomic.Bool
		var mu sync.Mutex
		var renewed []*client.Material
		var wg sync.WaitGroup
		for _, c := range renewers {
			wg.Go(func() {
				for {
					after := reRegistered.Load()
					rctx, cancel := ctx()
					mat, err := c.Renew(rctx, m.Manager, cur)
					cancel()
					var r *client.Refusal
					switch {
					case err == nil && after:
						t.Errorf("round %d: a renewal sent after the re-registration landed got credentials (gate revision %d)", round, mat.GateRevision)
						return
					case err == nil:
						mu.Lock()
						renewed = append(renewed, mat)
						mu.Unlock()
					case errors.As(err, &r) && r.Code == "conflict":
						return // the registration moved: it renews nothing more
					default:
						t.Errorf("round %d: got %v, want credentials or conflict", round, err)
						return
					}
				}
			})
		}
		// Renewals are flowing; re-register the instance while they do.
		testkit.CheckFor(t, 10*time.Second, time.Millisecond, func() error {
			mu.Lock()
			defer mu.Unlock()
			if len(renewed) < requesters {
				return fmt.Errorf("round %d: %d renewals so far", round, len(renewed))
			}
			return nil
		})
		rctx, cancel := ctx()
		next, err := person.Prepare(rctx, m.Manager)
		cancel()
		if err != nil {
			t.Fatalf("round %d: re-register: %v", round, err)
		}
		reRegistered.Store(true)
		wg.Wait()
		for _, r := range renewed {
			if r.GateRevision == 0 || r.GateRevision >= next.GateRevision {
				t.Fatalf("round %d: a renewal committed at gate revision %d, not before the re-registration at %d", round, r.GateRevision, next.GateRevision)
			}
			if r.ProcessEpoch != cur.Epoch || next.ProcessEpoch != cur.Epoch+1 {
				t.Fatalf("round %d: a renewal at epoch %d, the re-registration at %d; want %d and %d", round, r.ProcessEpoch, next.ProcessEpoch, cur.Epoch, cur.Epoch+1)
			}
		}
		committed += len(renewed)
		rctx, cancel = ctx()
		a, err := person.Activate(rctx, m.Manager, next.RegistrationProof)
		cancel()
		if err != nil {
			t.Fatalf("round %d: activate the new registration: %v", round, err)
		}
		act = *a
	}
	t.Logf("%d rounds: %d renewals committed, every one before the re-registration that ended its round", rounds, committed)
}
