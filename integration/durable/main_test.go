// Package durable tests what an OS crash, a power cut or a lost store may take from the plane:
// every server syncs every write before the plane counts on it, and a plane never serves on
// stores that lost what it wrote.
package durable

import (
	"testing"

	"github.com/cotal-ai/authplane/integration/internal/harness"
)

func TestMain(m *testing.M) { harness.Main(m) }
