package powercut

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"
)

// killedBy reports whether the command, waited for, died of sig.
func killedBy(err error, sig syscall.Signal) bool {
	var exit *exec.ExitError
	if !errors.As(err, &exit) {
		return false
	}
	ws, ok := exit.Sys().(syscall.WaitStatus)
	return ok && ws.Signaled() && ws.Signal() == sig
}

func TestCutStopsThenKillsTheProcessesUsingTheMount(t *testing.T) {
	backing := t.TempDir()
	f := Mount(t, backing)
	// The children change into the mount themselves: see the package doc on Cmd.Dir.
	writer := exec.Command("sh", "-c", `cd "$0" && while :; do echo x >> f; done`, f.Dir()) // never syncs
	idler := exec.Command("sh", "-c", `cd "$0" && exec sleep 600`, f.Dir())                 // only its working directory is in the mount
	tracked := exec.Command("sleep", "600")                                                 // nothing of the mount: registered with Track
	procs := map[string]*exec.Cmd{"writer": writer, "idler": idler, "tracked": tracked}
	for _, c := range procs {
		if err := c.Start(); err != nil {
			t.Fatal(err)
		}
		defer c.Process.Kill()
	}
	if err := f.Track(tracked.Process.Pid); err != nil {
		t.Fatal(err)
	}
	checkFor(t, 10*time.Second, time.Millisecond, func() error {
		if st, err := os.Stat(filepath.Join(f.Dir(), "f")); err != nil || st.Size() < 1000 {
			return fmt.Errorf("the writer has not written 1000 bytes yet: %v, %v", st, err)
		}
		return nil
	})
	// The first step of a cut, alone: every user is stopped before anything is thrown away.
	stopped, err := f.stop()
	if err != nil {
		t.Fatal(err)
	}
	for name, c := range procs {
		if fields, err := stat(fmt.Sprintf("/proc/%d/stat", c.Process.Pid)); err != nil || fields[0] != "T" {
			t.Errorf("%s after the stop: got state %v, %v, want T (stopped)", name, fields, err)
		}
	}
	if len(stopped) != len(procs) {
		t.Errorf("stopped %v, want the %d processes", stopped, len(procs))
	}
	cut(t, f)
	for name, c := range procs {
		if err := c.Wait(); !killedBy(err, syscall.SIGKILL) {
			t.Errorf("%s: got %v, want killed by SIGKILL", name, err)
		}
	}
	if got := readFile(t, filepath.Join(backing, "f")); got != "" {
		t.Errorf("the writer's file after the cut: got %d bytes, want none", len(got))
	}
}

// A test killed while one of its threads waits on its own mount dies all the same, where
// without the watchdog it stays a zombie for good; the next mount sweeps its dead mount away.
func TestAKilledTestLeavesNoMountBehind(t *testing.T) {
	if dir := os.Getenv("POWERCUT_KILLED_MOUNT"); dir != "" {
		killedTest(dir, os.Getenv("POWERCUT_KILLED_BACKING"))
		return
	}
	Mount(t, t.TempDir()) // skips or fails here where nothing can mount
	dir := t.TempDir()
	child := exec.Command(os.Args[0], "-test.run=^TestAKilledTestLeavesNoMountBehind$")
	child.Env = append(os.Environ(), "POWERCUT_KILLED_MOUNT="+dir, "POWERCUT_KILLED_BACKING="+t.TempDir())
	out, err := child.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := child.Start(); err != nil {
		t.Fatal(err)
	}
	defer child.Process.Kill()
	lines := bufio.NewScanner(out)
	for lines.Scan() && lines.Text() != "waiting" {
		t.Log("killed test:", lines.Text())
	}
	checkFor(t, 10*time.Second, time.Millisecond, func() error { return waitingOnFUSE(child.Process.Pid) })
	child.Process.Kill()
	waited := make(chan error, 1)
	go func() { waited <- child.Wait() }()
	select {
	case err := <-waited:
		if !killedBy(err, syscall.SIGKILL) {
			t.Fatalf("the killed test: got %v, want killed by SIGKILL", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the killed test did not die within 10 s: a thread waits on its own mount")
	}
	var st syscall.Statfs_t
	if err := syscall.Statfs(dir, &st); !errors.Is(err, syscall.ENOTCONN) && !errors.Is(err, syscall.ECONNABORTED) {
		t.Fatalf("the killed test's mount: got %v, want ENOTCONN or ECONNABORTED", err)
	}
	Mount(t, t.TempDir())
	if err := syscall.Statfs(dir, &st); err != nil {
		t.Errorf("the killed test's mount point after the next mount: got %v, want it swept", err)
	}
}

// killedTest mounts at dir and leaves an fsync waiting on it: it holds the lock every
// operation takes, so the request is read and never answered, as when the process is killed
// while a server thread works on it.
func killedTest(dir, backing string) {
	f, err := New(backing, dir)
	if err != nil {
		fmt.Println(err)
		os.Exit(1)
	}
	file, err := os.Create(filepath.Join(f.Dir(), "f"))
	if err != nil {
		fmt.Println(err)
		os.Exit(1)
	}
	f.life.Lock()
	go file.Sync()
	fmt.Println("waiting")
	time.Sleep(time.Hour)
}

// waitingOnFUSE reports whether a thread of the process waits on a FUSE request.
func waitingOnFUSE(pid int) error {
	tasks, _ := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/wchan", pid))
	for _, task := range tasks {
		if wchan, _ := os.ReadFile(task); string(wchan) == "request_wait_answer" {
			return nil
		}
	}
	return fmt.Errorf("no thread of %d waits on a FUSE request", pid)
}
