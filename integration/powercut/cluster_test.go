package powercut

import (
	"errors"
	"fmt"
	"io"
	mrand "math/rand/v2"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/cotal-ai/authplane/admin"
	"github.com/cotal-ai/authplane/integration/internal/harness"
	"github.com/cotal-ai/authplane/internal/platform/space"
	"github.com/cotal-ai/authplane/internal/powercut"
	"github.com/cotal-ai/authplane/internal/testkit"
)

// A three-node cluster the plane uses (--nats-url, --replicas 3): three nats-server processes,
// each with its store (its JetStream and its resolver) on a power-cut mount of its own, each
// configured as `authplane init` configures a node, plus a cluster block. The plane runs as a
// process with its state outside the mounts: it is not cut, and serves on through the cuts.

// The nats-server binary, built once per test binary from the module go.mod pins, outside any
// mount.
var (
	natsOnce sync.Once
	natsPath string
	natsErr  error
)

func natsServerBinary(t *testing.T) string {
	t.Helper()
	natsOnce.Do(func() {
		dir, err := os.MkdirTemp("", "nats-server-bin-")
		if err != nil {
			natsErr = err
			return
		}
		natsPath = filepath.Join(dir, "nats-server")
		if out, err := harness.CombinedOutput(exec.Command("go", "build", "-o", natsPath, "github.com/nats-io/nats-server/v2")); err != nil {
			natsErr = fmt.Errorf("go build nats-server: %w\n%s", err, out)
		}
	})
	if natsErr != nil {
		t.Fatal(natsErr)
	}
	return natsPath
}

// node is one nats-server of the cluster.
type node struct {
	name    string
	backing string
	fs      *powercut.FS
	cmd     *exec.Cmd
	done    chan struct{}
	log     *harness.SyncBuffer
	// port, route and monitor are its client, route and monitoring ports, kept across restarts.
	port, route, monitor int
}

func (n *node) url() string { return fmt.Sprintf("nats://127.0.0.1:%d", n.port) }

// cluster is the three nodes and the plane that uses them.
type cluster struct {
	keys     *space.Keys
	spaceDir string
	nodes    []*node
	// unsynced runs the nodes without `sync_interval: always`, the plane with --allow-unsynced.
	unsynced bool
	// all cuts all three nodes together; otherwise one node alone while the others go on.
	all   bool
	down  []*node // the nodes the last cut took
	plane *harness.Process
	dir   string // the plane's state directory, outside the mounts
	info  admin.ServiceInfo
}

// startCluster starts three nodes on fresh disks and a plane on them. Settled stops the nodes
// cleanly once the plane has made its stores, and starts them again: what the first start
// created is then on their disks, whether they sync or not.
func startCluster(unsynced, all, settled bool) func(t *testing.T) system {
	return func(t *testing.T) system {
		t.Helper()
		_, spaceDir, keys := harness.NewSpaceMaterial(t, harness.TestSpace)
		c := &cluster{keys: keys, spaceDir: spaceDir, unsynced: unsynced, all: all, dir: t.TempDir()}
		ports := harness.FreePorts(t, 9)
		for i := range 3 {
			c.nodes = append(c.nodes, &node{name: fmt.Sprintf("n%d", i+1), backing: t.TempDir(), port: ports[3*i], route: ports[3*i+1], monitor: ports[3*i+2]})
		}
		for _, n := range c.nodes {
			c.startNode(t, n)
		}
		for _, n := range c.nodes {
			if err := c.waitCurrent(n); err != nil {
				t.Fatal(err)
			}
		}
		var urls []string
		for _, n := range c.nodes {
			urls = append(urls, n.url())
		}
		args := append([]string{"serve", "--dir", c.dir, "--space-dir", spaceDir, "--nats-url", strings.Join(urls, ","), "--replicas", "3"},
			planeArgs(t, unsynced)...)
		c.plane = harness.StartAuthplane(t, args...)
		c.info = harness.WaitReady(t, c.plane, c.dir)
		if err := c.waitServing(); err != nil {
			t.Fatal(err)
		}
		if settled {
			c.stopNodes(t)
			c.down = c.nodes
			if err := c.restart(t); err != nil {
				t.Fatal(err)
			}
		}
		return c
	}
}

// conf is node n's configuration on its current mount: what `authplane init` writes, with its
// name, its monitoring port and the cluster's routes.
func (c *cluster) conf(n *node) string {
	var routes []string
	for _, o := range c.nodes {
		routes = append(routes, fmt.Sprintf("%q", fmt.Sprintf("nats-route://127.0.0.1:%d", o.route)))
	}
	conf := c.keys.ServerConf(filepath.Join(n.fs.Dir(), "store"), fmt.Sprintf("127.0.0.1:%d", n.port))
	if c.unsynced {
		conf = strings.Replace(conf, "  sync_interval: always\n", "", 1)
	}
	return conf + fmt.Sprintf("\nserver_name: %q\nhttp: \"127.0.0.1:%d\"\ncluster {\n  name: %q\n  listen: \"127.0.0.1:%d\"\n  routes: [%s]\n}\n",
		n.name, n.monitor, "cotal-"+harness.TestSpace, n.route, strings.Join(routes, ", "))
}

// startNode mounts node n's disk and starts its server on it; it does not wait.
func (c *cluster) startNode(t *testing.T, n *node) {
	t.Helper()
	n.fs = powercut.Mount(t, n.backing)
	path := filepath.Join(t.TempDir(), n.name+".conf")
	if err := os.WriteFile(path, []byte(c.conf(n)), 0o600); err != nil {
		t.Fatal(err)
	}
	n.log, n.done = &harness.SyncBuffer{}, make(chan struct{})
	n.cmd = exec.Command(natsServerBinary(t), "-c", path)
	n.cmd.Stdout, n.cmd.Stderr = n.log, n.log
	if err := harness.Start(n.cmd); err != nil {
		t.Fatal(err)
	}
	if err := n.fs.Track(n.cmd.Process.Pid); err != nil {
		t.Fatal(err)
	}
	cmd, done := n.cmd, n.done
	go func() {
		_ = cmd.Wait() // its end is a cut or the test's
		close(done)
	}()
	t.Cleanup(func() {
		if err := harness.KillGroup(cmd); err != nil {
			t.Error(err)
		}
		<-done
	})
}

// waitCurrent waits until node n's /healthz says it is a current member of the meta group and
// of every stream it replicates; an exit or startWithin without it is errStart.
func (c *cluster) waitCurrent(n *node) error {
	deadline := time.Now().Add(testkit.Stretched(startWithin))
	last := errors.New("not asked yet")
	for time.Now().Before(deadline) {
		select {
		case <-n.done:
			return fmt.Errorf("%w: server %s exited:\n%s", errStart, n.name, tail(n.log.String(), 20))
		default:
		}
		if last = healthz(fmt.Sprintf("http://127.0.0.1:%d/healthz", n.monitor)); last == nil {
			return nil
		}
		time.Sleep(50 * time.Millisecond)
	}
	return fmt.Errorf("%w: server %s is not current within %s: %v\n%s", errStart, n.name, testkit.Stretched(startWithin), last, tail(n.log.String(), 20))
}

// waitServing waits until the plane's /health says ok.
func (c *cluster) waitServing() error {
	deadline := time.Now().Add(testkit.Stretched(startWithin))
	last := errors.New("not asked yet")
	for time.Now().Before(deadline) {
		select {
		case <-c.plane.Done:
			return fmt.Errorf("%w: it exited (%v):\n%s", errStart, c.plane.Err, tail(c.plane.Stderr.String(), 20))
		default:
		}
		if last = healthz(c.info.URL + "/health"); last == nil {
			return nil
		}
		time.Sleep(50 * time.Millisecond)
	}
	return fmt.Errorf("%w within %s: %v\n%s", errStart, testkit.Stretched(startWithin), last, tail(c.plane.Stderr.String(), 20))
}

// healthz GETs url and wants 200.
func healthz(url string) error {
	resp, err := http.Get(url)
	if err != nil {
		return err
	}
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		return err
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: %d %s", url, resp.StatusCode, body)
	}
	return nil
}

func (c *cluster) target(*testing.T) target {
	tg := target{url: c.info.NATSURL, keys: c.keys, spaceDir: c.spaceDir, http: c.info.URL, cap: c.info.Cap}
	for _, n := range c.nodes {
		tg.servers = append(tg.servers, n.url())
	}
	return tg
}

func (c *cluster) loadGoesOn() bool { return !c.all }

// cut cuts all three nodes together (every server stopped before any disk is cut), or one
// node drawn from rng alone.
func (c *cluster) cut(t *testing.T, rng *mrand.Rand) string {
	t.Helper()
	c.down = c.nodes
	if !c.all {
		c.down = []*node{c.nodes[rng.IntN(len(c.nodes))]}
	}
	for _, n := range c.down {
		if err := syscall.Kill(n.cmd.Process.Pid, syscall.SIGSTOP); err != nil {
			t.Fatal(err)
		}
	}
	for _, n := range c.down {
		if err := n.fs.Cut(); err != nil {
			t.Fatalf("cut %s: %v", n.name, err)
		}
		select {
		case <-n.done:
		case <-time.After(10 * time.Second):
			t.Fatalf("server %s outlived the cut by 10 s", n.name)
		}
	}
	return c.down[0].url()
}

// restart starts the nodes the cut took on what their disks kept, and waits until each is
// current and the plane serves.
func (c *cluster) restart(t *testing.T) error {
	t.Helper()
	for _, n := range c.down {
		c.startNode(t, n)
	}
	for _, n := range c.down {
		if err := c.waitCurrent(n); err != nil {
			return err
		}
	}
	return c.waitServing()
}

// stop stops the plane and the servers with SIGTERM, and unmounts the servers' disks cleanly.
func (c *cluster) stop(t *testing.T) {
	t.Helper()
	if err := c.plane.Cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Error(err)
	}
	c.plane.Wait(t, 30*time.Second)
	c.stopNodes(t)
}

// stopNodes stops the servers with SIGTERM and unmounts their disks cleanly.
func (c *cluster) stopNodes(t *testing.T) {
	t.Helper()
	for _, n := range c.nodes {
		if err := n.cmd.Process.Signal(syscall.SIGTERM); err != nil {
			t.Error(err)
		}
	}
	for _, n := range c.nodes {
		select {
		case <-n.done:
		case <-time.After(30 * time.Second):
			t.Errorf("server %s still running 30 s after SIGTERM", n.name)
		}
		if err := n.fs.Close(); err != nil {
			t.Error(err)
		}
	}
}

// TestCutsOfAllThreeNodesUnderLoadLoseNothingAcknowledged cuts the power of every node of a
// three-node cluster together, under the load, 2 times (AUTHPLANE_POWERCUT_TRIALS for more),
// with the checks of the embedded broker's test after each restart.
func TestCutsOfAllThreeNodesUnderLoadLoseNothingAcknowledged(t *testing.T) {
	harness.Long(t, "power cuts of a three-node cluster under load")
	trials := runTrials(t, settings{cuts: trialCount(t, 2), minLoad: time.Second, maxLoad: 3 * time.Second, minAcks: 5}, startCluster(false, true, false))
	report(t, "cluster, all three nodes cut", trials)
	wantNoLoss(t, trials)
}

// TestCutsOfOneNodeUnderLoadLoseNothingAcknowledged cuts the power of one node of a three-node
// cluster while the others serve on under the load, 2 times (AUTHPLANE_POWERCUT_TRIALS for
// more), with the same checks once it is current again.
func TestCutsOfOneNodeUnderLoadLoseNothingAcknowledged(t *testing.T) {
	harness.Long(t, "power cuts of a three-node cluster under load")
	trials := runTrials(t, settings{cuts: trialCount(t, 2), minLoad: time.Second, maxLoad: 3 * time.Second, minAcks: 5}, startCluster(false, false, false))
	report(t, "cluster, one node cut", trials)
	wantNoLoss(t, trials)
}

// TestCutsOfAllThreeUnsyncedNodesLoseAcknowledgedWrites is the all-nodes test with syncing off
// (no `sync_interval: always`, the plane with --allow-unsynced): it must find lost writes. The
// nodes are stopped cleanly once after the plane's first start, so its streams are on their
// disks; every node then loses what it did not sync at the same cut.
func TestCutsOfAllThreeUnsyncedNodesLoseAcknowledgedWrites(t *testing.T) {
	harness.Long(t, "power cuts of a three-node cluster under load")
	trials := runTrials(t, settings{cuts: 1, minLoad: time.Second, maxLoad: 2 * time.Second, minAcks: 30}, startCluster(true, true, true))
	if lost := report(t, "cluster, all three unsynced nodes cut", trials); len(lost) == 0 {
		t.Errorf("%d cuts of an unsynced cluster lost nothing acknowledged; want the test to find lost writes", len(trials))
	}
}
