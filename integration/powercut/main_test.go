// Package powercut proves that a power cut takes back nothing the plane acknowledged: the plane
// runs as a process (and, on a cluster, each nats-server too) with its state on a power-cut
// file system (internal/powercut), under a mixed load from this process that logs every
// acknowledgement outside the mount; the power is cut at a random moment, everything is
// restarted on what the disk kept, and every acknowledged write is looked for.
package powercut

import (
	"testing"

	"github.com/cotal-ai/authplane/integration/internal/harness"
)

func TestMain(m *testing.M) { harness.Main(m) }
