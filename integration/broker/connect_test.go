package broker

import (
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cotal-ai/authplane/integration/internal/harness"
	"github.com/cotal-ai/authplane/internal/testkit"
)

// TestAPlaneStartedBeforeItsBrokerWaitsForItWithHealth503 starts `serve --nats-url` against
// a port no server listens on yet: /health answers 503 saying it is connecting to NATS, and
// once a server (configured as `authplane init` configures one) listens there, the same start
// becomes ready and serves. Without a broker at all, the start gives up after
// --connect-timeout and exits non-zero saying why.
func TestAPlaneStartedBeforeItsBrokerWaitsForItWithHealth503(t *testing.T) {
	t.Parallel()
	root, spaceDir, m := harness.NewSpaceMaterial(t, harness.TestSpace)
	conf := filepath.Join(spaceDir, "nats-server.conf")
	if err := os.WriteFile(conf, []byte(m.ServerConf(filepath.Join(root, "nats"), "127.0.0.1:-1")), 0o644); err != nil {
		t.Fatal(err)
	}
	ports := harness.FreePorts(t, 2)
	natsURL, httpURL := fmt.Sprintf("nats://127.0.0.1:%d", ports[0]), fmt.Sprintf("http://127.0.0.1:%d", ports[1])
	dir := t.TempDir()
	plane := harness.StartAuthplane(t, "serve", "--nats-url", natsURL, "--space-dir", spaceDir, "--dir", dir,
		"--http-port", fmt.Sprint(ports[1]), "--workers", "1", "--connect-timeout", "2m")
	testkit.CheckFor(t, 30*time.Second, 50*time.Millisecond, func() error {
		r, err := http.Get(httpURL + "/health")
		if err != nil {
			return err
		}
		if err := r.Body.Close(); err != nil {
			return err
		}
		if r.StatusCode != http.StatusServiceUnavailable {
			return fmt.Errorf("got %d, want 503 while no broker listens", r.StatusCode)
		}
		return nil
	})
	// The start says what it does as it goes ("loading the space material" first, which a
	// loaded machine shows for a while): it comes to the broker and waits there.
	testkit.CheckFor(t, 30*time.Second, 50*time.Millisecond, func() error {
		got := harness.Get(t, httpURL+"/health")
		if got.Status != http.StatusServiceUnavailable {
			t.Fatalf("/health before the broker: got %d %s, want 503", got.Status, got.Body)
		}
		if !strings.Contains(got.Field("reason"), "connecting to NATS at "+natsURL) {
			return fmt.Errorf("/health before the broker says %q, want connecting to NATS at %s", got.Field("reason"), natsURL)
		}
		return nil
	})
	select {
	case <-plane.Done:
		t.Fatalf("the plane exited while its broker was not up yet: %v\n%s", plane.Err, plane.Stderr.String())
	default:
	}

	harness.RunServerConfOn(t, conf, ports[0])
	harness.WaitReady(t, plane, dir)
	if got := harness.Get(t, httpURL+"/health"); got.Status != http.StatusOK {
		t.Fatalf("/health once the broker listens: got %d %s, want 200", got.Status, got.Body)
	}
	if !strings.Contains(plane.Stderr.String(), "NATS is not reachable yet; retrying") {
		t.Errorf("the plane's log: want the retries logged, got:\n%s", plane.Stderr.String())
	}

	lost := t.TempDir()
	start := time.Now()
	code, _, stderr := harness.RunAuthplane(t, time.Minute, "serve", "--nats-url", fmt.Sprintf("nats://127.0.0.1:%d", harness.FreePorts(t, 1)[0]),
		"--space-dir", spaceDir, "--dir", lost, "--http-port", "0", "--connect-timeout", "1s")
	if code == 0 || !strings.Contains(stderr, "no servers available for connection") {
		t.Errorf("with no broker: exit %d, stderr:\n%s\nwant non-zero and why", code, stderr)
	}
	if took := time.Since(start); took < time.Second {
		t.Errorf("with no broker the start gave up after %s, want --connect-timeout (1s) of retries", took)
	}
}
