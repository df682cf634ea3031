package cluster

import (
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/cotal-ai/authplane/client"
	"github.com/cotal-ai/authplane/integration/internal/harness"
	"github.com/cotal-ai/authplane/internal/testkit"
	"github.com/cotal-ai/authplane/service"
)

// TestAServerThatJoinsUnsyncedStopsThePlaneServingUntilItSyncs: a node of the cluster comes
// back syncing every two minutes; within the plane's next reading /health answers 503 naming
// it, every call is answered unavailable, and authplane_unsynced_servers counts it. Back with
// `sync_interval: always`, the plane serves again.
func TestAServerThatJoinsUnsyncedStopsThePlaneServingUntilItSyncs(t *testing.T) {
	harness.Long(t, "a three-node cluster")
	t.Parallel()
	c := startCluster(t, harness.TestSpace, 3)
	p := harness.StartPlane(t, func(cfg *service.Config) {
		againstCluster(c)(cfg)
		cfg.AllowUnsynced = false
		cfg.Hooks = &service.Hooks{SyncCheckEvery: 100 * time.Millisecond}
	})
	harness.Grant(t, p, harness.OwnerA, "cli", "supervise")
	if err := harness.PrepareOnce(t, p); err != nil {
		t.Fatalf("prepare on a synced cluster: %v", err)
	}

	rejoin := func(interval string) {
		c.stop(t, 2)
		harness.SyncingEvery(t, c.confs[2], interval)
		c.start(t, 2)
		c.waitFormed(t)
	}
	rejoin(`"2m"`)
	harness.WaitUnhealthy(t, p.HTTPURL(), "unsynced: server n3: sync_interval 2m0s")
	testkit.CheckFor(t, 20*time.Second, 100*time.Millisecond, func() error {
		if code := client.CodeOf(harness.PrepareOnce(t, p)); code != "unavailable" {
			return fmt.Errorf("prepare beside an unsynced server: got code %q, want unavailable", code)
		}
		return nil
	})
	if got := harness.Sample(harness.Scrape(t, p.HTTPURL()), "authplane_unsynced_servers", nil); got != 1 {
		t.Errorf("authplane_unsynced_servers: got %v, want 1", got)
	}

	rejoin("always")
	testkit.CheckFor(t, 30*time.Second, 100*time.Millisecond, func() error {
		if status, body := harness.Health(t, p.HTTPURL()); status != http.StatusOK {
			return fmt.Errorf("/health once n3 syncs again: got %d %v, want 200", status, body)
		}
		return harness.PrepareOnce(t, p)
	})
}
