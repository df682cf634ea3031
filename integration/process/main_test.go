// Package process tests the authplane binary as an operator runs it: serve, init, creds, wait,
// stop, version and bench, its configuration, signals and drain, and a plane's start, identity
// and fencing.
package process

import (
	"testing"

	"github.com/cotal-ai/authplane/integration/internal/harness"
)

func TestMain(m *testing.M) { harness.Main(m) }
