package documents

import (
	"flag"
	"fmt"
	"io"
	"maps"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/nats-io/nats-server/v2/server"
	"gopkg.in/yaml.v3"

	"github.com/cotal-ai/authplane/integration/internal/harness"
)

// No Docker engine runs here, so TestComposeFile checks docker-compose.yml by what can be run
// without one: the init command it names is run for real (its container paths moved under a temp
// dir), each NATS node's command line is parsed by nats-server's own flag and config parser
// against the config init wrote, and the serve flags are checked against `authplane serve -h`.

type composeFile struct {
	Services map[string]composeService `yaml:"services"`
	Volumes  map[string]any            `yaml:"volumes"`
}

type composeService struct {
	Build     any                               `yaml:"build"`
	Image     string                            `yaml:"image"`
	Command   []string                          `yaml:"command"`
	Volumes   []string                          `yaml:"volumes"`
	Ports     []string                          `yaml:"ports"`
	DependsOn map[string]composeDependsOnTarget `yaml:"depends_on"`
}

type composeDependsOnTarget struct {
	Condition string `yaml:"condition"`
}

// composeMount is a short-syntax volume entry, "name:/target[:ro]".
type composeMount struct {
	Volume, Target string
	ReadOnly       bool
}

func (s composeService) mounts(t *testing.T, name string) []composeMount {
	t.Helper()
	var ms []composeMount
	for _, v := range s.Volumes {
		parts := strings.Split(v, ":")
		if len(parts) < 2 || len(parts) > 3 || !filepath.IsAbs(parts[1]) || (len(parts) == 3 && parts[2] != "ro" && parts[2] != "rw") {
			t.Fatalf("service %s: volume %q: want name:/target[:ro]", name, v)
		}
		ms = append(ms, composeMount{Volume: parts[0], Target: parts[1], ReadOnly: len(parts) == 3 && parts[2] == "ro"})
	}
	return ms
}

// mountOf returns the mount whose target holds path.
func (s composeService) mountOf(t *testing.T, name, path string) (composeMount, bool) {
	for _, m := range s.mounts(t, name) {
		if path == m.Target || strings.HasPrefix(path, m.Target+"/") {
			return m, true
		}
	}
	return composeMount{}, false
}

func TestComposeFile(t *testing.T) {
	raw, err := os.ReadFile(filepath.Join(repoRoot, "docker-compose.yml"))
	if err != nil {
		t.Fatal(err)
	}
	var cf composeFile
	if err := yaml.Unmarshal(raw, &cf); err != nil {
		t.Fatalf("docker-compose.yml: %v (commands must be in list form)", err)
	}
	dockerfile, err := os.ReadFile(filepath.Join(repoRoot, "Dockerfile"))
	if err != nil {
		t.Fatal(err)
	}
	if !regexp.MustCompile(`(?m)^ENTRYPOINT \["authplane"\]$`).Match(dockerfile) {
		t.Fatal(`Dockerfile: want ENTRYPOINT ["authplane"], so a service's command is an authplane subcommand`)
	}

	var natsNames, planeNames, initNames []string
	for name, s := range cf.Services {
		switch {
		case len(s.Command) > 0 && s.Command[0] == "nats-server":
			natsNames = append(natsNames, name)
		case s.Build != nil && len(s.Command) > 0 && s.Command[0] == "serve":
			planeNames = append(planeNames, name)
		case s.Build != nil && len(s.Command) > 0 && s.Command[0] == "init":
			initNames = append(initNames, name)
		}
		for _, m := range s.mounts(t, name) {
			if _, ok := cf.Volumes[m.Volume]; !ok {
				t.Errorf("service %s mounts %q, which is not a named volume of the file", name, m.Volume)
			}
		}
	}
	slices.Sort(natsNames)
	slices.Sort(planeNames)
	if len(natsNames) != 3 || len(planeNames) != 2 || len(initNames) != 1 {
		t.Fatalf("want 3 nats-server services, 2 `authplane serve` and 1 `authplane init`; got %v, %v, %v", natsNames, planeNames, initNames)
	}

	bin := harness.AuthplaneBinary(t)
	tmp := t.TempDir()
	// host maps a path inside a container to the temp dir; every service mounts its volumes at
	// the same targets, so one tree stands for all of them.
	host := func(p string) string { return filepath.Join(tmp, "fs", p) }

	// init: the flags are real, it runs, and it writes nats-server.conf into the space volume.
	initName := initNames[0]
	initSvc := cf.Services[initName]
	initFlags := composeFlags(t, initName, initSvc.Command[1:], composeFlagSpec(t, bin, "init"))
	spaceDir, storeDir := initFlags["space-dir"], initFlags["server-store"]
	if spaceDir == "" || storeDir == "" || initFlags["listen"] == "" {
		t.Fatalf("%s: want --space-dir, --server-store and --listen; got %v", initName, initFlags)
	}
	spaceMount, ok := initSvc.mountOf(t, initName, spaceDir)
	if !ok || spaceMount.ReadOnly {
		t.Fatalf("%s: --space-dir %s is not in a writable volume", initName, spaceDir)
	}
	args := slices.Clone(initSvc.Command)
	for i, a := range args {
		if strings.HasPrefix(a, "/") {
			args[i] = host(a)
		}
	}
	for _, m := range initSvc.mounts(t, initName) {
		if err := os.MkdirAll(host(m.Target), 0o700); err != nil {
			t.Fatal(err)
		}
	}
	if out, err := harness.CombinedOutput(exec.Command(bin, args...)); err != nil {
		t.Fatalf("authplane %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	conf := initFlags["server-conf"]
	if conf == "" {
		conf = filepath.Join(spaceDir, "nats-server.conf")
	}
	if _, err := os.Stat(host(conf)); err != nil {
		t.Fatalf("init wrote no nats-server.conf: %v", err)
	}
	confMount, ok := initSvc.mountOf(t, initName, conf)
	if !ok || confMount.ReadOnly {
		t.Fatalf("%s: --server-conf %s is not in a writable volume", initName, conf)
	}

	// The NATS nodes: one cluster, each routing to all three, on init's config.
	prev := server.FlagSnapshot // ConfigureOptions sets this global; put it back
	t.Cleanup(func() { server.FlagSnapshot = prev })
	var clientPort int
	serverNames := map[string]bool{}
	dataVolumes := map[string]bool{}
	clusterNames := map[string]bool{}
	for _, name := range natsNames {
		s := cf.Services[name]
		if s.DependsOn[initName].Condition != "service_completed_successfully" {
			t.Errorf("%s: want depends_on %s: service_completed_successfully", name, initName)
		}
		if m, ok := s.mountOf(t, name, conf); !ok || m.Volume != confMount.Volume || m.Target != confMount.Target || !m.ReadOnly {
			t.Errorf("%s: want volume %s mounted read-only at %s", name, confMount.Volume, confMount.Target)
		}
		for _, m := range s.mounts(t, name) {
			if m.Volume == spaceMount.Volume {
				t.Errorf("%s: mounts the space material (%s); a NATS node needs only its config, never the secrets", name, m.Volume)
			}
		}
		data, ok := s.mountOf(t, name, storeDir)
		if !ok || data.ReadOnly || data.Volume == spaceMount.Volume || data.Volume == confMount.Volume || dataVolumes[data.Volume] {
			t.Errorf("%s: want its own writable volume at %s (init's --server-store)", name, storeDir)
		}
		dataVolumes[data.Volume] = true

		args := slices.Clone(s.Command[1:])
		var confArg string
		for i, a := range args {
			if strings.HasPrefix(a, "/") {
				if confArg == "" {
					confArg = a
				}
				args[i] = host(a)
			}
		}
		if confArg != conf {
			t.Errorf("%s: want the config init wrote, %s; got %q", name, conf, confArg)
		}
		fs := flag.NewFlagSet("nats-server", flag.ContinueOnError)
		fs.SetOutput(io.Discard)
		noop := func() {}
		opts, err := server.ConfigureOptions(fs, args, noop, noop, noop)
		if err != nil || opts == nil {
			t.Errorf("%s: nats-server refuses %v: %v", name, s.Command[1:], err)
			continue
		}
		if opts.ServerName == "" || serverNames[opts.ServerName] {
			t.Errorf("%s: want a distinct --name; got %q", name, opts.ServerName)
		}
		serverNames[opts.ServerName] = true
		clusterNames[opts.Cluster.Name] = true
		if opts.Cluster.Name == "" || opts.Cluster.Port == 0 {
			t.Errorf("%s: want --cluster_name and --cluster; got name %q, port %d", name, opts.Cluster.Name, opts.Cluster.Port)
		}
		var routes []string
		for _, r := range opts.Routes {
			if r.Port() != fmt.Sprint(opts.Cluster.Port) {
				t.Errorf("%s: route %s is not on the cluster port %d", name, r, opts.Cluster.Port)
			}
			routes = append(routes, r.Hostname())
		}
		slices.Sort(routes)
		if !slices.Equal(routes, natsNames) {
			t.Errorf("%s: want --routes to all of %v; got %v", name, natsNames, routes)
		}
		if !opts.JetStream || opts.StoreDir != host(filepath.Join(storeDir, "jetstream")) {
			t.Errorf("%s: want JetStream with its store in %s; got %v, %q", name, storeDir, opts.JetStream, opts.StoreDir)
		}
		if len(opts.TrustedOperators) != 1 || opts.AccountResolver == nil {
			t.Errorf("%s: want operator mode with an account resolver from init's config", name)
		}
		if !opts.SyncAlways {
			t.Errorf("%s: want every JetStream write synced to disk (sync_interval: always); got every %s", name, opts.SyncInterval)
		}
		// NewServer validates the options as a whole (JetStream in a cluster needs a server
		// name, and so on) without listening on anything.
		ns, err := server.NewServer(opts)
		if err != nil {
			t.Errorf("%s: nats-server would not start: %v", name, err)
			continue
		}
		ns.Shutdown()
		clientPort = opts.Port
	}
	if len(clusterNames) != 1 {
		t.Errorf("want one --cluster_name for all nodes; got %v", clusterNames)
	}

	// The plane replicas: every flag is one `serve` knows; the cluster, R3, the shared space
	// read-only, each its own claimed identity, and no state volume.
	serveSpec := composeFlagSpec(t, bin, "serve")
	instanceNames := map[string]bool{}
	for _, name := range planeNames {
		s := cf.Services[name]
		f := composeFlags(t, name, s.Command[1:], serveSpec)
		var hosts []string
		for _, u := range strings.Split(f["nats-url"], ",") {
			pu, err := url.Parse(u)
			if err != nil || pu.Scheme != "nats" || (clientPort != 0 && pu.Port() != fmt.Sprint(clientPort)) {
				t.Errorf("%s: --nats-url %q: want nats://<node>:%d", name, u, clientPort)
				continue
			}
			hosts = append(hosts, pu.Hostname())
		}
		slices.Sort(hosts)
		if !slices.Equal(hosts, natsNames) {
			t.Errorf("%s: want --nats-url naming %v; got %v", name, natsNames, hosts)
		}
		if f["replicas"] != "3" {
			t.Errorf("%s: want --replicas 3; got %q", name, f["replicas"])
		}
		if f["space"] != initFlags["space"] || f["space-dir"] != spaceDir {
			t.Errorf("%s: want --space %q --space-dir %s as init; got %q %q", name, initFlags["space"], spaceDir, f["space"], f["space-dir"])
		}
		if m, ok := s.mountOf(t, name, spaceDir); !ok || m.Volume != spaceMount.Volume || !m.ReadOnly {
			t.Errorf("%s: want volume %s mounted read-only holding %s", name, spaceMount.Volume, spaceDir)
		}
		if f["identity-store"] != "kv" || f["instance-name"] == "" || instanceNames[f["instance-name"]] {
			t.Errorf("%s: want --identity-store kv and an --instance-name no other replica uses; got %q %q", name, f["identity-store"], f["instance-name"])
		}
		instanceNames[f["instance-name"]] = true
		if m, ok := s.mountOf(t, name, f["dir"]); ok {
			t.Errorf("%s: mounts volume %s at its --dir %s; a replica with a claimed identity needs no state volume", name, m.Volume, f["dir"])
		}
		if f["dir"] == "" || !regexp.MustCompile(`(?m)^ && chown authplane:authplane .*`+regexp.QuoteMeta(" "+f["dir"])+`( |$)`).Match(dockerfile) {
			t.Errorf("%s: --dir %q: want a directory the image creates for its user (Dockerfile: chown authplane:authplane … %s)", name, f["dir"], f["dir"])
		}
		if s.DependsOn[initName].Condition != "service_completed_successfully" {
			t.Errorf("%s: want depends_on %s: service_completed_successfully", name, initName)
		}
		for _, n := range natsNames {
			if _, ok := s.DependsOn[n]; !ok {
				t.Errorf("%s: want depends_on %s", name, n)
			}
		}
	}
}

// composeFlagSpec reads `authplane <cmd> -h` and returns its flags, each with whether it takes
// a value (a flag package usage line is "  -name type" for a value, "  -name" for a bool).
func composeFlagSpec(t *testing.T, bin, cmd string) map[string]bool {
	t.Helper()
	out, err := harness.CombinedOutput(exec.Command(bin, cmd, "-h"))
	if err != nil {
		t.Fatalf("authplane %s -h: %v\n%s", cmd, err, out)
	}
	spec := map[string]bool{}
	for _, m := range regexp.MustCompile(`(?m)^  -(\S+)( \S+)?`).FindAllStringSubmatch(string(out), -1) {
		spec[m[1]] = m[2] != ""
	}
	if len(spec) == 0 {
		t.Fatalf("authplane %s -h lists no flags:\n%s", cmd, out)
	}
	return spec
}

// composeFlags parses a compose command's arguments against spec, as the flag package would.
func composeFlags(t *testing.T, service string, args []string, spec map[string]bool) map[string]string {
	t.Helper()
	got := map[string]string{}
	for i := 0; i < len(args); i++ {
		a := args[i]
		if !strings.HasPrefix(a, "-") {
			t.Fatalf("%s: unexpected argument %q", service, a)
		}
		name, value, hasValue := strings.Cut(strings.TrimLeft(a, "-"), "=")
		takesValue, known := spec[name]
		switch {
		case !known:
			t.Fatalf("%s: flag %q is not one the binary accepts (%v)", service, a, slices.Sorted(maps.Keys(spec)))
		case takesValue && !hasValue:
			if i+1 == len(args) {
				t.Fatalf("%s: flag %q has no value", service, a)
			}
			i++
			value = args[i]
		case !takesValue && !hasValue:
			value = "true"
		}
		got[name] = value
	}
	return got
}
