package races

import (
	"testing"

	"github.com/cotal-ai/authplane/integration/internal/harness"
	"github.com/cotal-ai/authplane/subjects"
)

// gateRevision is the KV revision of the manager gate of iid.
func gateRevision(t testing.TB, p *harness.TestPlane, iid string) uint64 {
	t.Helper()
	m, err := harness.FenceEntry(t, p, subjects.GateKey(subjects.GateEndpointManager, iid))
	if err != nil {
		t.Fatalf("read gate of %s: %v", iid, err)
	}
	return m.Sequence
}
