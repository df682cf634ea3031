package flows

import (
	"bytes"
	"fmt"
	"sync"
	"testing"

	"github.com/cotal-ai/authplane/client"
	"github.com/cotal-ai/authplane/integration/internal/harness"
	"github.com/cotal-ai/authplane/service"
	"github.com/cotal-ai/authplane/subjects"
)

func TestWhoMayRevokeARun(t *testing.T) {
	t.Parallel()
	env := harness.NewRunEnv(t, harness.StartPlane(t, nil))
	cases := []struct {
		name   string
		who    func() *client.Client
		code   string
		reason string
	}{
		// ownerA.owner has no ledger row at all: owning the run is enough.
		{"its admitted owner, with no scope", func() *client.Client { return env.Revoker(harness.OwnerA, "owner") }, "", "done with it"},
		{"an admin of another owner", func() *client.Client { return env.Revoker(harness.OwnerB, "admin", "admin") }, "", "ops"},
		{"a stranger", func() *client.Client { return env.Revoker(harness.OwnerB, "stranger", "supervise") }, "permission-denied", "mine now"},
		{"an admin narrowed to supervise just before", func() *client.Client {
			c := env.Revoker(harness.OwnerB, "former", "admin")
			harness.Grant(t, env.P, harness.OwnerB, "former", "supervise")
			return c
		}, "permission-denied", "still admin?"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			runID := env.Admitted()
			reply, err := env.Revoke(c.who(), runID, c.reason)
			if c.code != "" {
				harness.WantRefusal(t, err, c.code, "requires its admitted owner or a platform admin")
				if m := harness.MarkerOf(t, env.P, runID); m != nil {
					t.Fatalf("a refused revoke wrote a marker: %s", m)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if stored := harness.MarkerOf(t, env.P, runID); !bytes.Equal(stored, reply.Revocation) || !bytes.Contains(stored, []byte(c.reason)) {
				t.Fatalf("got revocation %s, stored %s; want the stored marker with the reason", reply.Revocation, stored)
			}
		})
	}
}

// The first marker wins: a repeat, and every one of 20 concurrent revokes with their own
// reasons, succeed with the one marker written, byte for byte.
func TestTheFirstRevocationMarkerWins(t *testing.T) {
	t.Parallel()
	env := harness.NewRunEnv(t, harness.StartPlane(t, func(c *service.Config) { c.Rate = 0 }))
	owner := env.Revoker(harness.OwnerA, "owner")

	runID := env.Admitted()
	first, err := env.Revoke(owner, runID, "first")
	if err != nil {
		t.Fatal(err)
	}
	repeat, err := env.Revoke(owner, runID, "second")
	if err != nil || !bytes.Equal(repeat.Revocation, first.Revocation) {
		t.Fatalf("a repeat: got %s, %v; want the first marker %s", repeat.Revocation, err, first.Revocation)
	}

	runID = env.Admitted()
	var wg sync.WaitGroup
	got := make([][]byte, 20)
	errs := make([]error, 20)
	for i := range 20 {
		wg.Go(func() {
			r, err := env.Revoke(owner, runID, fmt.Sprintf("reason %d", i))
			errs[i] = err
			if err == nil {
				got[i] = r.Revocation
			}
		})
	}
	wg.Wait()
	stored := harness.MarkerOf(t, env.P, runID)
	for i := range 20 {
		if errs[i] != nil || !bytes.Equal(got[i], stored) {
			t.Errorf("revoke %d: got %s, %v; want the one stored marker %s", i, got[i], errs[i], stored)
		}
	}
}

// After a revoke, the run gets no attempt, admission or renewal again.
func TestARevokedRunGetsNothingMore(t *testing.T) {
	t.Parallel()
	env := harness.NewRunEnv(t, harness.StartPlane(t, nil))
	rm, _, _ := env.Running()
	if _, err := env.Revoke(env.Revoker(harness.OwnerA, "owner"), rm.RunID, "stop"); err != nil {
		t.Fatal(err)
	}
	_, err := env.Attempt(env.NewTakeover(rm.RunID, 2, 2))
	harness.WantRefusal(t, err, "permission-denied", "revoked")
	_, err = env.RenewDriver(rm.Hold)
	harness.WantRefusal(t, err, "permission-denied", "revoked")
	_, err = env.Cli.Admit(env.Ctx(), env.M.Manager, env.Cur, rm.RunID, env.RunStart(subjects.RouteOne, ""))
	harness.WantRefusal(t, err, "permission-denied", "revoked")
}
