package harness

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/cotal-ai/authplane/internal/bench"
	"github.com/cotal-ai/authplane/internal/platform/space"
	"github.com/cotal-ai/authplane/service"
)

// Standalone is a nats-server the plane does not run, configured from the space material the
// way `authplane init` configures one.
type Standalone struct {
	Srv      *server.Server
	Material *space.Keys
	SpaceDir string
	conf     string
}

// URL is the server's client URL.
func (s *Standalone) URL() string { return s.Srv.ClientURL() }

// StartStandalone creates space material for spaceName, writes its nats-server.conf with
// Material.ServerConf (what `authplane init` writes) listening on 127.0.0.1:-1, and runs a real
// nats-server from that file. It doubles as the check that init's config is accepted.
func StartStandalone(t testing.TB, spaceName string) *Standalone {
	t.Helper()
	root, spaceDir, m := NewSpaceMaterial(t, spaceName)
	conf := filepath.Join(spaceDir, "nats-server.conf")
	if err := os.WriteFile(conf, []byte(m.ServerConf(filepath.Join(root, "nats"), "127.0.0.1:-1")), 0o644); err != nil {
		t.Fatal(err)
	}
	s := &Standalone{Material: m, SpaceDir: spaceDir, conf: conf}
	s.Srv = RunServerConf(t, conf)
	return s
}

// NewSpaceMaterial creates space material for spaceName in root/space, root a fresh directory
// for the servers' stores beside it.
func NewSpaceMaterial(t testing.TB, spaceName string) (root, spaceDir string, m *space.Keys) {
	t.Helper()
	root = t.TempDir()
	spaceDir = filepath.Join(root, "space")
	m, err := space.Create(spaceDir, spaceName)
	if err != nil {
		t.Fatalf("create space material: %v", err)
	}
	return root, spaceDir, m
}

// RunServerConf runs a nats-server from the configuration file conf, the way `nats-server -c`
// would, and shuts it down when the test ends.
func RunServerConf(t testing.TB, conf string) *server.Server {
	t.Helper()
	return RunServerConfOn(t, conf, server.RANDOM_PORT)
}

// Restart shuts the server down and runs it again from its configuration, on the same client
// port and with the same store: a broker that goes away and comes back.
func (s *Standalone) Restart(t testing.TB) {
	t.Helper()
	port := s.Srv.Addr().(*net.TCPAddr).Port
	s.Srv.Shutdown()
	s.Srv.WaitForShutdown()
	s.Srv = RunServerConfOn(t, s.conf, port)
}

// RunServerConfOn is runServerConf listening on port (server.RANDOM_PORT: a free one).
func RunServerConfOn(t testing.TB, conf string, port int) *server.Server {
	t.Helper()
	opts, err := server.ProcessConfigFile(conf)
	if err != nil {
		t.Fatalf("nats-server refuses %s: %v", conf, err)
	}
	if opts.Host != "127.0.0.1" || opts.Port != server.RANDOM_PORT {
		t.Fatalf("got listen %s:%d from %s, want 127.0.0.1:-1", opts.Host, opts.Port, conf)
	}
	opts.Port = port
	return RunServer(t, opts, "nats-server from "+conf)
}

// serverReady is how long a server may take to listen once started.
const serverReady = 90 * time.Second

// RunServer runs a nats-server with opts (no signals; logs only with AUTHPLANE_TEST_LOG=1)
// until it accepts connections, and shuts it down when the test ends.
func RunServer(t testing.TB, opts *server.Options, what string) *server.Server {
	t.Helper()
	opts.NoSigs = true
	opts.NoLog = !testLogging()
	srv, err := server.NewServer(opts)
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
	if testLogging() {
		srv.ConfigureLogger()
	}
	go srv.Start()
	// A restarted clustered server recovers its streams before it listens, which under -race
	// on a loaded 2-core machine has taken over 10 s, and once over 30 s (a quiet CI run beside
	// another session's tests): a start, not the behaviour any test is about.
	if !srv.ReadyForConnections(serverReady) {
		srv.Shutdown()
		t.Fatalf("%s did not become ready in %s%s", what, serverReady, portInUse(opts.Port))
	}
	t.Cleanup(func() {
		srv.Shutdown()
		srv.WaitForShutdown()
	})
	return srv
}

// AgainstStandalone points a plane's configuration at s: no embedded broker, s's material.
func AgainstStandalone(s *Standalone) func(*service.Config) {
	return func(c *service.Config) {
		c.NATSURL = s.URL()
		c.SpaceDir = s.SpaceDir
		c.Space = s.Material.Space
	}
}

// portInUse says whether port (when one was asked for) is held by another socket: a restart
// on the port a server had can lose it to any socket the system handed it to meanwhile.
func portInUse(port int) string {
	if port <= 0 {
		return ""
	}
	l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
	if err != nil {
		return fmt.Sprintf(" (its port %d is taken: %v)", port, err)
	}
	_ = l.Close()
	return fmt.Sprintf(" (its port %d is free)", port)
}

// FreePorts returns n distinct free TCP ports on 127.0.0.1.
func FreePorts(t testing.TB, n int) []int {
	t.Helper()
	ports, err := bench.FreePorts(n)
	if err != nil {
		t.Fatal(err)
	}
	return ports
}

// syncInterval is the JetStream sync setting of a configuration `authplane init` wrote.
var syncInterval = regexp.MustCompile(`(?m)^  sync_interval: .*$`)

// SyncingEvery rewrites the nats-server configuration at path, as `authplane init` wrote it, to
// sync its JetStream store every interval (a nats-server duration such as `"2m"`, or always).
func SyncingEvery(t testing.TB, path, interval string) {
	t.Helper()
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if n := len(syncInterval.FindAll(raw, -1)); n != 1 {
		t.Fatalf("%s has %d sync_interval settings, want the one init writes", path, n)
	}
	conf := syncInterval.ReplaceAllLiteralString(string(raw), "  sync_interval: "+interval)
	if err := os.WriteFile(path, []byte(conf), 0o644); err != nil {
		t.Fatal(err)
	}
}
