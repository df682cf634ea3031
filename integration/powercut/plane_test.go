package powercut

import (
	"errors"
	"fmt"
	"io"
	mrand "math/rand/v2"
	"net/http"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/cotal-ai/authplane/admin"
	"github.com/cotal-ai/authplane/integration/internal/harness"
	"github.com/cotal-ai/authplane/internal/powercut"
	"github.com/cotal-ai/authplane/internal/testkit"
)

// planeProcess is an `authplane serve` process whose state directory (its lock, identity and
// space material, and the embedded broker's store) is on a power-cut mount of backing. The
// binary itself is outside the mount, and the process does not start with its working
// directory inside it (internal/powercut's doc says why).
type planeProcess struct {
	backing string
	// args are the flags after `serve --dir`.
	args []string
	fs   *powercut.FS
	proc *harness.Process
	info admin.ServiceInfo
}

// errStart is a plane that did not serve again after a restart: a finding, not a test error.
var errStart = errors.New("the plane did not serve")

// start mounts the disk and starts the plane on it, and waits until it serves (/health ok).
// A plane that exits or does not serve within startWithin returns errStart with its log.
func (pp *planeProcess) start(t *testing.T) error {
	t.Helper()
	pp.fs = powercut.Mount(t, pp.backing)
	dir := pp.dir()
	pp.proc = harness.StartAuthplane(t, append([]string{"serve", "--dir", dir}, pp.args...)...)
	if err := pp.fs.Track(pp.proc.Cmd.Process.Pid); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(testkit.Stretched(startWithin))
	var last error
	for time.Now().Before(deadline) {
		select {
		case <-pp.proc.Done:
			return fmt.Errorf("%w: it exited (%v):\n%s", errStart, pp.proc.Err, tail(pp.proc.Stderr.String(), 20))
		default:
		}
		if last = pp.ready(dir); last == nil {
			return nil
		}
		time.Sleep(50 * time.Millisecond)
	}
	return fmt.Errorf("%w within %s: %v\n%s", errStart, testkit.Stretched(startWithin), last, tail(pp.proc.Stderr.String(), 20))
}

// startWithin bounds a start on a quiet machine: a restart recovers every stream from the cut
// disk first, and a node cut alone catches up with the meta leader. testkit.Stretched widens it
// on a loaded one: under the race detector at load 20 a node cut alone was not current in 90 s.
const startWithin = 90 * time.Second

// dir is the plane's state directory on the current mount.
func (pp *planeProcess) dir() string { return filepath.Join(pp.fs.Dir(), "state") }

// ready reads auth-service.json (a restart finds the last one's there until it writes its own)
// and asks /health.
func (pp *planeProcess) ready(dir string) error {
	info, err := admin.ReadServiceInfo(dir)
	if err != nil {
		return err
	}
	if info.PID != pp.proc.Cmd.Process.Pid {
		return fmt.Errorf("auth-service.json names pid %d, want %d", info.PID, pp.proc.Cmd.Process.Pid)
	}
	resp, err := http.Get(info.URL + "/health")
	if err != nil {
		return err
	}
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		return err
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET /health: %d %s", resp.StatusCode, body)
	}
	pp.info = *info
	return nil
}

// cut cuts the power of the plane's disk: the process is stopped, what it did not sync is
// thrown away, and it is killed.
func (pp *planeProcess) cut(t *testing.T) {
	t.Helper()
	if err := pp.fs.Cut(); err != nil {
		t.Fatalf("cut: %v", err)
	}
	select {
	case <-pp.proc.Done:
	case <-time.After(10 * time.Second):
		t.Fatal("the plane outlived the cut by 10 s")
	}
}

// stop stops the plane with SIGTERM and unmounts its disk cleanly.
func (pp *planeProcess) stop(t *testing.T) {
	t.Helper()
	if pp.proc != nil {
		select {
		case <-pp.proc.Done:
		default:
			if err := pp.proc.Cmd.Process.Signal(syscall.SIGTERM); err != nil {
				t.Error(err)
			}
			pp.proc.Wait(t, 30*time.Second)
		}
	}
	if pp.fs != nil {
		if err := pp.fs.Close(); err != nil {
			t.Error(err)
		}
	}
}

// tail is the last n lines of s.
func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// The flags the binary knows, read once from `authplane serve -h`.
var (
	flagsOnce sync.Once
	flagsHelp string
)

// knowsFlag says whether `authplane serve` has the flag name.
func knowsFlag(t *testing.T, name string) bool {
	t.Helper()
	flagsOnce.Do(func() {
		out, _ := harness.CombinedOutput(exec.Command(harness.AuthplaneBinary(t), "serve", "-h"))
		flagsHelp = string(out)
	})
	return regexp.MustCompile(`(?m)^\s+-` + regexp.QuoteMeta(name) + `\b`).MatchString(flagsHelp)
}

// embedded is a plane with its embedded broker, all on one disk: a cut takes both.
type embedded struct {
	*planeProcess
	port int // the broker's client port, kept across restarts for the prober
}

// startEmbedded starts a plane with its embedded broker on a fresh disk. Settled stops it
// cleanly once first and starts it again: what the first start created is then on the disk,
// whether the server syncs or not.
func startEmbedded(unsynced, settled bool) func(t *testing.T) system {
	return func(t *testing.T) system {
		t.Helper()
		e := &embedded{port: harness.FreePorts(t, 1)[0]}
		e.planeProcess = &planeProcess{backing: t.TempDir(), args: append(planeArgs(t, unsynced), "--nats-port", strconv.Itoa(e.port))}
		if err := e.start(t); err != nil {
			t.Fatalf("the plane's first start: %v", err)
		}
		if settled {
			e.stop(t)
			if err := e.start(t); err != nil {
				t.Fatalf("the plane's start after a clean stop: %v", err)
			}
		}
		return e
	}
}

func (e *embedded) target(t *testing.T) target {
	t.Helper()
	keys, err := (admin.Locate{SpaceDir: e.info.SpaceDir}).Keys()
	if err != nil {
		t.Fatal(err)
	}
	return target{url: e.info.NATSURL, servers: []string{e.info.NATSURL}, keys: keys, spaceDir: e.info.SpaceDir, http: e.info.URL, cap: e.info.Cap}
}

func (e *embedded) loadGoesOn() bool { return false }

func (e *embedded) cut(t *testing.T, _ *mrand.Rand) string {
	t.Helper()
	e.planeProcess.cut(t)
	return fmt.Sprintf("nats://127.0.0.1:%d", e.port)
}

func (e *embedded) restart(t *testing.T) error {
	t.Helper()
	return e.start(t)
}

// planeArgs are the flags of a plane under the load: free ports, and budgets past what one owner
// of the load needs (they are not what is tested here). Unsynced accepts servers that do not
// sync every write, and runs the embedded one so (before the flag existed, the plane never
// synced).
func planeArgs(t *testing.T, unsynced bool) []string {
	t.Helper()
	args := []string{"--http-port", "0", "--workers", "4", "--rate", "0",
		"--max-instances-per-owner", "10000", "--new-keys-per-owner", "10000000",
		"--reregistrations-per-instance", "1000000", "--reregistrations-per-owner", "1000000"}
	if unsynced && knowsFlag(t, "allow-unsynced") {
		args = append(args, "--allow-unsynced")
	}
	return args
}
