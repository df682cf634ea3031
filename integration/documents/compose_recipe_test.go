package documents

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"gopkg.in/yaml.v3"

	"github.com/cotal-ai/authplane/integration/internal/harness"
	"github.com/cotal-ai/authplane/internal/testkit"
	"github.com/cotal-ai/authplane/subjects"
)

// composeHost runs docker-compose.yml's services the way their containers would, without
// docker: each container path in a named volume is a directory of that volume under root, any
// other is the container's own; the published ports are free ports on 127.0.0.1.
type composeHost struct {
	t    *testing.T
	cf   composeFile
	root string
	// published maps a host port of the file ("8443") to the port it is served on here.
	published map[string]string
	// loopback maps a replica to its loopback face's URL here.
	loopback map[string]string
}

// path is where container path p of service svc lives here.
func (h *composeHost) path(svc, p string) string {
	if m, ok := h.cf.Services[svc].mountOf(h.t, svc, p); ok {
		return filepath.Join(h.root, "volumes", m.Volume, strings.TrimPrefix(p, m.Target))
	}
	return filepath.Join(h.root, "containers", svc, p)
}

// containerArgs is args with every absolute path moved to where service svc's lives here.
func (h *composeHost) containerArgs(svc string, args []string) []string {
	out := slices.Clone(args)
	for i, a := range out {
		if strings.HasPrefix(a, "/") {
			out[i] = h.path(svc, a)
		}
	}
	return out
}

// hostURL is a URL the file gives for the host's loopback (a published port), served here.
func (h *composeHost) hostURL(raw string) string {
	u, err := url.Parse(raw)
	if err != nil || u.Hostname() != "127.0.0.1" || h.published[u.Port()] == "" {
		h.t.Fatalf("%q: want a URL on a port the file publishes on 127.0.0.1 (%v)", raw, h.published)
	}
	u.Host = "127.0.0.1:" + h.published[u.Port()]
	return u.String()
}

// publish returns the ports service svc publishes, each "127.0.0.1:HOST:CONTAINER", as
// container port to host port.
func (h *composeHost) publish(svc string) map[string]string {
	ports := map[string]string{}
	for _, p := range h.cf.Services[svc].Ports {
		parts := strings.Split(p, ":")
		if len(parts) != 3 || parts[0] != "127.0.0.1" {
			h.t.Fatalf("%s publishes %q: want 127.0.0.1:HOST:CONTAINER, on the host's loopback only", svc, p)
		}
		ports[parts[2]] = parts[1]
	}
	return ports
}

// TestComposeRecipeRunsAsWritten runs docker-compose.yml as its containers would, without
// docker (which does not run here): init once; the three NATS nodes, in process, from the
// configuration it wrote, each with its own store as its own volume; both replicas' serve
// commands with the published ports served on free ones; then, in order, every command of the
// header's recipe. The published public faces answer, the bundle names the published broker and
// face, and the operator credential the header makes lets `nats micro info` list the service
// (a caller's meets a permissions violation, and the CLI still exits 0).
func TestComposeRecipeRunsAsWritten(t *testing.T) {
	t.Parallel()
	harness.Long(t, "runs a three-node cluster and two replicas")
	raw, err := os.ReadFile(filepath.Join(repoRoot, "docker-compose.yml"))
	if err != nil {
		t.Fatal(err)
	}
	h := &composeHost{t: t, root: t.TempDir(), published: map[string]string{}, loopback: map[string]string{}}
	if err := yaml.Unmarshal(raw, &h.cf); err != nil {
		t.Fatalf("docker-compose.yml does not parse: %v", err)
	}
	bin := harness.AuthplaneBinary(t)
	var natsNames, planeNames []string
	for name, s := range h.cf.Services {
		switch {
		case len(s.Command) > 0 && s.Command[0] == "nats-server":
			natsNames = append(natsNames, name)
		case len(s.Command) > 0 && s.Command[0] == "serve":
			planeNames = append(planeNames, name)
		}
	}
	slices.Sort(natsNames)
	slices.Sort(planeNames)

	// init, once. Its --server-store is the nodes' /data, a volume of each node's own: the
	// configuration it writes names it, and each node reads it as its own.
	initFlags := composeFlags(t, "init", h.cf.Services["init"].Command[1:], composeFlagSpec(t, bin, "init"))
	if out, err := harness.CombinedOutput(exec.Command(bin, h.containerArgs("init", h.cf.Services["init"].Command)...)); err != nil {
		t.Fatalf("init: %v\n%s", err, out)
	}
	conf, err := os.ReadFile(h.path("init", initFlags["server-conf"]))
	if err != nil {
		t.Fatal(err)
	}
	store := h.path("init", initFlags["server-store"])
	if !strings.Contains(string(conf), store) {
		t.Fatalf("init's nats-server.conf does not name its --server-store %s", initFlags["server-store"])
	}

	// The NATS nodes, each on a free client port; their cluster ports free ones too.
	routes := map[string]int{}
	for i, p := range harness.FreePorts(t, len(natsNames)) {
		routes[natsNames[i]] = p
	}
	prev := server.FlagSnapshot // ConfigureOptions sets this global; put it back
	t.Cleanup(func() { server.FlagSnapshot = prev })
	clients := map[string]string{}
	var nodes []*server.Server
	for _, name := range natsNames {
		s := h.cf.Services[name]
		own := filepath.Join(h.root, name+".conf")
		if err := os.WriteFile(own, []byte(strings.ReplaceAll(string(conf), store, h.path(name, initFlags["server-store"]))), 0o644); err != nil {
			t.Fatal(err)
		}
		args := slices.Clone(s.Command[1:])
		args[slices.Index(args, "-c")+1] = own
		fs := flag.NewFlagSet("nats-server", flag.ContinueOnError)
		fs.SetOutput(io.Discard)
		noop := func() {}
		opts, err := server.ConfigureOptions(fs, args, noop, noop, noop)
		if err != nil {
			t.Fatalf("%s: nats-server refuses %v: %v", name, s.Command[1:], err)
		}
		port := opts.Port // the client port the file's configuration gives it
		opts.Host, opts.Port, opts.HTTPPort = "127.0.0.1", server.RANDOM_PORT, 0
		opts.Cluster.Host, opts.Cluster.Port = "127.0.0.1", routes[name]
		for _, r := range opts.Routes {
			r.Host = fmt.Sprintf("127.0.0.1:%d", routes[r.Hostname()])
		}
		srv := harness.RunServer(t, opts, name)
		nodes = append(nodes, srv)
		clients[name] = srv.ClientURL()
		for container, hostPort := range h.publish(name) {
			if container != strconv.Itoa(port) {
				t.Fatalf("%s publishes container port %s, want its client port %d", name, container, port)
			}
			h.published[hostPort] = strings.TrimPrefix(srv.ClientURL(), "nats://127.0.0.1:")
		}
	}
	waitFormed(t, nodes)

	// The replicas, each as its container runs it.
	spec := composeFlagSpec(t, bin, "serve")
	for _, name := range planeNames {
		f := composeFlags(t, name, h.cf.Services[name].Command[1:], spec)
		hostPort := h.publish(name)[f["public-port"]]
		if hostPort == "" {
			t.Fatalf("%s: --public-port %q is not a port it publishes (%v)", name, f["public-port"], h.cf.Services[name].Ports)
		}
		h.published[hostPort] = strconv.Itoa(harness.FreePorts(t, 1)[0])
		var args []string
		for flagName, value := range f {
			switch flagName {
			case "nats-url":
				var urls []string
				for _, u := range strings.Split(value, ",") {
					pu, err := url.Parse(u)
					if err != nil || clients[pu.Hostname()] == "" {
						t.Fatalf("%s: --nats-url %q names no NATS node of the file", name, u)
					}
					urls = append(urls, clients[pu.Hostname()])
				}
				value = strings.Join(urls, ",")
			case "space-dir", "dir":
				value = h.path(name, value)
			case "http-port":
				value = "0"
			case "public-port":
				value = h.published[hostPort]
			case "public-url", "advertised-server":
				value = h.hostURL(value)
			}
			args = append(args, "--"+flagName, value)
		}
		if f["public-port"] == "" || f["public-url"] == "" {
			t.Fatalf("%s: want --public-port published and --public-url the host reaches it at", name)
		}
		proc := harness.StartAuthplane(t, append([]string{"serve"}, args...)...)
		info := harness.WaitReady(t, proc, h.path(name, f["dir"]))
		h.loopback[name] = info.URL
		bundle := harness.Get(t, h.hostURL(f["public-url"])+"/.well-known/cotal-mesh")
		var b struct{ Server string }
		if err := json.Unmarshal(bundle.Body, &b); bundle.Status != http.StatusOK || err != nil || b.Server != h.hostURL(f["advertised-server"]) {
			t.Errorf("%s: the bundle at its published face: %d %s; want its server the published broker", name, bundle.Status, bundle.Body)
		}
	}

	h.runRecipe(t, bin, string(raw))
}

// recipeLine is one command of the compose file's header.
var recipeLine = regexp.MustCompile(`(?m)^#   ((?:docker compose (?:exec|cp)|mkdir|nats|curl) .*)$`)

// runRecipe runs, in order, every command of the compose file's header (`#   ` then a command)
// as the host would: `docker compose exec` runs in the service's container, `cp` copies out of
// it, `nats`, `curl` and `mkdir` run on the host (a directory of its own).
func (h *composeHost) runRecipe(t *testing.T, bin, file string) {
	hostDir := filepath.Join(h.root, "host")
	if err := os.MkdirAll(hostDir, 0o700); err != nil {
		t.Fatal(err)
	}
	onHost := func(p string) string { return filepath.Join(hostDir, p) }
	var ran []string
	for _, m := range recipeLine.FindAllStringSubmatch(file, -1) {
		words := strings.Fields(m[1])
		ran = append(ran, m[1])
		switch {
		case words[0] == "docker" && words[2] == "exec" && words[4] == "authplane":
			out, err := harness.CombinedOutput(exec.Command(bin, h.containerArgs(words[3], words[5:])...))
			if err != nil {
				t.Fatalf("%s: %v\n%s", m[1], err, out)
			}
		case words[0] == "docker" && words[2] == "exec" && words[4] == "wget":
			u, err := url.Parse(words[len(words)-1])
			if err != nil || h.loopback[words[3]] == "" {
				t.Fatalf("%s: want a URL of a replica's loopback face", m[1])
			}
			if r := harness.Get(t, h.loopback[words[3]]+u.Path); r.Status != http.StatusOK {
				t.Errorf("%s: got %d %s", m[1], r.Status, r.Body)
			}
		case words[0] == "docker" && words[2] == "cp":
			svc, from, ok := strings.Cut(words[3], ":")
			data, err := os.ReadFile(h.path(svc, from))
			if !ok || err != nil {
				t.Fatalf("%s: %v", m[1], err)
			}
			if err := os.WriteFile(onHost(words[4]), data, 0o600); err != nil {
				t.Fatalf("%s: %v", m[1], err)
			}
		case words[0] == "mkdir":
			if err := os.MkdirAll(onHost(words[len(words)-1]), 0o700); err != nil {
				t.Fatal(err)
			}
		case words[0] == "curl":
			if r := harness.Get(t, h.hostURL(words[len(words)-1])); r.Status != http.StatusOK {
				t.Errorf("%s: got %d %s", m[1], r.Status, r.Body)
			}
		case words[0] == "nats":
			natsCLI, err := exec.LookPath("nats")
			if err != nil {
				t.Logf("%s: the nats CLI is not on PATH; not run", m[1])
				continue
			}
			args := slices.Clone(words[1:])
			for i, a := range args {
				switch {
				case i > 0 && args[i-1] == "--server":
					args[i] = h.hostURL(a)
				case i > 0 && args[i-1] == "--creds":
					args[i] = onHost(a)
				}
			}
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			cmd := exec.CommandContext(ctx, natsCLI, args...)
			cmd.Env = append(os.Environ(), "HOME="+t.TempDir(), "XDG_CONFIG_HOME="+t.TempDir()) // no saved contexts
			out, err := harness.CombinedOutput(cmd)
			cancel()
			if err != nil || strings.Contains(string(out), "Permissions Violation") || !strings.Contains(string(out), subjects.EndpointSupervisorEnd) {
				t.Errorf("%s: %v\n%s\nwant the service's endpoints listed", m[1], err, out)
			}
		default:
			t.Fatalf("%s: a command this test does not know how to run", m[1])
		}
	}
	for what, has := range map[string]func(string) bool{
		"an operator's credential":    func(r string) bool { return strings.Contains(r, " creds ") && strings.Contains(r, "--role ops") },
		"nats micro info":             func(r string) bool { return strings.HasPrefix(r, "nats ") && strings.Contains(r, " micro info ") },
		"a published face, with curl": func(r string) bool { return strings.HasPrefix(r, "curl ") },
	} {
		if !slices.ContainsFunc(ran, has) {
			t.Errorf("the header's recipe %q: want %s", ran, what)
		}
	}
}

// waitFormed waits until every node routes to every other and JetStream has one meta leader
// that knows them all: before, an R3 stream is refused.
func waitFormed(t *testing.T, nodes []*server.Server) {
	t.Helper()
	testkit.CheckFor(t, 20*time.Second, 50*time.Millisecond, func() error {
		leaders := 0
		for _, s := range nodes {
			if got := s.NumRemotes(); got != len(nodes)-1 {
				return fmt.Errorf("server %s routes to %d servers, want %d", s.Name(), got, len(nodes)-1)
			}
			if s.JetStreamIsLeader() {
				leaders++
				if got := len(s.JetStreamClusterPeers()); got != len(nodes) {
					return fmt.Errorf("the meta leader knows %d servers online, want %d", got, len(nodes))
				}
			}
		}
		if leaders != 1 {
			return fmt.Errorf("%d JetStream meta leaders, want 1", leaders)
		}
		return nil
	})
}
