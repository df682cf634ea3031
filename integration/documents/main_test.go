// Package documents holds the documents to the code: every sh block of README.md and docs/ runs
// as pasted in a fresh clone, every refusal code and example of docs/PROTOCOL.md is the
// plane's, and the compose file and image build as described.
package documents

import (
	"path/filepath"
	"testing"

	"github.com/cotal-ai/authplane/integration/internal/harness"
)

func TestMain(m *testing.M) { harness.Main(m) }

// repoRoot is the repository's root, relative to this package's directory (go test's working
// directory).
var repoRoot = filepath.Join("..", "..")
