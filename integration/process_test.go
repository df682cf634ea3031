package integration

import (
	"bytes"
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
)

// The authplane binary, built once per test run.

var (
	binOnce sync.Once
	binPath string
	binErr  error
	binDir  string
)

// removeBinary removes the binary's directory once every test has run (TestMain).
func removeBinary() {
	if binDir != "" {
		if err := os.RemoveAll(binDir); err != nil {
			fmt.Fprintf(os.Stderr, "remove %s: %v\n", binDir, err)
		}
	}
}

// authplaneBinary builds ./cmd/authplane once, the way the Dockerfile builds it (its
// environment and flags), and returns its path: the binary the tests run is the image's.
func authplaneBinary(t testing.TB) string {
	t.Helper()
	binOnce.Do(func() {
		out, err := exec.Command("go", "env", "GOMOD").Output()
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
		env, args, err := dockerfileBuild(filepath.Join(root, "Dockerfile"), nil)
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
		if out, err := cmd.CombinedOutput(); err != nil {
			binErr = fmt.Errorf("go %s: %w\n%s", strings.Join(args, " "), err, out)
		}
	})
	if binErr != nil {
		t.Fatal(binErr)
	}
	return binPath
}

// dockerfileBuild reads the Dockerfile's `RUN [VAR=value …] go build … -o PATH ./cmd/authplane`
// and returns its environment and the go command's arguments, with each `${ARG}` of it
// replaced as `docker build` would: by buildArgs[ARG] (a --build-arg), else the default of its
// `ARG NAME=default` line.
func dockerfileBuild(path string, buildArgs map[string]string) (env, args []string, err error) {
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

// syncBuffer is a bytes.Buffer a running process writes while the test reads.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// process is a running authplane command.
type process struct {
	cmd    *exec.Cmd
	stdout syncBuffer
	stderr syncBuffer
	done   chan struct{}
	err    error
}

// startAuthplane starts the binary with args; it is killed when the test ends if still running.
func startAuthplane(t testing.TB, args ...string) *process {
	t.Helper()
	return startAuthplaneIn(t, "", args...)
}

// startAuthplaneIn is startAuthplane with working directory dir ("" = the test's).
func startAuthplaneIn(t testing.TB, dir string, args ...string) *process {
	t.Helper()
	return startAuthplaneEnv(t, dir, nil, args...)
}

// startAuthplaneEnv is startAuthplaneIn with env (KEY=value) added to the test's environment.
func startAuthplaneEnv(t testing.TB, dir string, env []string, args ...string) *process {
	t.Helper()
	p := &process{done: make(chan struct{})}
	p.cmd = exec.Command(authplaneBinary(t), args...)
	p.cmd.Dir = dir
	if env != nil {
		p.cmd.Env = append(os.Environ(), env...)
	}
	p.cmd.Stdout = &p.stdout
	p.cmd.Stderr = io.MultiWriter(&p.stderr, logSink())
	if err := p.cmd.Start(); err != nil {
		t.Fatalf("start authplane %v: %v", args, err)
	}
	go func() {
		p.err = p.cmd.Wait()
		close(p.done)
	}()
	t.Cleanup(func() {
		select {
		case <-p.done:
		default:
			if err := p.cmd.Process.Kill(); err != nil {
				t.Errorf("kill authplane %v: %v", args, err)
			}
			<-p.done
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

// wait waits up to timeout for the process to exit and returns its exit code.
func (p *process) wait(t testing.TB, timeout time.Duration) int {
	t.Helper()
	select {
	case <-p.done:
	case <-time.After(timeout):
		t.Fatalf("authplane %v still running after %s\nstderr:\n%s", p.cmd.Args[1:], timeout, p.stderr.String())
	}
	var exit *exec.ExitError
	switch {
	case p.err == nil:
		return 0
	case errors.As(p.err, &exit):
		return exit.ExitCode()
	}
	t.Fatalf("authplane %v: %v", p.cmd.Args[1:], p.err)
	return -1
}

// runAuthplane runs the binary with args to completion and returns its exit code and output.
func runAuthplane(t testing.TB, timeout time.Duration, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	p := startAuthplane(t, args...)
	code = p.wait(t, timeout)
	return code, p.stdout.String(), p.stderr.String()
}

// readServiceInfo waits until dir holds auth-service.json (the readiness signal) and returns it.
func readServiceInfo(t testing.TB, dir string, within time.Duration) admin.ServiceInfo {
	t.Helper()
	var info *admin.ServiceInfo
	checkFor(t, within, 25*time.Millisecond, func() error {
		var err error
		info, err = admin.ReadServiceInfo(dir)
		return err
	})
	return *info
}
