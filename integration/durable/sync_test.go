package durable

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/cotal-ai/authplane/admin"
	"github.com/cotal-ai/authplane/integration/internal/harness"
	"github.com/cotal-ai/authplane/internal/platform/broker"
	"github.com/cotal-ai/authplane/service"
)

// syncsOf reads every server's sync setting as the plane reads it: VARZ through the system
// account.
func syncsOf(t testing.TB, nc *nats.Conn) []broker.Sync {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	syncs, err := broker.Syncs(ctx, nc)
	if err != nil {
		t.Fatal(err)
	}
	return syncs
}

// TestWhatAUserGetsByDefaultSyncsEveryWrite: the default configuration accepts no server that
// does not sync every write, and a plane started from it runs its embedded server syncing every
// write (read as the plane reads it), with /health naming no unsynced server and
// authplane_unsynced_servers at 0.
func TestWhatAUserGetsByDefaultSyncsEveryWrite(t *testing.T) {
	t.Parallel()
	if service.Defaults().AllowUnsynced {
		t.Fatal("service.Defaults: got AllowUnsynced, want servers that do not sync every write refused")
	}
	p := harness.StartPlane(t, func(c *service.Config) { c.AllowUnsynced = service.Defaults().AllowUnsynced })
	syncs := syncsOf(t, harness.SystemConn(t, p))
	if len(syncs) != 1 || !syncs[0].Always || !syncs[0].JetStream {
		t.Fatalf("the embedded server: got %v, want one server with JetStream syncing every write", syncs)
	}
	status, body := harness.Health(t, p.HTTPURL())
	if _, listed := body["unsynced"]; status != http.StatusOK || listed {
		t.Errorf("/health: got %d %v, want 200 naming no unsynced server", status, body)
	}
	families := harness.Scrape(t, p.HTTPURL())
	if _, ok := families["authplane_unsynced_servers"]; !ok || harness.Sample(families, "authplane_unsynced_servers", nil) != 0 {
		t.Errorf("authplane_unsynced_servers: got %v (exported: %v), want 0", harness.Sample(families, "authplane_unsynced_servers", nil), ok)
	}
}

// TestAPlaneRefusesAnUnsyncedServerUnlessTheFlagAcceptsIt: against a server that syncs every
// two minutes, a start refuses (ErrUnsynced) naming the server and its setting and the flag,
// and writes nothing: no stream, no readiness file. With --allow-unsynced it serves, /health
// (still ok) names the server, and authplane_unsynced_servers counts it.
func TestAPlaneRefusesAnUnsyncedServerUnlessTheFlagAcceptsIt(t *testing.T) {
	t.Parallel()
	root, spaceDir, m := harness.NewSpaceMaterial(t, harness.TestSpace)
	conf := filepath.Join(spaceDir, "nats-server.conf")
	if err := os.WriteFile(conf, []byte(m.ServerConf(filepath.Join(root, "nats"), "127.0.0.1:-1")), 0o644); err != nil {
		t.Fatal(err)
	}
	harness.SyncingEvery(t, conf, `"2m"`)
	s := &harness.Standalone{Material: m, SpaceDir: spaceDir, Srv: harness.RunServerConf(t, conf)}
	setting := "server " + s.Srv.Name() + ": sync_interval 2m0s"

	cfg := harness.PlaneConfig(t)
	harness.AgainstStandalone(s)(&cfg)
	cfg.AllowUnsynced = false
	p, err := harness.TryStart(t, cfg)
	if err == nil {
		harness.ClosePlane(t, p)
		t.Fatal("a start on a server that does not sync every write: got a running plane, want a refusal")
	}
	if !errors.Is(err, service.ErrUnsynced) {
		t.Errorf("start: got %v, want errors.Is service.ErrUnsynced", err)
	}
	for _, want := range []string{setting, "sync_interval: always", "--allow-unsynced"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("start: got %q, want it to say %q", err, want)
		}
	}
	_, js := harness.PlaneConn(t, m, s.URL())
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for name := range js.StreamNames(ctx).Name() {
		t.Errorf("the refused start created stream %s, want none", name)
	}
	if _, err := os.Stat(filepath.Join(cfg.Dir, admin.ServiceInfoFile)); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("after the refused start: stat %s: %v, want no readiness file", admin.ServiceInfoFile, err)
	}

	accepted := harness.StartPlane(t, func(c *service.Config) { harness.AgainstStandalone(s)(c); c.Dir = cfg.Dir })
	status, body := harness.Health(t, accepted.HTTPURL())
	if got := fmt.Sprint(body["unsynced"]); status != http.StatusOK || got != "["+setting+"]" {
		t.Errorf("/health with --allow-unsynced: got %d %v, want 200 with unsynced [%s]", status, body, setting)
	}
	if got := harness.Sample(harness.Scrape(t, accepted.HTTPURL()), "authplane_unsynced_servers", nil); got != 1 {
		t.Errorf("authplane_unsynced_servers: got %v, want 1", got)
	}
}
