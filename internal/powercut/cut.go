package powercut

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// Mount mounts a power-cut file system over backing for the test, at a mount point under
// t.TempDir(), and closes it cleanly at the test's end. A test that cannot mount (not root, no
// /dev/fuse, mounting refused) is skipped with the reason, or fails with it when the
// environment sets AUTHPLANE_REQUIRE_FUSE=1, as CI does.
func Mount(t testing.TB, backing string) *FS {
	t.Helper()
	var f *FS
	reason := ""
	if os.Geteuid() != 0 {
		reason = fmt.Sprintf("not root (euid %d)", os.Geteuid())
	} else if d, err := os.OpenFile("/dev/fuse", os.O_RDWR, 0); err != nil {
		reason = err.Error()
	} else {
		d.Close()
		f, err = New(backing, t.TempDir())
		if errors.Is(err, syscall.EPERM) {
			reason = err.Error()
		} else if err != nil {
			t.Fatal(err)
		}
	}
	if reason != "" {
		if os.Getenv("AUTHPLANE_REQUIRE_FUSE") == "1" {
			t.Fatalf("powercut: cannot mount, and AUTHPLANE_REQUIRE_FUSE=1: %s", reason)
		}
		t.Skipf("powercut: cannot mount: %s", reason)
	}
	t.Cleanup(func() {
		if err := f.Close(); err != nil {
			t.Error(err)
		}
		f.abort() // anything this process left open in it, after a Cut too
	})
	return f
}

// stop stops (SIGSTOP) every other process that uses the mount, and every tracked one, and
// waits until they have stopped. It returns them.
func (f *FS) stop() ([]int, error) {
	var stopped []int
	var errs []error
	seen := map[int]bool{}
	for range 10 { // a process can fork before its stop lands: look again for its children
		var fresh []int
		for _, pid := range f.users() {
			if !seen[pid] {
				seen[pid] = true
				fresh = append(fresh, pid)
			}
		}
		if len(fresh) == 0 {
			break
		}
		for _, pid := range fresh {
			syscall.Kill(pid, syscall.SIGSTOP)
		}
		for _, pid := range fresh {
			if !await(pid, "tTZX", true) {
				errs = append(errs, fmt.Errorf("powercut: process %d did not stop", pid))
			}
		}
		stopped = append(stopped, fresh...)
	}
	return stopped, errors.Join(errs...)
}

// kill kills (SIGKILL) the stopped processes and waits until they are dead.
func kill(pids []int) error {
	var errs []error
	for _, pid := range pids {
		syscall.Kill(pid, syscall.SIGKILL)
	}
	for _, pid := range pids {
		if !await(pid, "ZX", false) {
			errs = append(errs, fmt.Errorf("powercut: process %d did not die", pid))
		}
	}
	return errors.Join(errs...)
}

// users returns the other processes that have a file, a mapping, their working directory or
// their root inside the mount, and the tracked ones still running.
func (f *FS) users() []int {
	var pids []int
	f.mu.Lock()
	for pid, start := range f.pids {
		if s, err := startTime(pid); err == nil && s == start {
			pids = append(pids, pid)
		}
	}
	f.mu.Unlock()
	inside := func(p string) bool { return p == f.dir || strings.HasPrefix(p, f.dir+"/") }
	procs, _ := os.ReadDir("/proc")
	for _, e := range procs {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == os.Getpid() {
			continue
		}
		dir := "/proc/" + e.Name()
		links := []string{dir + "/cwd", dir + "/root"}
		fds, _ := os.ReadDir(dir + "/fd")
		for _, fd := range fds {
			links = append(links, dir+"/fd/"+fd.Name())
		}
		used := false
		for _, l := range links {
			if target, err := os.Readlink(l); err == nil && inside(target) {
				used = true
				break
			}
		}
		maps, _ := os.ReadFile(dir + "/maps")
		for line := range strings.Lines(string(maps)) {
			if fields := strings.Fields(line); len(fields) >= 6 && inside(fields[5]) {
				used = true
			}
		}
		if used {
			pids = append(pids, pid)
		}
	}
	return pids
}

// await polls until the process is in one of states (every thread, with tasks) or gone, for at
// most 10 seconds.
func await(pid int, states string, tasks bool) bool {
	files := func() []string { return []string{fmt.Sprintf("/proc/%d/stat", pid)} }
	if tasks {
		files = func() []string {
			ts, _ := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
			var fs []string
			for _, t := range ts {
				fs = append(fs, fmt.Sprintf("/proc/%d/task/%s/stat", pid, t.Name()))
			}
			return fs
		}
	}
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(time.Millisecond) {
		reached := true
		for _, file := range files() {
			if fields, err := stat(file); err == nil && !strings.Contains(states, fields[0]) {
				reached = false
			}
		}
		if reached {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
	}
}

// stat returns the fields of a /proc stat file after the command's name: state first.
func stat(file string) ([]string, error) {
	b, err := os.ReadFile(file)
	if err != nil {
		return nil, err
	}
	// The name is in parentheses and may hold any: the fields follow the last ")".
	fields := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+1:]))
	if len(fields) < 20 {
		return nil, fmt.Errorf("%s: %d fields", file, len(fields))
	}
	return fields, nil
}

// startTime returns when a process started, which tells it from a later one with its pid.
func startTime(pid int) (string, error) {
	fields, err := stat(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return "", err
	}
	return fields[19], nil
}

// unmount unmounts the file system; if something of this process still has a file open, it
// detaches the mount instead, whose operations then fail with EIO until the last is closed.
func (f *FS) unmount() error {
	err := syscall.Unmount(f.dir, 0)
	if err == nil {
		<-f.served
		return nil
	}
	if !errors.Is(err, syscall.EBUSY) {
		return fmt.Errorf("powercut: unmount %s: %w", f.dir, err)
	}
	if err := syscall.Unmount(f.dir, syscall.MNT_DETACH); err != nil {
		return fmt.Errorf("powercut: detach %s: %w", f.dir, err)
	}
	return nil
}

// sweep detaches the power-cut mounts whose server is gone, as a test killed mid-way leaves
// them: their mount point answers ENOTCONN (ECONNABORTED if the watchdog aborted it).
func sweep() {
	info, _ := os.ReadFile("/proc/self/mountinfo")
	unescape := strings.NewReplacer(`\040`, " ", `\011`, "\t", `\012`, "\n", `\134`, `\`)
	for line := range strings.Lines(string(info)) {
		mount, kind, _ := strings.Cut(line, " - ")
		fields := strings.Fields(mount)
		if len(fields) < 5 || !strings.HasPrefix(kind, "fuse.powercut ") {
			continue
		}
		dir := unescape.Replace(fields[4])
		answer := make(chan error, 1)
		go func() { // a live server stopped by a debugger would not answer
			var st syscall.Statfs_t
			answer <- syscall.Statfs(dir, &st)
		}()
		select {
		case err := <-answer:
			if errors.Is(err, syscall.ENOTCONN) || errors.Is(err, syscall.ECONNABORTED) {
				syscall.Unmount(dir, syscall.MNT_DETACH)
			}
		case <-time.After(time.Second):
		}
	}
}
