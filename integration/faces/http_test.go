package faces

import (
	"encoding/json"
	"net/http"
	"reflect"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cotal-ai/authplane/integration/internal/harness"
	"github.com/cotal-ai/authplane/service"
	"github.com/cotal-ai/authplane/subjects"
)

func TestHealthAnswersOnlyOnItsExactPath(t *testing.T) {
	t.Parallel()
	// Synced, as a user runs it: /health names no unsynced server.
	p := harness.StartPlane(t, func(c *service.Config) { c.AllowUnsynced = false })
	tests := []struct {
		name   string
		method string
		path   string
		status int
		code   string // the error code of a refusal; "" for the health answer
	}{
		{"GET", http.MethodGet, "/health", http.StatusOK, ""},
		{"HEAD", http.MethodHead, "/health", http.StatusOK, ""},
		{"POST", http.MethodPost, "/health", http.StatusMethodNotAllowed, "method-not-allowed"},
		{"a trailing slash", http.MethodGet, "/health/", http.StatusNotFound, "not-found"},
		{"a query", http.MethodGet, "/health?x=1", http.StatusNotFound, "not-found"},
		{"another case", http.MethodGet, "/HEALTH", http.StatusNotFound, "not-found"},
		{"an escaped letter", http.MethodGet, "/%68ealth", http.StatusNotFound, "not-found"},
		{"a dot segment", http.MethodGet, "/x/../health", http.StatusNotFound, "not-found"},
		{"the root", http.MethodGet, "/", http.StatusNotFound, "not-found"},
		{"an unknown path", http.MethodGet, "/metrics/x", http.StatusNotFound, "not-found"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			req, err := http.NewRequest(tt.method, p.HTTPURL()+tt.path, nil)
			if err != nil {
				t.Fatal(err)
			}
			req.Header.Set("Origin", "https://evil.example")
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			raw := harness.ReadBody(t, resp)
			if resp.StatusCode != tt.status {
				t.Errorf("%s %s: got status %d, want %d", tt.method, tt.path, resp.StatusCode, tt.status)
			}
			for name := range resp.Header {
				if strings.HasPrefix(strings.ToLower(name), "access-control-") {
					t.Errorf("%s %s: got header %s, want no CORS headers ever", tt.method, tt.path, name)
				}
			}
			if tt.method == http.MethodHead {
				return
			}
			var got map[string]any
			if err := json.Unmarshal(raw, &got); err != nil {
				t.Fatalf("%s %s: body %q: %v", tt.method, tt.path, raw, err)
			}
			if tt.code == "" {
				if want := map[string]any{"ok": true, "issuer": subjects.Issuer(harness.TestSpace)}; !reflect.DeepEqual(got, want) {
					t.Errorf("%s %s: got %s, want %v", tt.method, tt.path, raw, want)
				}
				return
			}
			if got["code"] != tt.code || got["error"] == nil || len(got) != 2 {
				t.Errorf("%s %s: got %s, want {\"error\": message, \"code\": %q}", tt.method, tt.path, raw, tt.code)
			}
		})
	}
}

// A plane whose broker went away says so on /health, and still stops cleanly: Close returns
// no error, and the binary exits 0 on SIGTERM.
func TestHealthTellsTheTruthWhenTheBrokerIsGoneAndTheStopIsStillClean(t *testing.T) {
	t.Parallel()
	t.Run("the plane", func(t *testing.T) {
		t.Parallel()
		s := harness.StartStandalone(t, harness.TestSpace)
		sp, err := harness.TryStart(t, func() service.Config { c := harness.PlaneConfig(t); harness.AgainstStandalone(s)(&c); return c }())
		if err != nil {
			t.Fatal(err)
		}
		url := sp.Info().HTTPURL
		if status, got := harness.Health(t, url); status != http.StatusOK || got["ok"] != true {
			t.Fatalf("GET /health while connected: got %d %v, want 200 ok", status, got)
		}
		s.Srv.Shutdown()
		harness.WaitUnhealthy(t, url, "disconnected")
		if err := sp.Close(); err != nil {
			t.Fatalf("Close while disconnected: got %v, want nil", err)
		}
	})
	t.Run("the binary", func(t *testing.T) {
		t.Parallel()
		s := harness.StartStandalone(t, harness.TestSpace)
		dir := t.TempDir()
		proc := harness.StartAuthplane(t, "serve", "--dir", dir, "--nats-url", s.URL(), "--space-dir", s.SpaceDir, "--http-port", "0")
		info := harness.WaitReady(t, proc, dir)
		s.Srv.Shutdown()
		harness.WaitUnhealthy(t, info.URL, "disconnected")
		if err := proc.Cmd.Process.Signal(syscall.SIGTERM); err != nil {
			t.Fatal(err)
		}
		if code := proc.Wait(t, 30*time.Second); code != 0 {
			t.Fatalf("SIGTERM while disconnected: exit %d, want 0\nstderr:\n%s", code, proc.Stderr.String())
		}
	})
}

// A fenced plane says so on /health until it is closed.
func TestHealthSaysFencedOnceANewerRegistrationLands(t *testing.T) {
	t.Parallel()
	s := harness.StartStandalone(t, harness.TestSpace)
	dirA, dirB := t.TempDir(), t.TempDir()
	a := harness.StartPlane(t, func(c *service.Config) { harness.AgainstStandalone(s)(c); c.Dir = dirA })
	harness.CopyIdentity(t, dirA, dirB)
	harness.StartPlane(t, func(c *service.Config) { harness.AgainstStandalone(s)(c); c.Dir = dirB })
	<-a.Done()
	harness.WaitUnhealthy(t, a.HTTPURL(), "fenced")
}

// TestPProfIsOnTheLoopbackFaceOnlyWhenAskedFor: --pprof adds net/http/pprof's routes to the
// loopback face, each on its exact path and taking its query; without it they are unknown
// paths, and the public face never has them.
func TestPProfIsOnTheLoopbackFaceOnlyWhenAskedFor(t *testing.T) {
	t.Parallel()
	on := harness.StartPlane(t, func(c *service.Config) { c.PProf = true; c.PublicPort = 0 })
	off := harness.StartPlane(t, nil)
	get := func(url string) (int, string) {
		resp, err := http.Get(url)
		if err != nil {
			t.Fatal(err)
		}
		return resp.StatusCode, string(harness.ReadBody(t, resp))
	}
	tests := []struct {
		name   string
		url    string
		status int
		body   string // what the answer contains
	}{
		{"the index", on.HTTPURL() + "/debug/pprof/", http.StatusOK, "heap"},
		{"a named profile with its query", on.HTTPURL() + "/debug/pprof/goroutine?debug=1", http.StatusOK, "goroutine profile"},
		{"the command line", on.HTTPURL() + "/debug/pprof/cmdline", http.StatusOK, ""},
		{"a trailing slash", on.HTTPURL() + "/debug/pprof/heap/", http.StatusNotFound, "not-found"},
		{"an unknown profile", on.HTTPURL() + "/debug/pprof/nothing", http.StatusNotFound, "not-found"},
		{"without the prefix's slash", on.HTTPURL() + "/debug/pprof", http.StatusNotFound, "not-found"},
		{"health still refuses a query", on.HTTPURL() + "/health?x=1", http.StatusNotFound, "not-found"},
		{"the public face", on.PublicURL() + "/debug/pprof/", http.StatusNotFound, "not-found"},
		{"a plane without --pprof", off.HTTPURL() + "/debug/pprof/", http.StatusNotFound, "not-found"},
		{"a plane without --pprof, a profile", off.HTTPURL() + "/debug/pprof/heap?debug=1", http.StatusNotFound, "not-found"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			status, body := get(tt.url)
			if status != tt.status || !strings.Contains(body, tt.body) {
				t.Errorf("GET %s: got %d %.80q, want %d containing %q", tt.url, status, body, tt.status, tt.body)
			}
		})
	}
}
