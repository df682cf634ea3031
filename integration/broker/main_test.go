// Package broker tests what the broker enforces on the credentials the plane mints:
// confinement, expiry, limits, the auth callout, the auditor's read-only view and the plane's
// own users.
package broker

import (
	"testing"

	"github.com/cotal-ai/authplane/integration/internal/harness"
)

func TestMain(m *testing.M) { harness.Main(m) }
