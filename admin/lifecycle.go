package admin

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"syscall"
	"time"

	"github.com/cotal-ai/authplane/internal/capability/instance"
)

// pollEvery is how often Wait and Stop look again.
const pollEvery = 100 * time.Millisecond

// Wait polls a plane's `GET /health` until it answers ok, and returns that answer (`{"ok":true,
// …}`). The plane is the one whose state directory is dir (its auth-service.json, read again at
// every poll, names the URL: it appears once the plane has started), or, when url is set, the
// face at url. At ctx's end it gives up, saying the last thing it saw.
func Wait(ctx context.Context, dir, url string) ([]byte, error) {
	hc := &http.Client{Timeout: 2 * time.Second}
	last := "nothing yet"
	for {
		base := url
		if base == "" {
			if info, err := instance.ReadServiceInfo(dir); err == nil {
				base = info.URL
			} else {
				last = fmt.Sprintf("no plane has started in %s yet (%v)", dir, err)
			}
		}
		if base != "" {
			answer, reason := health(ctx, hc, strings.TrimSuffix(base, "/")+"/health")
			if reason == "" {
				return answer, nil
			}
			last = reason
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("not ready: %s", last)
		case <-time.After(pollEvery):
		}
	}
}

// health asks url once: the answer when it says ok, else why not.
func health(ctx context.Context, hc *http.Client, url string) ([]byte, string) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err.Error()
	}
	resp, err := hc.Do(req)
	if err != nil {
		return nil, err.Error()
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	if err != nil {
		return nil, err.Error()
	}
	var h struct {
		OK     bool   `json:"ok"`
		Reason string `json:"reason"`
	}
	if err := json.Unmarshal(raw, &h); err != nil {
		return nil, fmt.Sprintf("%s answered %d, not JSON", url, resp.StatusCode)
	}
	if resp.StatusCode != http.StatusOK || !h.OK {
		return nil, fmt.Sprintf("%s answered %d: %s", url, resp.StatusCode, h.Reason)
	}
	return raw, ""
}

// ErrNotRunning means no process holds the state directory's lock.
var ErrNotRunning = errors.New("no plane runs on the state directory")

// Stop stops the plane that holds state directory dir's lock: SIGTERM (it drains: requests in
// flight finish within its --drain-timeout), then it waits until the lock is free and the
// process has exited (the lock is the last thing a plane gives up, but it still has to return
// and exit after it). It returns the plane's pid, or ErrNotRunning. At ctx's end it gives up
// and says the plane still runs.
func Stop(ctx context.Context, dir string) (int, error) {
	pid, held, err := instance.Holder(dir)
	switch {
	case err != nil:
		return 0, err
	case !held:
		return 0, fmt.Errorf("%w %s", ErrNotRunning, dir)
	}
	if err := syscall.Kill(pid, syscall.SIGTERM); err != nil {
		return pid, fmt.Errorf("signal pid %d: %w", pid, err)
	}
	for {
		_, held, err := instance.Holder(dir)
		switch {
		case err != nil:
			return pid, err
		case !held && exited(pid):
			return pid, nil
		}
		select {
		case <-ctx.Done():
			what := "holds " + dir
			if !held {
				what = "runs, its lock on " + dir + " given up"
			}
			return pid, fmt.Errorf("pid %d still %s: %w", pid, what, ctx.Err())
		case <-time.After(pollEvery):
		}
	}
}

// exited reports whether process pid has exited: there is no such process, or it is a zombie
// that its parent has not reaped yet (Linux's /proc says so; elsewhere Stop waits until the
// parent reaps it, which a shell does at once). A zombie is one once its last thread is gone:
// the group's leader shows Z while the others still exit, holding the process's files (its
// ports) until the last of them has.
func exited(pid int) bool {
	if err := syscall.Kill(pid, 0); errors.Is(err, syscall.ESRCH) {
		return true
	}
	proc := fmt.Sprintf("/proc/%d", pid)
	stat, err := os.ReadFile(proc + "/stat")
	if err != nil {
		return false // no /proc, or reaped since: the next look tells
	}
	// The state follows the command name in parentheses, which may itself hold any byte.
	i := bytes.LastIndexByte(stat, ')')
	if i < 0 || i+2 >= len(stat) || stat[i+2] != 'Z' {
		return false
	}
	threads, err := os.ReadDir(proc + "/task")
	return err == nil && len(threads) == 1
}
