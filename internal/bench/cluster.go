package bench

import (
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/cotal-ai/authplane/internal/platform/space"
)

// Cluster is a cluster of nats-servers the bench runs in its own process, each configured from
// fresh space material the way `authplane init` configures one (operator mode, the full
// account resolver preloaded with the space's accounts, JetStream), plus a cluster block: a
// unique server name and routes to every server on 127.0.0.1. A plane serves it as it serves
// any cluster, through --nats-url with --replicas 3.
type Cluster struct {
	// SpaceDir holds the space material the servers were configured from.
	SpaceDir string
	servers  []*server.Server
}

// clusterFormTimeout bounds the wait for routes and a JetStream meta leader.
const clusterFormTimeout = 60 * time.Second

// StartCluster writes space material for spaceName under dir and starts n servers from it,
// each with its store under dir, and waits until every server routes to every other and
// JetStream has a meta leader (replicated streams cannot be created before). Each syncs every
// write, as `init` configures it, unless unsynced. On an error it shuts down what it started.
func StartCluster(dir, spaceName string, n int, unsynced bool) (_ *Cluster, err error) {
	if n < 1 {
		return nil, fmt.Errorf("a cluster of %d servers: want 1 or more", n)
	}
	c := &Cluster{SpaceDir: filepath.Join(dir, "space")}
	defer func() {
		if err != nil {
			c.Shutdown()
		}
	}()
	m, err := space.Create(c.SpaceDir, spaceName)
	if err != nil {
		return nil, fmt.Errorf("space material for the cluster: %w", err)
	}
	// A clustered JetStream server needs its routes before it starts, so their ports are picked
	// first: free now, listened on by the servers a moment later.
	ports, err := FreePorts(n)
	if err != nil {
		return nil, err
	}
	confs, err := WriteClusterConfs(m, dir, "bench-"+spaceName, ports)
	if err != nil {
		return nil, err
	}
	for i, path := range confs {
		opts, err := server.ProcessConfigFile(path)
		if err != nil {
			return nil, fmt.Errorf("nats-server refuses %s: %w", path, err)
		}
		opts.NoLog, opts.NoSigs = true, true
		opts.SyncAlways = opts.SyncAlways && !unsynced
		s, err := server.NewServer(opts)
		if err != nil {
			return nil, fmt.Errorf("server n%d: %w", i+1, err)
		}
		c.servers = append(c.servers, s)
		go s.Start()
	}
	for _, s := range c.servers {
		if !s.ReadyForConnections(clusterFormTimeout) {
			return nil, fmt.Errorf("server %s did not become ready in %s", s.Name(), clusterFormTimeout)
		}
	}
	return c, c.waitFormed()
}

// waitFormed waits until every server routes to every other and one meta leader is elected.
func (c *Cluster) waitFormed() error {
	deadline := time.Now().Add(clusterFormTimeout)
	for {
		err := Formed(c.servers)
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the cluster did not form in %s: %w", clusterFormTimeout, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// Formed reports whether servers have formed one cluster: every server routes to every other,
// and one JetStream meta leader is elected that knows every server online (until then it
// refuses a replicated stream: "peer offline").
func Formed(servers []*server.Server) error {
	leaders := 0
	for _, s := range servers {
		if got := s.NumRemotes(); got != len(servers)-1 {
			return fmt.Errorf("server %s routes to %d servers, want %d", s.Name(), got, len(servers)-1)
		}
		if s.JetStreamIsLeader() {
			leaders++
			if got := len(s.JetStreamClusterPeers()); got != len(servers) {
				return fmt.Errorf("the meta leader knows %d servers online, want %d", got, len(servers))
			}
		}
	}
	if leaders != 1 {
		return fmt.Errorf("%d JetStream meta leaders, want 1", leaders)
	}
	return nil
}

// URLs is every server's client URL, comma-separated: what --nats-url takes.
func (c *Cluster) URLs() string {
	var urls []string
	for _, s := range c.servers {
		urls = append(urls, s.ClientURL())
	}
	return strings.Join(urls, ",")
}

// Size is the number of servers.
func (c *Cluster) Size() int { return len(c.servers) }

// Shutdown stops every server and waits for each.
func (c *Cluster) Shutdown() {
	for _, s := range c.servers {
		s.Shutdown()
	}
	for _, s := range c.servers {
		s.WaitForShutdown()
	}
}

// WriteClusterConfs writes under dir the configuration of one server a route port of ports,
// each configured from m the way `authplane init` configures one, plus a cluster block named
// name: a unique server name (n1, n2, ...), its route listener, and routes to every server, so
// any one can be restarted. It returns the files' paths.
func WriteClusterConfs(m *space.Keys, dir, name string, ports []int) ([]string, error) {
	var routes []string
	for _, port := range ports {
		routes = append(routes, fmt.Sprintf("%q", fmt.Sprintf("nats-route://127.0.0.1:%d", port)))
	}
	var paths []string
	for i, port := range ports {
		node := fmt.Sprintf("n%d", i+1)
		conf := m.ServerConf(filepath.Join(dir, node), "127.0.0.1:-1") +
			fmt.Sprintf("\nserver_name: %q\ncluster {\n  name: %q\n  listen: \"127.0.0.1:%d\"\n  routes: [%s]\n}\n",
				node, name, port, strings.Join(routes, ", "))
		path := filepath.Join(dir, node+".conf")
		if err := os.WriteFile(path, []byte(conf), 0o600); err != nil {
			return nil, err
		}
		paths = append(paths, path)
	}
	return paths, nil
}

// FreePorts returns n distinct TCP ports on 127.0.0.1 that were free a moment ago.
func FreePorts(n int) ([]int, error) {
	var ports []int
	var ls []net.Listener
	defer func() {
		for _, l := range ls {
			l.Close()
		}
	}()
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, errors.Join(errors.New("pick the cluster's route ports"), err)
		}
		ls = append(ls, l)
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}
