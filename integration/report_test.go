package integration

import (
	"fmt"
	"os"
	"sync"
	"testing"
)

// reportMu serializes the reports of tests that run in parallel.
var reportMu sync.Mutex

// report logs what a race or a fault test counted, and also appends it, under the test's
// name, to the file AUTHPLANE_TEST_REPORT names: `go test ./...` hides a passing test's log,
// and .ci/run prints that file after the tests, so every run shows its counts.
func report(t testing.TB, format string, args ...any) {
	t.Helper()
	line := fmt.Sprintf(format, args...)
	t.Log(line)
	path := os.Getenv("AUTHPLANE_TEST_REPORT")
	if path == "" {
		return
	}
	reportMu.Lock()
	defer reportMu.Unlock()
	f, err := os.OpenFile(path, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o600)
	if err != nil {
		t.Fatalf("the test report %s: %v", path, err)
	}
	_, werr := fmt.Fprintf(f, "%s:\n%s\n", t.Name(), line)
	if err := f.Close(); werr == nil {
		werr = err
	}
	if werr != nil {
		t.Fatalf("the test report %s: %v", path, werr)
	}
}
