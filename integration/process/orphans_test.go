package process

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/cotal-ai/authplane/integration/internal/harness"
	"github.com/cotal-ai/authplane/internal/testkit"
)

// victimEnv runs TestAKilledTestBinaryLeavesNothingBehind as the victim: it starts what a test
// starts, writes what it started to the file this variable names, and waits to be killed.
const victimEnv = "AUTHPLANE_TEST_VICTIM"

// victimReport is what the victim started: the processes, the ports they listen on, its
// run's mark and its temp folder.
type victimReport struct {
	Mark  string         `json:"mark"`
	Tmp   string         `json:"tmp"`
	PIDs  map[string]int `json:"pids"`
	Ports map[string]int `json:"ports"`
}

// A test binary killed mid-test (SIGKILL: no cleanup, no deferred call, no TestMain epilogue)
// leaves nothing behind: the in-process plane and nats-server go with it, the authplane binary
// it ran, a shell, and what the shell started in the background (go run's authplane, its go
// command, a nats-server binary) are killed, no process carries the run's mark, every port is
// closed, and the run's temp folder is gone.
func TestAKilledTestBinaryLeavesNothingBehind(t *testing.T) {
	if path := os.Getenv(victimEnv); path != "" {
		victim(t, path)
		return
	}
	t.Parallel()
	reportPath := filepath.Join(t.TempDir(), "victim.json")
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	cmd := exec.Command(self, "-test.run", "^"+t.Name()+"$", "-test.v", "-test.timeout", "5m")
	cmd.Env = append(os.Environ(), victimEnv+"="+reportPath)
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := harness.Start(cmd); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() {
		if err := harness.KillGroup(cmd); err != nil {
			t.Error(err)
		}
	})
	var r victimReport
	testkit.CheckFor(t, 3*time.Minute, 50*time.Millisecond, func() error {
		select {
		case err := <-exited:
			t.Fatalf("the victim exited before it was killed: %v\n%s", err, out.String())
		default:
		}
		raw, err := os.ReadFile(reportPath)
		if err != nil {
			return err
		}
		return json.Unmarshal(raw, &r)
	})
	// What is checked gone below is there first: four processes and seven ports, and the
	// nats-server binary's one of each where it is installed (a fresh machine has none).
	wantPIDs, wantPorts := 4, 7
	if _, ok := r.PIDs["nats-server binary"]; ok {
		wantPIDs, wantPorts = wantPIDs+1, wantPorts+1
	}
	if len(r.PIDs) != wantPIDs || len(r.Ports) != wantPorts {
		t.Fatalf("the victim started %v listening on %v; want %d processes and %d ports", r.PIDs, r.Ports, wantPIDs, wantPorts)
	}
	for name, pid := range r.PIDs {
		if !harness.Alive(pid) {
			t.Fatalf("before the kill: %s (pid %d) is not running", name, pid)
		}
	}
	for name, port := range r.Ports {
		if !listening(port) {
			t.Fatalf("before the kill: nothing listens on %s's port %d", name, port)
		}
	}
	if fi, err := os.Stat(r.Tmp); err != nil || !fi.IsDir() {
		t.Fatalf("before the kill: the victim's temp folder %s: %v", r.Tmp, err)
	}

	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	if err := <-exited; err == nil {
		t.Fatal("the victim exited 0 after a SIGKILL")
	}
	testkit.CheckFor(t, 30*time.Second, 50*time.Millisecond, func() error {
		for name, pid := range r.PIDs {
			if harness.Alive(pid) {
				return fmt.Errorf("%s (pid %d) outlived the test binary", name, pid)
			}
		}
		if left := harness.Marked(r.Mark); len(left) > 0 {
			return fmt.Errorf("processes %v carry the killed run's mark", left)
		}
		for name, port := range r.Ports {
			if listening(port) {
				return fmt.Errorf("%s's port %d still accepts connections", name, port)
			}
		}
		if _, err := os.Stat(r.Tmp); !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("the victim's temp folder %s is still there (%v)", r.Tmp, err)
		}
		return nil
	})
}

// victim starts a plane and a nats-server in process, the authplane binary, and a shell that
// starts a plane with go run and a nats-server binary in the background, as the documents'
// blocks do; it reports them to path and waits to be killed.
func victim(t *testing.T, path string) {
	r := victimReport{Mark: os.Getenv(harness.MarkEnv), Tmp: os.TempDir(), PIDs: map[string]int{}, Ports: map[string]int{}}
	p := harness.StartPlane(t, nil)
	r.Ports["in-process plane broker"] = portOf(t, p.NATSURL())
	r.Ports["in-process plane HTTP"] = portOf(t, p.HTTPURL())
	s := harness.StartStandalone(t, harness.TestSpace)
	r.Ports["in-process nats-server"] = portOf(t, s.URL())

	dir := t.TempDir()
	bin := harness.StartAuthplane(t, "serve", "--dir", dir, "--nats-port", "0", "--http-port", "0", "--workers", "1")
	info := harness.WaitReady(t, bin, dir)
	r.PIDs["authplane binary"] = bin.Cmd.Process.Pid
	r.Ports["authplane binary broker"] = portOf(t, info.NATSURL)
	r.Ports["authplane binary HTTP"] = portOf(t, info.URL)

	// The shell: go run of the plane (go, then its authplane child) and a nats-server binary,
	// both in the background, as README's blocks start them.
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	runDir, pids := t.TempDir(), t.TempDir()
	script := `set -e
go run ./cmd/authplane serve --dir "$RUN_DIR" --nats-port 0 --http-port 0 --workers 1 >/dev/null 2>&1 &
echo $! > "$PIDS/go"
if [ -n "$NATS_SERVER_PORT" ]; then
  nats-server -a 127.0.0.1 -p "$NATS_SERVER_PORT" >/dev/null 2>&1 &
  echo $! > "$PIDS/nats-server"
fi
wait`
	natsPort := ""
	if _, err := exec.LookPath("nats-server"); err == nil {
		natsPort = strconv.Itoa(harness.FreePorts(t, 1)[0])
	} else if os.Getenv("AUTHPLANE_REQUIRE_TOOLS") != "" {
		t.Fatal("nats-server is not on PATH")
	}
	sh := exec.Command("bash", "-c", script)
	sh.Dir = root
	// The blocks' build: the binary harness built compiled it, so go run only links.
	sh.Env = append(os.Environ(), "RUN_DIR="+runDir, "PIDS="+pids, "NATS_SERVER_PORT="+natsPort,
		"CGO_ENABLED=0", "GOFLAGS=-trimpath -mod=readonly")
	if err := harness.Start(sh); err != nil {
		t.Fatal(err)
	}
	r.PIDs["shell"] = sh.Process.Pid
	run := harness.ReadServiceInfo(t, runDir, 2*time.Minute)
	r.PIDs["go run's authplane"] = run.PID
	r.Ports["go run's authplane broker"] = portOf(t, run.NATSURL)
	r.Ports["go run's authplane HTTP"] = portOf(t, run.URL)
	r.PIDs["go run"] = pidIn(t, filepath.Join(pids, "go"))
	if natsPort != "" {
		r.PIDs["nats-server binary"] = pidIn(t, filepath.Join(pids, "nats-server"))
		port, _ := strconv.Atoi(natsPort)
		r.Ports["nats-server binary"] = port
		testkit.CheckFor(t, 30*time.Second, 50*time.Millisecond, func() error {
			if !listening(port) {
				return fmt.Errorf("the nats-server binary does not listen on %d yet", port)
			}
			return nil
		})
	}

	raw, err := json.Marshal(r)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path+".tmp", raw, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(path+".tmp", path); err != nil {
		t.Fatal(err)
	}
	select {} // until the kill, which is the test (-test.timeout ends a victim left alone)
}

// portOf is the port of a nats:// or http:// URL.
func portOf(t *testing.T, raw string) int {
	t.Helper()
	u, err := url.Parse(raw)
	if err != nil {
		t.Fatal(err)
	}
	port, err := strconv.Atoi(u.Port())
	if err != nil {
		t.Fatalf("the port of %s: %v", raw, err)
	}
	return port
}

// pidIn reads the pid a shell wrote to path.
func pidIn(t *testing.T, path string) int {
	t.Helper()
	var pid int
	testkit.CheckFor(t, 10*time.Second, 20*time.Millisecond, func() error {
		raw, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		pid, err = strconv.Atoi(string(bytes.TrimSpace(raw)))
		return err
	})
	return pid
}

// listening reports whether something accepts connections on 127.0.0.1:port.
func listening(port int) bool {
	c, err := net.DialTimeout("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), time.Second)
	if err != nil {
		return false
	}
	_ = c.Close()
	return true
}
