package flows

import (
	"testing"
	"time"

	"github.com/cotal-ai/authplane/client"
	"github.com/cotal-ai/authplane/integration/internal/harness"
	"github.com/cotal-ai/authplane/internal/testkit"
	"github.com/cotal-ai/authplane/subjects"
)

// A supervised manager's own supervisor admits and takes over runs as itself: behind it stands
// the assignment, not a person with `supervise` (the platform admin who prepared it holds none).
// Once the assignment ends, it admits nothing more (its connection is revoked at the broker).
func TestASupervisedManagerRunsOnItsAssignment(t *testing.T) {
	t.Parallel()
	p, pa, s := harness.SupervisedPlane(t, nil, time.Now().Add(time.Hour))
	sup := harness.DutyConn(t, p, s.M, s.Owner, subjects.DutySupervisor, s.Prep.Credentials[string(subjects.DutySupervisor)].JWT)
	c, err := client.New(sup, harness.TestSpace, s.Owner, subjects.SupervisorActor(s.M.Iid))
	if err != nil {
		t.Fatal(err)
	}
	starter := harness.CallerConn(t, p, s.Owner, "starter")
	runStart := func() string {
		t.Helper()
		rs := subjects.RunStart{Space: harness.TestSpace, Route: subjects.RouteOne, Owner: s.Owner, Actor: "starter",
			UID: s.M.Uid, Generation: "1", Nonce: harness.NewRequestID(t)[:24]}
		if err := starter.Publish(rs.Subject(), []byte(`{}`)); err != nil {
			t.Fatal(err)
		}
		harness.Flush(t, starter)
		testkit.CheckFor(t, 5*time.Second, 10*time.Millisecond, func() error {
			_, err := harness.LastMsg(t, p, subjects.WitnessStream(harness.TestSpace, s.Owner), rs.Subject())
			return err
		})
		return rs.Subject()
	}

	runID := client.NewRunID()
	if _, err := c.Admit(harness.CallCtx(t), s.M.Manager, s.Act.Renewal(), runID, runStart()); err != nil {
		t.Fatalf("a supervised manager admitting a run as its own supervisor: %v", err)
	}
	if _, err := pa.End(s); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Admit(harness.CallCtx(t), s.M.Manager, s.Act.Renewal(), client.NewRunID(), runStart()); err == nil {
		t.Fatal("an admission after the assignment ended was admitted, want it refused or the connection revoked")
	}
}
