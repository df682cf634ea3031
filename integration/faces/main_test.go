// Package faces tests the HTTP faces (exchange, JWKS, discovery, health), their budgets against
// hostile peers, the metrics, the logs and the micro discovery.
package faces

import (
	"testing"

	"github.com/cotal-ai/authplane/integration/internal/harness"
)

func TestMain(m *testing.M) { harness.Main(m) }
