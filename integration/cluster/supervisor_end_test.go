package cluster

import (
	"testing"
	"time"

	"github.com/cotal-ai/authplane/integration/internal/harness"
	"github.com/cotal-ai/authplane/subjects"
)

// TestSupervisorEndRevokesOnAThreeNodeCluster: against a three-node cluster with R3 stores,
// the end's push goes through `$SYS` to every server: the supervisor and executor, connected
// to two different servers, are closed by their brokers, no server takes their credentials
// again, and a server restarted afterwards still refuses them.
func TestSupervisorEndRevokesOnAThreeNodeCluster(t *testing.T) {
	harness.Long(t, "a three-node cluster")
	t.Parallel()
	c := startCluster(t, harness.TestSpace, 3)
	_, pa, s := harness.SupervisedPlane(t, againstCluster(c), time.Now().Add(time.Hour))

	sup := harness.WatchDuty(t, c.URL(1), s, subjects.DutySupervisor, s.Prep.Credentials["supervisor"].JWT)
	exec := harness.WatchDuty(t, c.URL(2), s, subjects.DutyExecutor, s.Prep.Credentials["executor"].JWT)

	harness.EndEvicting(t, pa, s, sup, exec)
	for i := range 3 {
		for _, d := range []subjects.Duty{subjects.DutySupervisor, subjects.DutyExecutor} {
			harness.WantRefusedToConnect(t, c.URL(i), s, d, s.Prep.Credentials[string(d)].JWT)
		}
	}

	c.restart(t, 2)
	for _, d := range []subjects.Duty{subjects.DutySupervisor, subjects.DutyExecutor} {
		harness.WantRefusedToConnect(t, c.URL(2), s, d, s.Prep.Credentials[string(d)].JWT)
	}
}
