package harness

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cotal-ai/authplane/admin"
	"github.com/cotal-ai/authplane/internal/testkit"
	"github.com/cotal-ai/authplane/service"
)

// The authplane binary, built once per test run.

var (
	binOnce sync.Once
	binPath string
	binErr  error
	binDir  string
)

// removeBinary removes the binary's directory once every test has run (Main).
func removeBinary() {
	if binDir != "" {
		if err := os.RemoveAll(binDir); err != nil {
			fmt.Fprintf(os.Stderr, "remove %s: %v\n", binDir, err)
		}
	}
}

// AuthplaneBinary builds ./cmd/authplane once, the way the Dockerfile builds it (its
// environment and flags), and returns its path: the binary the tests run is the image's.
func AuthplaneBinary(t testing.TB) string {
	t.Helper()
	binOnce.Do(func() {
		out, err := Output(exec.Command("go", "env", "GOMOD"))
		if err != nil {
			binErr = fmt.Errorf("go env GOMOD: %w", err)
			return
		}
		gomod := strings.TrimSpace(string(out))
		if gomod == "" || gomod == os.DevNull {
			binErr = errors.New("go env GOMOD: not inside the module")
			return
		}
		root := filepath.Dir(gomod)
		env, args, err := DockerfileBuild(filepath.Join(root, "Dockerfile"), nil)
		if err != nil {
			binErr = err
			return
		}
		if binDir, binErr = os.MkdirTemp("", "authplane-bin-"); binErr != nil {
			return
		}
		binPath = filepath.Join(binDir, "authplane")
		for i := range args {
			if i > 0 && args[i-1] == "-o" {
				args[i] = binPath
			}
		}
		cmd := exec.Command("go", args...)
		cmd.Dir = root
		cmd.Env = append(os.Environ(), env...)
		if out, err := CombinedOutput(cmd); err != nil {
			binErr = fmt.Errorf("go %s: %w\n%s", strings.Join(args, " "), err, out)
		}
	})
	if binErr != nil {
		t.Fatal(binErr)
	}
	return binPath
}

// DockerfileBuild reads the Dockerfile's `RUN [VAR=value …] go build … -o PATH ./cmd/authplane`
// and returns its environment and the go command's arguments, with each `${ARG}` of it
// replaced as `docker build` would: by buildArgs[ARG] (a --build-arg), else the default of its
// `ARG NAME=default` line.
func DockerfileBuild(path string, buildArgs map[string]string) (env, args []string, err error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, nil, err
	}
	values := map[string]string{}
	for _, m := range regexp.MustCompile(`(?m)^ARG ([A-Z_]+)=(\S*)$`).FindAllStringSubmatch(string(raw), -1) {
		values[m[1]] = m[2]
	}
	for k, v := range buildArgs {
		values[k] = v
	}
	m := regexp.MustCompile(`(?m)^RUN ((?:[A-Z_]+=\S+ )*)go (build .*-o \S+ \./cmd/authplane)$`).FindSubmatch(raw)
	if m == nil {
		return nil, nil, fmt.Errorf("%s: no `RUN [VAR=value …] go build … -o PATH ./cmd/authplane` line", path)
	}
	var unknown []string
	line := regexp.MustCompile(`\$\{([A-Z_]+)\}`).ReplaceAllStringFunc(string(m[2]), func(ref string) string {
		v, ok := values[ref[2:len(ref)-1]]
		if !ok {
			unknown = append(unknown, ref)
		}
		return v
	})
	if len(unknown) > 0 {
		return nil, nil, fmt.Errorf("%s: the go build line uses %v, which no ARG line declares", path, unknown)
	}
	env = strings.Fields(string(m[1]))
	for _, a := range regexp.MustCompile(`(?:[^\s"]+|"[^"]*")+`).FindAllString(line, -1) {
		args = append(args, strings.ReplaceAll(a, `"`, ""))
	}
	return env, args, nil
}

// SyncBuffer is a bytes.Buffer a running process writes while the test reads.
type SyncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *SyncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *SyncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// Process is a running authplane command.
type Process struct {
	Cmd    *exec.Cmd
	Stdout SyncBuffer
	Stderr SyncBuffer
	Done   chan struct{}
	Err    error
}

// StartAuthplane starts the binary with args; it is killed when the test ends if still running.
func StartAuthplane(t testing.TB, args ...string) *Process {
	t.Helper()
	return StartAuthplaneIn(t, "", args...)
}

// StartAuthplaneIn is startAuthplane with working directory dir ("" = the test's).
func StartAuthplaneIn(t testing.TB, dir string, args ...string) *Process {
	t.Helper()
	return StartAuthplaneEnv(t, dir, nil, args...)
}

// StartAuthplaneEnv is startAuthplaneIn with env (KEY=value) added to the test's environment.
func StartAuthplaneEnv(t testing.TB, dir string, env []string, args ...string) *Process {
	t.Helper()
	p := &Process{Done: make(chan struct{})}
	p.Cmd = exec.Command(AuthplaneBinary(t), args...)
	p.Cmd.Dir = dir
	if env != nil {
		p.Cmd.Env = append(os.Environ(), env...)
	}
	p.Cmd.Stdout = &p.Stdout
	p.Cmd.Stderr = io.MultiWriter(&p.Stderr, logSink())
	if err := Start(p.Cmd); err != nil {
		t.Fatalf("start authplane %v: %v", args, err)
	}
	go func() {
		p.Err = p.Cmd.Wait()
		close(p.Done)
	}()
	t.Cleanup(func() {
		select {
		case <-p.Done:
		default:
			if err := KillGroup(p.Cmd); err != nil {
				t.Error(err)
			}
			<-p.Done
		}
	})
	return p
}

// logSink is where a child's stderr is copied besides the test's buffer.
func logSink() io.Writer {
	if testLogging() {
		return os.Stderr
	}
	return io.Discard
}

// Wait waits up to timeout for the process to exit and returns its exit code.
func (p *Process) Wait(t testing.TB, timeout time.Duration) int {
	t.Helper()
	select {
	case <-p.Done:
	case <-time.After(timeout):
		t.Fatalf("authplane %v still running after %s\nstderr:\n%s", p.Cmd.Args[1:], timeout, p.Stderr.String())
	}
	var exit *exec.ExitError
	switch {
	case p.Err == nil:
		return 0
	case errors.As(p.Err, &exit):
		return exit.ExitCode()
	}
	t.Fatalf("authplane %v: %v", p.Cmd.Args[1:], p.Err)
	return -1
}

// RunAuthplane runs the binary with args to completion and returns its exit code and output.
func RunAuthplane(t testing.TB, timeout time.Duration, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	p := StartAuthplane(t, args...)
	code = p.Wait(t, timeout)
	return code, p.Stdout.String(), p.Stderr.String()
}

// ReadServiceInfo waits until dir holds auth-service.json (the readiness signal) and returns it.
func ReadServiceInfo(t testing.TB, dir string, within time.Duration) admin.ServiceInfo {
	t.Helper()
	var info *admin.ServiceInfo
	testkit.CheckFor(t, within, 25*time.Millisecond, func() error {
		var err error
		info, err = admin.ReadServiceInfo(dir)
		return err
	})
	return *info
}

// WaitReady waits for proc's auth-service.json in dir, failing at once if proc exits first.
func WaitReady(t *testing.T, proc *Process, dir string) admin.ServiceInfo {
	t.Helper()
	var info admin.ServiceInfo
	testkit.CheckFor(t, 30*time.Second, 25*time.Millisecond, func() error {
		select {
		case <-proc.Done:
			t.Fatalf("authplane %v exited before it was ready: %v\nstderr:\n%s", proc.Cmd.Args[1:], proc.Err, proc.Stderr.String())
		default:
		}
		raw, err := os.ReadFile(filepath.Join(dir, admin.ServiceInfoFile))
		if err != nil {
			return err
		}
		return json.Unmarshal(raw, &info)
	})
	return info
}

// BinaryPlane is what tests reach of a plane the binary runs: its broker and its space
// material, as auth-service.json names them.
func BinaryPlane(t *testing.T, info admin.ServiceInfo) *TestPlane {
	t.Helper()
	keys, err := (admin.Locate{SpaceDir: info.SpaceDir}).Keys()
	if err != nil {
		t.Fatal(err)
	}
	return &TestPlane{Info: service.Info{NATSURL: info.NATSURL, HTTPURL: info.URL, SpaceDir: info.SpaceDir}, keys: keys, t: t}
}
