// Package harness is what the black-box test packages under integration/ share: a plane started
// in process on a real nats-server (port -1, temp dirs), callers with real credentials, the
// authplane binary built once per test binary, standalone servers and clusters, and CheckFor.
// Only tests import it (it is internal to integration/), so its helpers take a testing.TB and
// fail the test rather than return errors.
package harness

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"runtime/debug"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/cotal-ai/authplane/admin"
	"github.com/cotal-ai/authplane/internal/platform/space"
	"github.com/cotal-ai/authplane/service"
)

// Two test owners, `u_` followed by 26 base32-lower characters.
const (
	OwnerA = "u_aaaaaaaaaaaaaaaaaaaaaaaaaa"
	OwnerB = "u_bbbbbbbbbbbbbbbbbbbbbbbbbb"
)

// TestSpace is the space every test serves unless it says otherwise.
const TestSpace = "default"

// testLogging reports whether AUTHPLANE_TEST_LOG=1 asks for the plane's and servers' logs.
func testLogging() bool { return os.Getenv("AUTHPLANE_TEST_LOG") == "1" }

// testLogger discards everything unless AUTHPLANE_TEST_LOG=1, then writes text to stderr.
func testLogger(t testing.TB) *slog.Logger {
	if !testLogging() {
		return slog.New(slog.DiscardHandler)
	}
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug})).With("test", t.Name())
}

// NewTextLogger logs everything, as text, to w: for tests that read the plane's log.
func NewTextLogger(w io.Writer) *slog.Logger {
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

// PlaneConfig is the configuration every test plane starts from: an embedded broker on a free
// port, a free HTTP port, a fresh state directory and two workers. It accepts servers that do
// not sync every write, and runs the embedded one so: the tests that are not about durability
// stay fast. Those that are start from service.Defaults' AllowUnsynced (integration/durable).
func PlaneConfig(t testing.TB) service.Config {
	cfg := service.Defaults()
	cfg.Dir = t.TempDir()
	cfg.NATSPort = 0
	cfg.HTTPPort = 0
	cfg.Workers = 2
	cfg.AllowUnsynced = true
	cfg.Logger = testLogger(t)
	return cfg
}

// Unbudgeted lifts c's per-tenant rate budgets (the per-principal rate, the owner's requests
// under way, re-registrations, new keys) to their maxima: for the races and loads that drive
// one tenant harder than a tenant's budget allows, to test fences, not budgets.
func Unbudgeted(c *service.Config) {
	c.Rate, c.OwnerInFlight = 0, 0
	c.ReregistrationsPerInstance, c.ReregistrationsPerOwner = 1_000_000, 1_000_000
	c.NewKeysPerOwner = 10_000_000
}

// TestPlane is a started plane with what its tests read of it: what Start reported, and the
// space material it serves, loaded the way `authplane creds` loads it.
type TestPlane struct {
	*service.Plane
	Info service.Info
	keys *space.Keys
	// t is the test that started the plane: what lives as long as the plane is its.
	t testing.TB

	jsOnce  sync.Once
	js      jetstream.JetStream
	opsOnce sync.Once
	ops     *nats.Conn
}

// Ops is an operator's connection to the plane's broker (`creds --role ops`), opened on first
// use and closed with the plane's test.
func (p *TestPlane) Ops(t testing.TB) *nats.Conn {
	t.Helper()
	p.opsOnce.Do(func() { p.ops = OpsConn(p.t, p, OwnerA, "ops") })
	return p.ops
}

// NATSURL is the broker the plane serves on.
func (p *TestPlane) NATSURL() string { return p.Info.NATSURL }

// HTTPURL is the plane's loopback HTTP face.
func (p *TestPlane) HTTPURL() string { return p.Info.HTTPURL }

// PublicURL is the plane's public HTTP face ("" without one).
func (p *TestPlane) PublicURL() string { return p.Info.PublicURL }

// InstanceID is the plane's instance id.
func (p *TestPlane) InstanceID() string { return p.Info.InstanceID }

// Epoch is the process epoch the plane registered.
func (p *TestPlane) Epoch() uint64 { return p.Info.Epoch }

// CreatedMaterial reports whether the plane's start wrote the space material.
func (p *TestPlane) CreatedMaterial() bool { return p.Info.CreatedMaterial }

// Keys is the space material the plane serves.
func (p *TestPlane) Keys() *space.Keys { return p.keys }

// Account is the space's data account: what renewals name.
func (p *TestPlane) Account() string { return p.keys.Data.Public() }

// StartPlane starts a plane from testConfig changed by mutate (which may be nil) and closes it
// when the test ends. A plane that was fenced reports service.ErrFenced from Close; that is
// its expected end, not a failure.
func StartPlane(t testing.TB, mutate func(*service.Config)) *TestPlane {
	t.Helper()
	cfg := PlaneConfig(t)
	if mutate != nil {
		mutate(&cfg)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	sp, err := service.Start(ctx, cfg)
	if err != nil {
		t.Fatalf("start plane: %v", err)
	}
	t.Cleanup(func() { ClosePlane(t, sp) })
	p := &TestPlane{Plane: sp, Info: sp.Info(), t: t}
	if p.keys, err = (admin.Locate{SpaceDir: p.Info.SpaceDir}).Keys(); err != nil {
		t.Fatalf("load the plane's space material: %v", err)
	}
	return p
}

// TryStart runs service.Start on cfg, for tests that expect it to refuse. A panic inside
// Start is a failure of the test (a refused start must return an error), reported and turned
// into an error so the rest of the package still runs.
func TryStart(t testing.TB, cfg service.Config) (p *service.Plane, err error) {
	t.Helper()
	defer func() {
		if r := recover(); r != nil {
			var where []string
			for _, line := range strings.Split(string(debug.Stack()), "\n") {
				if fn, ok := strings.CutPrefix(strings.TrimSpace(line), "github.com/cotal-ai/authplane/"); ok && strings.HasPrefix(fn, "service.") {
					if i := strings.LastIndex(fn, "("); i > 0 {
						fn = fn[:i]
					}
					where = append(where, fn)
				}
			}
			t.Errorf("service.Start panicked instead of returning its error: %v (in %s)", r, strings.Join(where, " <- "))
			p, err = nil, fmt.Errorf("service.Start panicked: %v", r)
		}
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	return service.Start(ctx, cfg)
}

// ClosePlane closes p and reports any error but the fence.
func ClosePlane(t testing.TB, p *service.Plane) {
	t.Helper()
	if err := p.Close(); err != nil && !errors.Is(err, service.ErrFenced) {
		t.Errorf("close plane: %v", err)
	}
}

// Long skips t in the fast tier (go test -short), saying why it is not in it: a cluster, a
// race's volume, minutes of work. The default tier runs every test.
func Long(t testing.TB, why string) {
	t.Helper()
	if testing.Short() {
		t.Skip("not in the -short tier: " + why)
	}
}

// reportMu serializes the reports of tests that run in parallel.
var reportMu sync.Mutex

// Report logs what a race or a fault test counted, and also appends it, under the test's
// name, to the file AUTHPLANE_TEST_REPORT names: `go test ./...` hides a passing test's log,
// and .ci/run prints that file after the tests, so every run shows its counts.
func Report(t testing.TB, format string, args ...any) {
	t.Helper()
	line := fmt.Sprintf(format, args...)
	t.Log(line)
	path := os.Getenv("AUTHPLANE_TEST_REPORT")
	if path == "" {
		return
	}
	reportMu.Lock()
	defer reportMu.Unlock()
	f, err := os.OpenFile(path, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o600)
	if err != nil {
		t.Fatalf("the test report %s: %v", path, err)
	}
	_, werr := fmt.Fprintf(f, "%s:\n%s\n", t.Name(), line)
	if err := f.Close(); werr == nil {
		werr = err
	}
	if werr != nil {
		t.Fatalf("the test report %s: %v", path, werr)
	}
}
