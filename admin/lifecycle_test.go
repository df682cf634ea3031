package admin

import (
	"bufio"
	"context"
	"errors"
	"os"
	"os/exec"
	"os/signal"
	"syscall"
	"testing"
	"time"

	"github.com/cotal-ai/authplane/internal/capability/instance"
)

// planeDirEnv makes this test binary a stand-in for a plane on the directory it names (see
// TestMain): it takes the directory's lock, says "ready", and on SIGTERM gives the lock up and
// exits only lingerAfterRelease later, as a plane does after its last close step.
const planeDirEnv = "AUTHPLANE_ADMIN_TEST_PLANE_DIR"

const lingerAfterRelease = 700 * time.Millisecond

func TestMain(m *testing.M) {
	if dir := os.Getenv(planeDirEnv); dir != "" {
		os.Exit(standIn(dir))
	}
	os.Exit(m.Run())
}

func standIn(dir string) int {
	term := make(chan os.Signal, 1)
	signal.Notify(term, syscall.SIGTERM)
	lock, err := instance.Acquire(dir)
	if err != nil {
		return 2
	}
	os.Stdout.WriteString("ready\n")
	<-term
	if lock.Release() != nil {
		return 3
	}
	time.Sleep(lingerAfterRelease) // the exit that comes after the lock, drawn out
	return 0
}

// Stop returns only once the plane has exited, not as soon as its lock is free: a plane gives
// the lock up in its last close step and exits after it.
func TestStopReturnsOnlyOnceThePlaneHasExited(t *testing.T) {
	dir := t.TempDir()
	cmd := exec.Command(os.Args[0], "-test.run", "^$")
	cmd.Env = append(os.Environ(), planeDirEnv+"="+dir)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	pid := cmd.Process.Pid
	reaped := false
	t.Cleanup(func() {
		if !reaped {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		}
	})
	if line, err := bufio.NewReader(out).ReadString('\n'); err != nil || line != "ready\n" {
		t.Fatalf("the stand-in said %q (%v), want ready", line, err)
	}

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	got, err := Stop(ctx, dir)
	if err != nil || got != pid {
		t.Fatalf("Stop: pid %d, %v; want %d and no error", got, err, pid)
	}
	// Nothing reaped the stand-in yet: it has exited exactly when it is a zombie to reap now.
	var status syscall.WaitStatus
	n, err := syscall.Wait4(pid, &status, syscall.WNOHANG, nil)
	if err != nil {
		t.Fatal(err)
	}
	if n != pid {
		t.Fatal("Stop returned while the plane still runs (its lock given up, its exit still to come)")
	}
	reaped = true
	_ = out.Close()
	if !status.Exited() || status.ExitStatus() != 0 {
		t.Errorf("the stand-in ended %v, want exit 0", status)
	}
	if _, err := Stop(ctx, dir); !errors.Is(err, ErrNotRunning) {
		t.Errorf("a second Stop: %v, want ErrNotRunning", err)
	}
}
