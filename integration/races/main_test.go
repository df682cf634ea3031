// Package races tests the fences under contention: renewals racing re-registrations,
// revocations and ends on one or two replicas, a noisy owner, and crashes between an end's
// steps. An invariant checker reads the stores afterwards.
package races

import (
	"testing"

	"github.com/cotal-ai/authplane/integration/internal/harness"
)

func TestMain(m *testing.M) { harness.Main(m) }
