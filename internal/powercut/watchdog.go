package powercut

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// A process that serves a FUSE mount and uses it too cannot always die: killed (a test's
// timeout, SIGKILL) while one of its threads waits on a request that another of its threads
// had read and will now never answer, that thread waits forever, uninterruptibly. It holds the
// process's descriptor table, so /dev/fuse is never closed and the kernel never aborts the
// connection: the process stays a zombie and its mount hangs. The watchdog, a child process,
// aborts the connections of its parent once the parent is dead but its descriptor table still
// open (the watchdog's stdin has not reached end of file).

// watchdogEnv makes the test binary, started again, run the watchdog instead of its tests.
const watchdogEnv = "POWERCUT_WATCHDOG"

// fusectl is where the kernel lists FUSE connections, each with an abort file.
const fusectl = "/sys/fs/fuse/connections"

func init() {
	if os.Getenv(watchdogEnv) == "1" {
		watch(os.Getppid(), os.Stdin)
		os.Exit(0)
	}
}

var watchdog struct {
	once sync.Once
	mu   sync.Mutex
	w    io.Writer // lines to the watchdog: a connection to abort, or "-" and one not to
}

// fusectlMagic is the file system type of fusectl.
const fusectlMagic = 0x65735543

// guard tells the watchdog to abort the connection of f's mount if this process dies with it,
// until its server stops. Without fusectl there is no watchdog.
func (f *FS) guard() {
	watchdog.once.Do(startWatchdog)
	var st syscall.Stat_t
	if watchdog.w == nil || syscall.Stat(f.dir, &st) != nil {
		return
	}
	id := fmt.Sprint(unix.Major(st.Dev)<<20 | unix.Minor(st.Dev)) // the kernel's dev_t
	f.conn = id
	tell := func(line string) {
		watchdog.mu.Lock()
		defer watchdog.mu.Unlock()
		fmt.Fprintln(watchdog.w, line)
	}
	tell(id)
	go func() {
		<-f.served
		tell("-" + id)
	}()
}

// abort aborts the connection of f's mount, if it still serves: what this process still has
// open in it fails with ENOTCONN from now on, and cannot hang its exit.
func (f *FS) abort() {
	select {
	case <-f.served:
	default:
		if f.conn != "" {
			os.WriteFile(fusectl+"/"+f.conn+"/abort", []byte("1"), 0)
		}
	}
}

func startWatchdog() {
	var fs unix.Statfs_t
	if unix.Statfs(fusectl, &fs) != nil || fs.Type != fusectlMagic {
		if unix.Mount("fusectl", fusectl, "fusectl", 0, "") != nil {
			return
		}
	}
	self, err := os.Executable()
	if err != nil {
		return
	}
	cmd := exec.Command(self)
	cmd.Env = append(os.Environ(), watchdogEnv+"=1")
	w, err := cmd.StdinPipe()
	if err != nil || cmd.Start() != nil {
		return
	}
	watchdog.w = w
}

// watch aborts the connections named on in, less those named again after a "-", once process
// pid has been dying for two looks in a row while in is still open.
func watch(pid int, in io.Reader) {
	var mu sync.Mutex
	live := map[string]bool{}
	eof := make(chan struct{})
	go func() {
		for lines := bufio.NewScanner(in); lines.Scan(); {
			mu.Lock()
			if id, ok := strings.CutPrefix(lines.Text(), "-"); ok {
				delete(live, id)
			} else {
				live[lines.Text()] = true
			}
			mu.Unlock()
		}
		close(eof) // the parent's descriptors are closed, and with them its connections
	}()
	for dead := 0; dead < 2; {
		select {
		case <-eof:
			return
		case <-time.After(100 * time.Millisecond):
		}
		if dying(pid) {
			dead++
		} else {
			dead = 0
		}
	}
	mu.Lock()
	defer mu.Unlock()
	for id := range live {
		os.WriteFile(fusectl+"/"+id+"/abort", []byte("1"), 0)
	}
}

// dying reports whether the process is gone, a zombie, or has a SIGKILL pending: a live
// process acts on a SIGKILL within microseconds, one stuck on its own mount never does.
func dying(pid int) bool {
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return true
	}
	for line := range strings.Lines(string(status)) {
		key, value, _ := strings.Cut(line, ":")
		value = strings.TrimSpace(value)
		switch key {
		case "State":
			if strings.HasPrefix(value, "Z") || strings.HasPrefix(value, "X") {
				return true
			}
		case "ShdPnd", "SigPnd":
			if mask, err := strconv.ParseUint(value, 16, 64); err == nil && mask&(1<<(syscall.SIGKILL-1)) != 0 {
				return true
			}
		}
	}
	return false
}
