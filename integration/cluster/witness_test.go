package cluster

import (
	"testing"

	"github.com/cotal-ai/authplane/client"
	"github.com/cotal-ai/authplane/integration/internal/harness"
	"github.com/cotal-ai/authplane/service"
	"github.com/cotal-ai/authplane/subjects"
)

// On a cluster each owner's witness is replicated like every store (--replicas 3), and two
// plane replicas admit a witnessed run-start once between them.
func TestOnAClusterAnOwnersWitnessIsReplicatedAndAdmittedOnce(t *testing.T) {
	harness.Long(t, "a three-node cluster")
	t.Parallel()
	c := startCluster(t, harness.TestSpace, 3)
	a := harness.StartPlane(t, againstCluster(c))
	b := harness.StartPlane(t, func(cfg *service.Config) { againstCluster(c)(cfg); cfg.NATSURL = c.URL(2) })
	env := harness.NewRunEnv(t, a)
	subject := env.RunStart(subjects.RouteOne, "")
	info, err := harness.StreamInfo(t, a, harness.WitnessStream(harness.OwnerA))
	if err != nil {
		t.Fatal(err)
	}
	if info.Config.Replicas != 3 || info.Cluster == nil || len(info.Cluster.Replicas) != 2 {
		t.Fatalf("owner A's witness on the cluster: got %d replicas (%+v), want 3", info.Config.Replicas, info.Cluster)
	}
	cliB, err := harness.PrincipalClient(harness.CallerConn(t, b, harness.OwnerA, "cli"), harness.OwnerA, "cli")
	if err != nil {
		t.Fatal(err)
	}
	admitted := 0
	for _, cl := range []*client.Client{cliB, env.Cli} {
		_, err := cl.Admit(env.Ctx(), env.M.Manager, env.Cur, client.NewRunID(), subject)
		if err == nil {
			admitted++
			continue
		}
		harness.WantRefusal(t, err, "permission-denied", "already consumed")
	}
	if admitted != 1 {
		t.Errorf("the witness was admitted %d times through two replicas, want once", admitted)
	}
}
