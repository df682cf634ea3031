package cluster

import (
	"testing"

	"github.com/cotal-ai/authplane/integration/internal/harness"
	"github.com/cotal-ai/authplane/internal/testkit"
)

// TestAnEmergencyRotationKillsEveryCredentialOfTheOldKeysOnEveryServer is the emergency
// rotation on a three-node cluster (harness.Emergency): a manager's duties and an agent hold
// live connections on every server; the rotation is confirmed by all three, closes every one
// of them, and every old credential is refused at connect on each server.
func TestAnEmergencyRotationKillsEveryCredentialOfTheOldKeysOnEveryServer(t *testing.T) {
	harness.Long(t, "a three-node cluster")
	t.Parallel()
	c := startCluster(t, harness.TestSpace, 3)
	p := harness.StartFacesPlane(t, testkit.NewIdP(t), againstCluster(c))
	harness.Emergency(t, p, []string{c.URL(0), c.URL(1), c.URL(2)})
}
