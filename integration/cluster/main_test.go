// Package cluster tests the plane on three-node clusters: losing a node, the meta leader or the
// KV leader, and an end or a witness replicated across the nodes.
package cluster

import (
	"testing"

	"github.com/cotal-ai/authplane/integration/internal/harness"
)

func TestMain(m *testing.M) { harness.Main(m) }
