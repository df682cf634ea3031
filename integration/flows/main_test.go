// Package flows tests the manager, run and supervisor flows through the client, each refusal
// with its code and what it left unwritten, the revocation set and the witness.
package flows

import (
	"testing"

	"github.com/cotal-ai/authplane/integration/internal/harness"
)

func TestMain(m *testing.M) { harness.Main(m) }
