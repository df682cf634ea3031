package harness

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// What a test starts dies with the test binary, even when the binary dies by a timeout's panic
// or SIGKILL, where no t.Cleanup runs. Two things see to it:
//
//   - Every child a test starts through Start (or Output, CombinedOutput, Run) gets
//     Pdeathsig=SIGKILL and a process group of its own. Pdeathsig fires when the OS thread that
//     forked the child exits, so every child is forked from one goroutine locked to its thread
//     for the binary's life.
//   - Main starts a guardian beside the test binary (the same binary, re-run): it holds the
//     read end of a pipe the test binary writes nothing to, and when the pipe closes (the test
//     binary is gone, however it ended) it kills every process that carries this run's mark in
//     its environment (grandchildren too: a shell's background jobs, go run's binary,
//     nats-server) and removes the run's temp folder. Every child inherits the mark and the
//     temp folder (TMPDIR), so t.TempDir, a block's mktemp and go run's work all go there.

const (
	// MarkEnv names the environment variable that marks a test binary's descendants; its
	// value is the run's random token. A test that passes a child a cleaned environment keeps it.
	MarkEnv = "AUTHPLANE_TEST_RUN"
	// guardianMode runs the binary as a guardian of the run in MarkEnv, whose temp folder it
	// names.
	guardianMode = "AUTHPLANE_TEST_GUARDIAN"
)

// Main runs a test package's tests (call it from TestMain), with a guardian that kills what
// they started if the binary dies, then removes the binary AuthplaneBinary built and the run's
// temp folder. Run as a guardian, it guards instead.
func Main(m *testing.M) {
	if tmp := os.Getenv(guardianMode); tmp != "" {
		guard(os.Getenv(MarkEnv), tmp)
		return
	}
	stop, err := startGuardian()
	if err != nil {
		fmt.Fprintf(os.Stderr, "the tests' guardian: %v\n", err)
		os.Exit(2)
	}
	shortParallel()
	code := m.Run()
	removeBinary()
	stop()
	os.Exit(code)
}

// ShortParallel is how many tests of a package the fast tier (-short) runs at once unless
// -parallel says otherwise. Its tests mostly wait, not compute (an account is signed at most
// once a second, a broker expires a credential on the second), so GOMAXPROCS at once, go
// test's default, leaves two cores idle most of the run: 8 took the flows package from 84 s
// to 27 s on two quiet cores. The default tier keeps go test's default: its race-volume and
// power-cut tests do compute.
const ShortParallel = 8

func shortParallel() {
	flag.Parse()
	given := false
	flag.Visit(func(f *flag.Flag) { given = given || f.Name == "test.parallel" })
	if testing.Short() && !given {
		if err := flag.Set("test.parallel", strconv.Itoa(ShortParallel)); err != nil {
			fmt.Fprintf(os.Stderr, "the fast tier's parallelism: %v\n", err)
		}
	}
}

// startGuardian gives the run a mark and a temp folder of its own and starts its guardian;
// stop ends the guardian's watch (it sweeps, then exits) and waits for it.
func startGuardian() (stop func(), err error) {
	token := make([]byte, 12)
	if _, err := rand.Read(token); err != nil {
		return nil, err
	}
	tmp, err := os.MkdirTemp("", "authplane-test-")
	if err != nil {
		return nil, err
	}
	// Others may pass through, as through /tmp, not list it: a test runs the binary as another
	// user from a folder of its own in here.
	if err := os.Chmod(tmp, 0o711); err != nil {
		return nil, err
	}
	if err := os.Setenv("TMPDIR", tmp); err != nil {
		return nil, err
	}
	if err := os.Setenv(MarkEnv, hex.EncodeToString(token)); err != nil {
		return nil, err
	}
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	r, w, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	g := exec.Command(self)
	g.Env = append(os.Environ(), guardianMode+"="+tmp)
	g.Stdin, g.Stdout, g.Stderr = r, nil, os.Stderr
	// A group of its own: a ^C to the test's group does not end the guardian before its sweep.
	g.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := g.Start(); err != nil {
		return nil, err
	}
	if err := r.Close(); err != nil {
		return nil, err
	}
	return func() {
		if err := w.Close(); err != nil {
			fmt.Fprintf(os.Stderr, "the tests' guardian: %v\n", err)
		}
		if err := g.Wait(); err != nil {
			fmt.Fprintf(os.Stderr, "the tests' guardian: %v\n", err)
		}
	}, nil
}

// guard waits for its stdin to close (the test binary ended), kills every process marked
// with token, and removes tmp.
func guard(token, tmp string) {
	signal.Ignore(syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP, syscall.SIGQUIT)
	_, _ = io.Copy(io.Discard, os.Stdin)
	if left := Sweep(token, 10*time.Second); len(left) > 0 {
		fmt.Fprintf(os.Stderr, "the tests' guardian: processes %v outlived their kill\n", left)
	}
	if err := os.RemoveAll(tmp); err != nil {
		fmt.Fprintf(os.Stderr, "the tests' guardian: %v\n", err)
	}
	os.Exit(0)
}

// Sweep SIGKILLs every process but the caller whose environment carries MarkEnv=token, until
// none is left or within has passed, and returns those left.
func Sweep(token string, within time.Duration) []int {
	deadline := time.Now().Add(within)
	for {
		left := Marked(token)
		if len(left) == 0 || time.Now().After(deadline) {
			return left
		}
		for _, pid := range left {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Marked lists the live processes but the caller whose environment carries MarkEnv=token (a
// zombie, dead and not yet reaped, is not live).
func Marked(token string) []int {
	want := []byte(MarkEnv + "=" + token)
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	var out []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == os.Getpid() {
			continue
		}
		env, err := os.ReadFile(filepath.Join("/proc", e.Name(), "environ"))
		if err != nil || !bytes.Contains(append(append([]byte{0}, env...), 0), append(append([]byte{0}, want...), 0)) {
			continue
		}
		if Alive(pid) {
			out = append(out, pid)
		}
	}
	return out
}

// Alive reports whether process pid exists and is not a zombie.
func Alive(pid int) bool {
	stat, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
	if err != nil {
		return false
	}
	// pid (comm) state …: comm may hold spaces and parentheses, the state follows the last ')'.
	i := bytes.LastIndexByte(stat, ')')
	return i < 0 || i+2 >= len(stat) || stat[i+2] != 'Z'
}

// The one goroutine every child is forked from, locked to its thread for the binary's life.
var (
	spawnOnce sync.Once
	spawns    = make(chan spawnReq)
)

type spawnReq struct {
	cmd  *exec.Cmd
	done chan error
}

// Start starts cmd as a child that dies with the test binary: SIGKILL on the binary's death
// (Pdeathsig) and a process group of its own, so a cleanup can kill it with everything it
// started (KillGroup).
func Start(cmd *exec.Cmd) error {
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.Pdeathsig = syscall.SIGKILL
	cmd.SysProcAttr.Setpgid = true
	spawnOnce.Do(func() {
		go func() {
			runtime.LockOSThread() // never unlocked: the thread lives as long as the binary
			for req := range spawns {
				req.done <- req.cmd.Start()
			}
		}()
	})
	req := spawnReq{cmd: cmd, done: make(chan error, 1)}
	spawns <- req
	return <-req.done
}

// Run is cmd.Run started by Start.
func Run(cmd *exec.Cmd) error {
	if err := Start(cmd); err != nil {
		return err
	}
	return cmd.Wait()
}

// Output is cmd.Output started by Start: its stdout, and its stderr in the error.
func Output(cmd *exec.Cmd) ([]byte, error) {
	var stdout, stderr bytes.Buffer
	cmd.Stdout = &stdout
	if cmd.Stderr == nil {
		cmd.Stderr = &stderr
	}
	err := Run(cmd)
	var exit *exec.ExitError
	if errors.As(err, &exit) {
		exit.Stderr = stderr.Bytes()
	}
	return stdout.Bytes(), err
}

// CombinedOutput is cmd.CombinedOutput started by Start.
func CombinedOutput(cmd *exec.Cmd) ([]byte, error) {
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := Run(cmd)
	return out.Bytes(), err
}

// KillGroup SIGKILLs the process group of cmd, started by Start: the child and whatever it
// started that stayed in its group. A group already gone is not an error.
func KillGroup(cmd *exec.Cmd) error {
	if cmd.Process == nil {
		return nil
	}
	if err := syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL); err != nil && !errors.Is(err, syscall.ESRCH) {
		return fmt.Errorf("kill the process group of %s: %w", strings.Join(cmd.Args, " "), err)
	}
	return nil
}
