package cluster

import (
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/cotal-ai/authplane/integration/internal/harness"
	"github.com/cotal-ai/authplane/internal/bench"
	"github.com/cotal-ai/authplane/internal/core/store"
	"github.com/cotal-ai/authplane/internal/platform/space"
	"github.com/cotal-ai/authplane/internal/testkit"
	"github.com/cotal-ai/authplane/service"
)

// cluster is three (or n) nats-servers the plane does not run, each configured from the space
// material the way `authplane init` configures one, plus a cluster block: a unique server name,
// routes on 127.0.0.1 ports picked free at random (a clustered JetStream server needs its
// routes configured, so they are known before it starts), JetStream, operator mode with the
// full resolver. Every server lists every route, so any one can be restarted.
type cluster struct {
	material *space.Keys
	spaceDir string
	confs    []string
	servers  []*server.Server
	// ports are the servers' client ports, kept across a stop and a start.
	ports []int
}

// startCluster creates space material for spaceName and runs an n-node cluster from it, and
// waits until every server routes to every other and JetStream has a meta leader (R3 buckets
// cannot be created before).
func startCluster(t testing.TB, spaceName string, n int) *cluster {
	t.Helper()
	root, spaceDir, m := harness.NewSpaceMaterial(t, spaceName)
	c := &cluster{material: m, spaceDir: spaceDir}
	confs, err := bench.WriteClusterConfs(m, root, "cotal-"+spaceName, harness.FreePorts(t, n))
	if err != nil {
		t.Fatal(err)
	}
	c.confs = confs
	for _, conf := range c.confs {
		s := harness.RunServerConf(t, conf)
		c.servers = append(c.servers, s)
		c.ports = append(c.ports, s.Addr().(*net.TCPAddr).Port)
	}
	c.waitFormed(t)
	return c
}

// URLs is every server's client URL, comma-separated: what `--nats-url` takes.
func (c *cluster) URLs() string {
	var urls []string
	for i := range c.servers {
		urls = append(urls, c.URL(i))
	}
	return strings.Join(urls, ",")
}

// URL is server i's client URL, whether it runs or not.
func (c *cluster) URL(i int) string { return fmt.Sprintf("nats://127.0.0.1:%d", c.ports[i]) }

// waitFormed waits until every server routes to every other and a meta leader is elected that
// knows every server online (until then it refuses a replicated stream: "peer offline").
func (c *cluster) waitFormed(t testing.TB) {
	t.Helper()
	testkit.CheckFor(t, 20*time.Second, 50*time.Millisecond, func() error { return bench.Formed(c.servers) })
}

// restart shuts server i down and runs it again from its configuration and store, and waits
// until the cluster has formed again.
func (c *cluster) restart(t testing.TB, i int) {
	t.Helper()
	c.stop(t, i)
	c.start(t, i)
	c.waitFormed(t)
}

// stop shuts server i down, as an operator stops a node: its raft leaderships step down first.
func (c *cluster) stop(t testing.TB, i int) {
	t.Helper()
	c.servers[i].Shutdown()
	c.servers[i].WaitForShutdown()
}

// start runs server i again from its configuration and store, on the client port it had
// (every URL a client was given still reaches it) and the same route. It does not wait for the
// cluster: waitFormed does.
func (c *cluster) start(t testing.TB, i int) {
	t.Helper()
	c.servers[i] = harness.RunServerConfOn(t, c.confs[i], c.ports[i])
}

// running is the indexes of the servers that are not shut down.
func (c *cluster) running() []int {
	var up []int
	for i, s := range c.servers {
		if s.Running() {
			up = append(up, i)
		}
	}
	return up
}

// metaLeader is the index of the server that is the JetStream meta leader, or -1.
func (c *cluster) metaLeader() int {
	for _, i := range c.running() {
		if c.servers[i].JetStreamIsLeader() {
			return i
		}
	}
	return -1
}

// planeStreams names every stream of the plane account.
func (c *cluster) planeStreams() []string {
	var streams []string
	for _, spec := range store.Specs(c.material.Space, store.Options{}) {
		streams = append(streams, spec.Config.Name)
	}
	return streams
}

// streamsLedBy names the plane's streams whose leader is server i.
func (c *cluster) streamsLedBy(i int) []string {
	var led []string
	for _, name := range c.planeStreams() {
		if c.servers[i].JetStreamIsStreamLeader(c.material.Plane.Public(), name) {
			led = append(led, name)
		}
	}
	return led
}

// waitCurrent waits until every running server is a current member of the meta group and a
// current replica of every stream of the plane account, each stream with one leader: what a
// stopped server must be before another may stop (R3 keeps quorum only with two current
// replicas).
func (c *cluster) waitCurrent(t testing.TB, within time.Duration) {
	t.Helper()
	account := c.material.Plane.Public()
	streams := c.planeStreams()
	testkit.CheckFor(t, within, 50*time.Millisecond, func() error {
		for _, i := range c.running() {
			s := c.servers[i]
			if !s.JetStreamIsCurrent() {
				return fmt.Errorf("server %s is not a current member of the meta group", s.Name())
			}
		}
		for _, name := range streams {
			leaders := 0
			for _, i := range c.running() {
				s := c.servers[i]
				if !s.JetStreamIsStreamCurrent(account, name) {
					return fmt.Errorf("server %s is not a current replica of stream %s", s.Name(), name)
				}
				if s.JetStreamIsStreamLeader(account, name) {
					leaders++
				}
			}
			if leaders != 1 {
				return fmt.Errorf("stream %s has %d leaders, want 1", name, leaders)
			}
		}
		return nil
	})
}

// againstCluster points a plane's configuration at c: no embedded broker, c's material, every
// bucket and stream replicated three times.
func againstCluster(c *cluster) func(*service.Config) {
	return func(cfg *service.Config) {
		cfg.NATSURL = c.URLs()
		cfg.SpaceDir = c.spaceDir
		cfg.Space = c.material.Space
		cfg.Replicas = 3
	}
}
