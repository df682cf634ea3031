package integration

import (
	"testing"
	"time"

	"github.com/cotal-ai/authplane/client"
	"github.com/cotal-ai/authplane/subjects"
)

// A supervised manager's own supervisor admits and takes over runs as itself: behind it stands
// the assignment, not a person with `supervise` (the platform admin who prepared it holds none).
// Once the assignment ends, it admits nothing more (its connection is revoked at the broker).
func TestASupervisedManagerRunsOnItsAssignment(t *testing.T) {
	t.Parallel()
	p, pa, s := supervisedPlane(t, nil, time.Now().Add(time.Hour))
	sup := dutyConn(t, p, s.m, s.owner, subjects.DutySupervisor, s.prep.Credentials[string(subjects.DutySupervisor)].JWT)
	c, err := client.New(sup, testSpace, s.owner, subjects.SupervisorActor(s.m.iid))
	if err != nil {
		t.Fatal(err)
	}
	starter := callerConn(t, p, s.owner, "starter")
	runStart := func() string {
		t.Helper()
		rs := subjects.RunStart{Space: testSpace, Route: subjects.RouteOne, Owner: s.owner, Actor: "starter",
			UID: s.m.uid, Generation: "1", Nonce: newRequestID(t)[:24]}
		if err := starter.Publish(rs.Subject(), []byte(`{}`)); err != nil {
			t.Fatal(err)
		}
		flush(t, starter)
		checkFor(t, 5*time.Second, 10*time.Millisecond, func() error {
			_, err := lastMsg(t, p, subjects.WitnessStream(testSpace, s.owner), rs.Subject())
			return err
		})
		return rs.Subject()
	}

	runID := client.NewRunID()
	if _, err := c.Admit(callCtx(t), s.m.Manager, s.act.Renewal(), runID, runStart()); err != nil {
		t.Fatalf("a supervised manager admitting a run as its own supervisor: %v", err)
	}
	if _, err := pa.end(s); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Admit(callCtx(t), s.m.Manager, s.act.Renewal(), client.NewRunID(), runStart()); err == nil {
		t.Fatal("an admission after the assignment ended was admitted, want it refused or the connection revoked")
	}
}
