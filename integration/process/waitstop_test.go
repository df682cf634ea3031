package process

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cotal-ai/authplane/integration/internal/harness"
	"github.com/cotal-ai/authplane/internal/capability/instance"
)

// TestWaitReturnsOnceThePlaneIsHealthyAndStopReturnsOnceItHasExited runs what the documents'
// blocks lean on: `authplane wait` started before the plane returns only once /health says ok,
// with that answer; `authplane stop` returns only once the plane has exited (exit 0, its lock
// free), and says so; a second stop, or a wait on a directory no plane runs on, says there is
// none.
func TestWaitReturnsOnceThePlaneIsHealthyAndStopReturnsOnceItHasExited(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	state := filepath.Join(dir, ".authplane")
	waiting := harness.StartAuthplaneIn(t, dir, "wait", "--timeout", "60s")
	plane := harness.StartAuthplaneIn(t, dir, "--nats-port", "0", "--http-port", "0")
	if code := waiting.Wait(t, 70*time.Second); code != 0 {
		t.Fatalf("wait: exit %d\n%s", code, waiting.Stderr.String())
	}
	var health struct {
		OK     bool   `json:"ok"`
		Issuer string `json:"issuer"`
	}
	if err := json.Unmarshal([]byte(waiting.Stdout.String()), &health); err != nil || !health.OK {
		t.Fatalf("wait printed %q (%v), want the health answer ok", waiting.Stdout.String(), err)
	}
	if _, err := os.Stat(filepath.Join(state, "auth-service.json")); err != nil {
		t.Errorf("wait returned and the plane is not ready: %v", err)
	}

	code, out, errOut := runAuthplaneIn(t, dir, time.Minute, "stop")
	if code != 0 || !strings.Contains(out, "stopped the plane of .authplane") {
		t.Fatalf("stop: exit %d, %q %q", code, out, errOut)
	}
	// Exited: reaped already, or a zombie that this test's own Wait is about to reap.
	if stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", plane.Cmd.Process.Pid)); err == nil {
		if i := bytes.LastIndexByte(stat, ')'); i < 0 || i+2 >= len(stat) || stat[i+2] != 'Z' {
			t.Fatalf("stop returned while the plane still runs: %s", stat)
		}
	}
	if code := plane.Wait(t, time.Second); code != 0 {
		t.Errorf("the stopped plane exited %d, want 0 (a drain)", code)
	}
	if _, held, err := instance.Holder(state); err != nil || held {
		t.Errorf("after stop: lock held %v (%v), want it free", held, err)
	}
	// A stop that stops nothing says so and fails.
	if code, out, errOut := runAuthplaneIn(t, dir, time.Minute, "stop"); code != 1 || out != "" || !strings.Contains(errOut, "no plane runs on the state directory .authplane: nothing was stopped") {
		t.Errorf("a second stop: exit %d, stdout %q, stderr %q; want 1 and that none runs", code, out, errOut)
	}
	if code, _, errOut := runAuthplaneIn(t, dir, time.Minute, "wait", "--timeout", "300ms"); code != 1 || !strings.Contains(errOut, "not ready") {
		t.Errorf("wait with no plane: exit %d %q, want 1 and why it is not ready", code, errOut)
	}
}

// runAuthplaneIn runs the binary with args in dir to completion.
func runAuthplaneIn(t testing.TB, dir string, timeout time.Duration, args ...string) (int, string, string) {
	t.Helper()
	p := harness.StartAuthplaneIn(t, dir, args...)
	code := p.Wait(t, timeout)
	return code, p.Stdout.String(), p.Stderr.String()
}
