package integration

import (
	"bytes"
	"fmt"
	"sync"
	"testing"

	"github.com/cotal-ai/authplane/client"
	"github.com/cotal-ai/authplane/service"
	"github.com/cotal-ai/authplane/subjects"
)

// revoker is a client of principal owner.actor, with scope set first (nil: no ledger row).
func (env *runEnv) revoker(owner, actor string, scope ...string) *client.Client {
	env.t.Helper()
	if scope != nil {
		grant(env.t, env.p, owner, actor, scope...)
	}
	c, err := principalClient(callerConn(env.t, env.p, owner, actor), owner, actor)
	if err != nil {
		env.t.Fatal(err)
	}
	return c
}

// revoke revokes runID as c with the manager's current proof.
func (env *runEnv) revoke(c *client.Client, runID, reason string) (*client.RevokeReply, error) {
	return c.Revoke(env.ctx(), env.m.Manager, env.cur, runID, reason)
}

// markerOf reads run's revocation marker as stored, or nil.
func markerOf(t testing.TB, p *testPlane, runID string) []byte {
	t.Helper()
	bucket := subjects.AdmissionBucket(testSpace)
	m, err := lastMsg(t, p, bucket, "$KV."+bucket+"."+subjects.RevokedKey(runID))
	if err != nil {
		return nil
	}
	return m.Data
}

func TestWhoMayRevokeARun(t *testing.T) {
	t.Parallel()
	env := newRunEnv(t, startPlane(t, nil))
	cases := []struct {
		name   string
		who    func() *client.Client
		code   string
		reason string
	}{
		// ownerA.owner has no ledger row at all: owning the run is enough.
		{"its admitted owner, with no scope", func() *client.Client { return env.revoker(ownerA, "owner") }, "", "done with it"},
		{"an admin of another owner", func() *client.Client { return env.revoker(ownerB, "admin", "admin") }, "", "ops"},
		{"a stranger", func() *client.Client { return env.revoker(ownerB, "stranger", "supervise") }, "permission-denied", "mine now"},
		{"an admin narrowed to supervise just before", func() *client.Client {
			c := env.revoker(ownerB, "former", "admin")
			grant(t, env.p, ownerB, "former", "supervise")
			return c
		}, "permission-denied", "still admin?"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			runID := env.admitted()
			reply, err := env.revoke(c.who(), runID, c.reason)
			if c.code != "" {
				wantRefusal(t, err, c.code, "requires its admitted owner or a platform admin")
				if m := markerOf(t, env.p, runID); m != nil {
					t.Fatalf("a refused revoke wrote a marker: %s", m)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if stored := markerOf(t, env.p, runID); !bytes.Equal(stored, reply.Revocation) || !bytes.Contains(stored, []byte(c.reason)) {
				t.Fatalf("got revocation %s, stored %s; want the stored marker with the reason", reply.Revocation, stored)
			}
		})
	}
}

// The first marker wins: a repeat, and every one of 20 concurrent revokes with their own
// reasons, succeed with the one marker written, byte for byte.
func TestTheFirstRevocationMarkerWins(t *testing.T) {
	t.Parallel()
	env := newRunEnv(t, startPlane(t, func(c *service.Config) { c.Rate = 0 }))
	owner := env.revoker(ownerA, "owner")

	runID := env.admitted()
	first, err := env.revoke(owner, runID, "first")
	if err != nil {
		t.Fatal(err)
	}
	repeat, err := env.revoke(owner, runID, "second")
	if err != nil || !bytes.Equal(repeat.Revocation, first.Revocation) {
		t.Fatalf("a repeat: got %s, %v; want the first marker %s", repeat.Revocation, err, first.Revocation)
	}

	runID = env.admitted()
	var wg sync.WaitGroup
	got := make([][]byte, 20)
	errs := make([]error, 20)
	for i := range 20 {
		wg.Go(func() {
			r, err := env.revoke(owner, runID, fmt.Sprintf("reason %d", i))
			errs[i] = err
			if err == nil {
				got[i] = r.Revocation
			}
		})
	}
	wg.Wait()
	stored := markerOf(t, env.p, runID)
	for i := range 20 {
		if errs[i] != nil || !bytes.Equal(got[i], stored) {
			t.Errorf("revoke %d: got %s, %v; want the one stored marker %s", i, got[i], errs[i], stored)
		}
	}
}

// After a revoke, the run gets no attempt, admission or renewal again.
func TestARevokedRunGetsNothingMore(t *testing.T) {
	t.Parallel()
	env := newRunEnv(t, startPlane(t, nil))
	rm, _, _ := env.running()
	if _, err := env.revoke(env.revoker(ownerA, "owner"), rm.RunID, "stop"); err != nil {
		t.Fatal(err)
	}
	_, err := env.attempt(env.newTakeover(rm.RunID, 2, 2))
	wantRefusal(t, err, "permission-denied", "revoked")
	_, err = env.renewDriver(rm.Hold)
	wantRefusal(t, err, "permission-denied", "revoked")
	_, err = env.cli.Admit(env.ctx(), env.m.Manager, env.cur, rm.RunID, env.runStart(subjects.RouteOne, ""))
	wantRefusal(t, err, "permission-denied", "revoked")
}
