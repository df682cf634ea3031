package integration

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/cotal-ai/authplane/internal/space"
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
}

// startCluster creates space material for spaceName and runs an n-node cluster from it, and
// waits until every server routes to every other and JetStream has a meta leader (R3 buckets
// cannot be created before).
func startCluster(t testing.TB, spaceName string, n int) *cluster {
	t.Helper()
	root, spaceDir, m := newSpaceMaterial(t, spaceName)
	c := &cluster{material: m, spaceDir: spaceDir}
	ports := freePorts(t, n)
	var routes []string
	for _, port := range ports {
		routes = append(routes, fmt.Sprintf("%q", fmt.Sprintf("nats-route://127.0.0.1:%d", port)))
	}
	for i := range n {
		name := fmt.Sprintf("n%d", i+1)
		conf := m.ServerConf(filepath.Join(root, name), "127.0.0.1:-1") +
			fmt.Sprintf("\nserver_name: %q\ncluster {\n  name: %q\n  listen: \"127.0.0.1:%d\"\n  routes: [%s]\n}\n",
				name, "cotal-"+spaceName, ports[i], strings.Join(routes, ", "))
		path := filepath.Join(root, name+".conf")
		if err := os.WriteFile(path, []byte(conf), 0o644); err != nil {
			t.Fatal(err)
		}
		c.confs = append(c.confs, path)
	}
	for _, conf := range c.confs {
		c.servers = append(c.servers, runServerConf(t, conf))
	}
	c.waitFormed(t)
	return c
}

// freePorts returns n distinct free TCP ports on 127.0.0.1.
func freePorts(t testing.TB, n int) []int {
	t.Helper()
	var ports []int
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports
}

// URLs is every server's client URL, comma-separated: what `--nats-url` takes.
func (c *cluster) URLs() string {
	var urls []string
	for _, s := range c.servers {
		urls = append(urls, s.ClientURL())
	}
	return strings.Join(urls, ",")
}

// URL is server i's client URL.
func (c *cluster) URL(i int) string { return c.servers[i].ClientURL() }

// waitFormed waits until every server routes to every other and a meta leader is elected.
func (c *cluster) waitFormed(t testing.TB) {
	t.Helper()
	checkFor(t, 20*time.Second, 50*time.Millisecond, func() error {
		leaders := 0
		for _, s := range c.servers {
			if got := s.NumRemotes(); got != len(c.servers)-1 {
				return fmt.Errorf("server %s routes to %d servers, want %d", s.Name(), got, len(c.servers)-1)
			}
			if s.JetStreamIsLeader() {
				leaders++
			}
		}
		if leaders != 1 {
			return fmt.Errorf("%d JetStream meta leaders, want 1", leaders)
		}
		return nil
	})
}

// restart shuts server i down and runs it again from its configuration and store (a new
// client port, the same route), and waits until the cluster has formed again.
func (c *cluster) restart(t testing.TB, i int) {
	t.Helper()
	c.servers[i].Shutdown()
	c.servers[i].WaitForShutdown()
	c.servers[i] = runServerConf(t, c.confs[i])
	c.waitFormed(t)
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
