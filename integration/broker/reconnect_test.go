package broker

import (
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/cotal-ai/authplane/integration/internal/harness"
	"github.com/cotal-ai/authplane/internal/testkit"
	"github.com/cotal-ai/authplane/service"
	"github.com/cotal-ai/authplane/subjects"
)

// The broker goes away and comes back: the plane logs and counts its reconnections, serves
// again, and its fence watch still fences.
func TestThePlaneServesAgainAfterTheBrokerComesBackAndCountsItsReconnects(t *testing.T) {
	t.Parallel()
	s := harness.StartStandalone(t, harness.TestSpace)
	var log harness.SyncBuffer
	dir := t.TempDir()
	p := harness.StartPlane(t, func(c *service.Config) {
		harness.AgainstStandalone(s)(c)
		c.Dir = dir
		c.Logger = harness.NewTextLogger(&log)
	})
	served := func() error {
		o := harness.AskWithin(time.Second, harness.CallerConn(t, p, harness.OwnerA, "cli"), harness.OwnerA, "cli", subjects.EndpointManagerAuthority, "{}")
		if o.Code != "bad-request" {
			return fmt.Errorf("a request: got %q %q, want the plane's bad-request", o.Code, o.Message)
		}
		return nil
	}
	if err := served(); err != nil {
		t.Fatal(err)
	}

	s.Restart(t)
	testkit.CheckFor(t, 20*time.Second, 100*time.Millisecond, served)
	testkit.CheckFor(t, 10*time.Second, 50*time.Millisecond, func() error {
		families := harness.Scrape(t, p.HTTPURL())
		for _, conn := range []string{"serving", "store"} {
			if n := harness.Sample(families, "authplane_nats_reconnects_total", map[string]string{"conn": conn}); n < 1 {
				return fmt.Errorf("/metrics reconnects of the %s connection: got %v, want 1 or more", conn, n)
			}
		}
		if status, got := harness.Health(t, p.HTTPURL()); status != http.StatusOK {
			return fmt.Errorf("GET /health: got %d %v, want 200", status, got)
		}
		return nil
	})
	if lines := strings.Count(log.String(), `msg="reconnected to NATS"`); lines < 2 {
		t.Errorf("got %d log lines saying the plane reconnected, want one per reconnection:\n%s", lines, log.String())
	}
	if p.Err() != nil {
		t.Fatalf("the plane stopped across the broker's restart: %v", p.Err())
	}

	// Its watch of its own gate survived: a newer registration still fences it.
	dirB := t.TempDir()
	harness.CopyIdentity(t, dir, dirB)
	harness.StartPlane(t, func(c *service.Config) { harness.AgainstStandalone(s)(c); c.Dir = dirB })
	select {
	case <-p.Done():
	case <-time.After(3 * time.Second):
		t.Fatal("a newer registration after the broker's restart did not fence the plane")
	}
}
