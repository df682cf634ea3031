package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"

	"github.com/cotal-ai/authplane/admin"
	"github.com/cotal-ai/authplane/internal/capability/manager"
	"github.com/cotal-ai/authplane/internal/platform/broker"
	"github.com/cotal-ai/authplane/internal/platform/space"
	"github.com/cotal-ai/authplane/service"
	"github.com/cotal-ai/authplane/subjects"
)

func serve(args []string, stdout, stderr io.Writer) error {
	cfg := service.Defaults()
	fs := newFlags("serve", "[flags]", stderr)
	fs.StringVar(&cfg.Dir, "dir", cfg.Dir, "process state directory (lock, identity, auth-service.json, embedded broker store)")
	fs.StringVar(&cfg.SpaceDir, "space-dir", "", "space material directory (default <dir>/space)")
	fs.StringVar(&cfg.Space, "space", cfg.Space, "space name")
	fs.StringVar(&cfg.NATSURL, "nats-url", "", "use this NATS cluster (set up by 'authplane init') instead of an embedded server")
	fs.IntVar(&cfg.NATSPort, "nats-port", cfg.NATSPort, "embedded NATS client port on 127.0.0.1 (0 to 65535; 0 = a free port)")
	fs.IntVar(&cfg.HTTPPort, "http-port", cfg.HTTPPort, "loopback HTTP port (0 to 65535; 0 = a free port)")
	fs.IntVar(&cfg.PublicPort, "public-port", cfg.PublicPort, "public HTTP port on --public-host, behind a TLS-ending proxy (-1 to 65535; 0 = a free port, -1 = none)")
	fs.StringVar(&cfg.PublicHost, "public-host", cfg.PublicHost, "the IP address the public face listens on (0.0.0.0 in a container whose --public-port is published)")
	fs.StringVar(&cfg.PublicURL, "public-url", "", "the public face's https:// URL as clients see it, or http:// on a loopback IP literal (the discovery bundle names it)")
	fs.BoolVar(&cfg.TrustedProxy, "trusted-proxy", false, "the public face is behind a proxy: its last X-Forwarded-For hop names the peer")
	fs.IntVar(&cfg.PublicPeerInFlight, "public-peer-inflight", cfg.PublicPeerInFlight, "requests one peer may have in flight on the public face, per replica (1 to 64, the face's own bound)")
	fs.IntVar(&cfg.LoopbackInFlight, "loopback-inflight", cfg.LoopbackInFlight, "door requests in flight on the loopback face, every holder of the capability together, per replica (1 to 4096)")
	fs.DurationVar(&cfg.HTTPBodyTimeout, "http-body-timeout", cfg.HTTPBodyTimeout, "how long a door of either HTTP face waits for a request's body after its headers (100ms to 10s)")
	fs.StringVar(&cfg.AdvertisedServer, "advertised-server", "", "the broker URL the discovery bundle gives clients (default: the plane's own)")
	fs.StringVar(&cfg.IdP.URL, "idp-url", "", "the identity provider the space trusts (human exchanges, manager-service-authority over HTTP)")
	fs.StringVar(&cfg.IdP.Issuer, "idp-issuer", "", "its tokens' exact iss (default: the --idp-url origin)")
	fs.StringVar(&cfg.IdP.Audience, "idp-audience", "", "its tokens' exact aud (default: the --idp-url origin)")
	fs.StringVar(&cfg.IdP.JWKS, "idp-jwks", "", "its key set: https, or http on a loopback IP literal (default: <idp-url>/jwks)")
	fs.BoolVar(&cfg.PProf, "pprof", false, "expose net/http/pprof on the loopback HTTP face (/debug/pprof/...)")
	fs.IntVar(&cfg.Replicas, "replicas", cfg.Replicas, "replicas of every bucket and stream (1, 3 or 5; 3 on a cluster)")
	fs.IntVar(&cfg.Workers, "workers", cfg.Workers, "requests each endpoint answers at once, per replica (1 to 1024; one micro service instance hands them over)")
	fs.Float64Var(&cfg.Rate, "rate", cfg.Rate, "requests per second per principal (0 to 1000000; 0 = no limit)")
	fs.IntVar(&cfg.Burst, "burst", cfg.Burst, "burst of the per-principal rate limit (1 to 1000000)")
	fs.IntVar(&cfg.OwnerInFlight, "owner-in-flight", cfg.OwnerInFlight, "requests of one endpoint one owner may have under way at once, per replica (0 to 1000000; 0 = no limit)")
	fs.DurationVar(&cfg.RequestTimeout, "request-timeout", cfg.RequestTimeout, "deadline of every request, retries included (100ms to 1m)")
	fs.DurationVar(&cfg.PlaneUserTTL, "plane-user-ttl", cfg.PlaneUserTTL, "lifetime of the plane's own NATS users, renewed at 2/3 (10s to 24h, and more than 3 × --request-timeout)")
	fs.DurationVar(&cfg.RotateSigningEvery, "rotate-signing-every", cfg.RotateSigningEvery, "begin a scheduled rotation of the data account's signing keys once they have signed this long (1h to 8760h; 0, the default: never)")
	fs.DurationVar(&cfg.StandingTTL, "standing-ttl", cfg.StandingTTL, "lifetime of standing credentials (5s to 24h)")
	fs.DurationVar(&cfg.MaxAssignmentTTL, "max-assignment-ttl", cfg.MaxAssignmentTTL, "longest platform supervisor assignment (1m to 8760h)")
	fs.Int64Var(&cfg.MaxSubscriptions, "max-subscriptions", cfg.MaxSubscriptions, "subscriptions each minted user may hold (1 to 1000000)")
	fs.Int64Var(&cfg.MaxPayload, "max-payload", cfg.MaxPayload, "largest message each minted user may publish, in bytes (1 KiB to 64 MiB)")
	fs.Int64Var(&cfg.MaxConnections, "max-connections", cfg.MaxConnections, "connections of the data account, every minted user's and the plane's serving ones (2 to 10000000)")
	fs.Int64Var(&cfg.ReservedConnections, "reserved-connections", cfg.ReservedConnections, "of --max-connections, those kept for the plane's own serving users, two per replica (at least 2, less than --max-connections)")
	fs.Int64Var(&cfg.MaxConnectionsPerPrincipal, "max-connections-per-principal", cfg.MaxConnectionsPerPrincipal, "connections one principal may hold in the data account (1 to --max-connections less --reserved-connections)")
	fs.Int64Var(&cfg.MaxConnectionsPerOwner, "max-connections-per-owner", cfg.MaxConnectionsPerOwner, "connections one owner's principals may hold together in the data account, and connect through the auth callout in a bearer's life of 905 s (--max-connections-per-principal to 10000000)")
	fs.IntVar(&cfg.MaxInstancesPerOwner, "max-instances-per-owner", cfg.MaxInstancesPerOwner, fmt.Sprintf("live (non-retired) manager instances one owner may register (1 to %d)", manager.MaxInstancesPerOwner))
	fs.IntVar(&cfg.NewKeysPerOwner, "new-keys-per-owner", cfg.NewKeysPerOwner, "user nkeys one owner may claim anew in 48 h (registrations' keys, run drivers and mediators), per space (10 to 10000000)")
	fs.IntVar(&cfg.ReregistrationsPerInstance, "reregistrations-per-instance", cfg.ReregistrationsPerInstance, "prepares of an already registered instance allowed an hour, per space (1 to --reregistrations-per-owner)")
	fs.IntVar(&cfg.ReregistrationsPerOwner, "reregistrations-per-owner", cfg.ReregistrationsPerOwner, "prepares of already registered instances one owner may make an hour, per space (--reregistrations-per-instance to 1000000)")
	fs.Int64Var(&cfg.WitnessBytes, "witness-bytes", cfg.WitnessBytes, "bytes of each owner's run-start witness stream: its run-starts of the last 5 minutes, its oldest dropped (at least 1 MiB, and --max-payload plus 4 KiB)")
	fs.Int64Var(&cfg.WitnessRuns, "witness-runs", cfg.WitnessRuns, "run-starts in each owner's witness stream, its oldest dropped (1 to 1000000)")
	fs.Int64Var(&cfg.MintedBytes, "minted-bytes", cfg.MintedBytes, "size bound of the minted stream in bytes, mints failing closed when it is full (at least 1 MiB)")
	fs.Int64Var(&cfg.AuditBytes, "audit-bytes", cfg.AuditBytes, "size bound of the audit stream in bytes, its oldest records dropped (at least 1 MiB)")
	fs.IntVar(&cfg.AuditRecords, "audit-records", cfg.AuditRecords, "full audit records of each decision one owner gets a minute per replica, the rest counted in one summary record (1 to 100000)")
	fs.IntVar(&cfg.AuditorConsumers, "auditor-consumers", cfg.AuditorConsumers, "consumers (auditors' readers) each of the minted and audit streams holds at once (1 to 10000)")
	fs.DurationVar(&cfg.DrainTimeout, "drain-timeout", cfg.DrainTimeout, "on SIGTERM, how long requests in flight get to finish once no new one is taken (0 to 10m)")
	fs.DurationVar(&cfg.ConnectTimeout, "connect-timeout", cfg.ConnectTimeout, "how long the start retries its first connection to NATS (--nats-url), with backoff; /health answers 503 meanwhile (0 to 1h)")
	fs.BoolVar(&cfg.AllowUnsynced, "allow-unsynced", false, "serve on NATS servers that do not sync every write to disk (an OS crash or power cut there can take back what the plane acknowledged), and run the embedded one so")
	fs.BoolVar(&cfg.RecreateStores, "recreate-stores", false, "start over: create the space's buckets and streams that are gone (lost with everything they held) instead of refusing to serve")
	fs.StringVar(&cfg.IdentityStore, "identity-store", cfg.IdentityStore, "where the instance identity lives: file (<dir>/identity.json) or kv (claimed in the space's secrets bucket under --instance-name)")
	fs.StringVar(&cfg.InstanceName, "instance-name", "", "the name a kv identity is claimed under (required with --identity-store kv; not the host name)")
	logFormat := fs.String("log-format", "text", "log format: text or json")
	logLevel := fs.String("log-level", "info", "log level: debug, info, warn or error")
	// The whole configuration is checked before anything starts, and every problem reported.
	problems, err := parseValues(fs, args)
	if err != nil {
		return err
	}
	log, err := newLogger(stderr, *logFormat, *logLevel)
	problems = append(problems, err, cfg.Validate())
	if err := errors.Join(problems...); err != nil {
		return fmt.Errorf("invalid configuration:\n%w", err)
	}
	if err := secretsAt(cfg); err != nil {
		return err
	}
	cfg.Logger = log

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	plane, err := service.Start(ctx, cfg)
	if err != nil {
		return err
	}
	printSummary(stdout, invocation(), cfg, plane.Info())

	select {
	case <-ctx.Done():
		stop() // a second signal ends the process at once
		log.Info("signal received; draining: no new request is taken", "drain_timeout", cfg.DrainTimeout)
		if err := plane.Close(); err != nil {
			return err
		}
		log.Info("stopped")
		return nil
	case <-plane.Done():
		err := plane.Close()
		if errors.Is(err, service.ErrFenced) {
			return fmt.Errorf("stopped: %w", err)
		}
		return err
	}
}

// secretsAt checks where a plane of cfg writes its secrets (the loopback capability and the
// embedded broker's store in its state directory, new material in its space directory): in a
// git work tree, git must ignore them.
func secretsAt(cfg service.Config) error {
	if err := secretAt("--dir", cfg.Dir, admin.ServiceInfoFile); err != nil {
		return err
	}
	if _, err := space.Load(cfg.SpaceDirOrDefault()); errors.Is(err, space.ErrNotFound) {
		return secretAt("--space-dir", cfg.SpaceDirOrDefault(), space.OwnerSecretFile)
	}
	return nil
}

func newLogger(w io.Writer, format, level string) (*slog.Logger, error) {
	var lv slog.Level
	if err := lv.UnmarshalText([]byte(level)); err != nil {
		return nil, fmt.Errorf("--log-level %q: want debug, info, warn or error", level)
	}
	opts := &slog.HandlerOptions{Level: lv, ReplaceAttr: durationsAsText}
	switch format {
	case "text":
		return slog.New(slog.NewTextHandler(w, opts)), nil
	case "json":
		return slog.New(slog.NewJSONHandler(w, opts)), nil
	}
	return nil, fmt.Errorf("--log-format %q: want text or json", format)
}

// durationsAsText writes a duration as its text form ("10s", "250ms") in either format: the
// JSON handler would write nanoseconds.
func durationsAsText(_ []string, a slog.Attr) slog.Attr {
	if a.Value.Kind() == slog.KindDuration {
		a.Value = slog.StringValue(a.Value.Duration().String())
	}
	return a
}

// exampleOwner is a well-formed owner for trying the plane by hand.
const exampleOwner = "u_aaaaaaaaaaaaaaaaaaaaaaaaaa"

// invocation is how to run this binary again from where it was started: `go run
// ./cmd/authplane` when `go run` built it, else the name or path it was started by.
func invocation() string {
	exe, err := os.Executable()
	if err != nil {
		exe = ""
	}
	return invocationOf(exe, os.Args[0])
}

// goRunBuild matches where `go run` puts the binaries it builds: a temporary go-build
// directory, or the build cache's `<hash>-d/` entries.
var goRunBuild = regexp.MustCompile(`/go-build[0-9]*/|/[0-9a-f]{64}-d/[^/]+$`)

// invocationOf is invocation for the executable at exe started as arg0.
func invocationOf(exe, arg0 string) string {
	if goRunBuild.MatchString(exe) {
		return "go run ./cmd/authplane"
	}
	return arg0
}

// printSummary prints where the plane serves, and commands to try it that work the way it was
// started (self runs this binary: `go run ./cmd/authplane`, `authplane`, `./authplane`).
func printSummary(w io.Writer, self string, cfg service.Config, info service.Info) {
	dir, err := filepath.Abs(cfg.Dir)
	if err != nil {
		dir = cfg.Dir
	}
	material := "reused"
	if info.CreatedMaterial {
		material = "created"
	}
	where := "existing cluster"
	if info.Embedded {
		where = "embedded, store in " + filepath.Join(dir, "nats")
	}
	fmt.Fprintf(w, "authplane %s serving space %q\n", service.Version, info.Space)
	fmt.Fprintf(w, "  instance  %s (epoch %d)\n", info.InstanceID, info.Epoch)
	fmt.Fprintf(w, "  nats      %s (%s)\n", broker.RedactURL(info.NATSURL), where)
	fmt.Fprintf(w, "  http      %s/health\n", info.HTTPURL)
	if info.PublicURL != "" {
		fmt.Fprintf(w, "  public    %s/.well-known/cotal-mesh\n", strings.TrimSuffix(info.PublicURL, "/"))
	}
	fmt.Fprintf(w, "  space     %s (%s)\n", info.SpaceDir, material)
	fmt.Fprintf(w, "  state     %s (%s)\n", dir, admin.ServiceInfoFile)
	fmt.Fprintf(w, "try it:\n")
	creds := filepath.Join(cfg.Dir, "cli.creds") // in the state directory: a secret stays out of the working tree
	fmt.Fprintf(w, "  %s creds --dir %s --role ops --owner %s --actor cli --out %s\n", self, cfg.Dir, exampleOwner, creds)
	fmt.Fprintf(w, "  nats --server %s --creds %s --inbox-prefix %s micro info %s\n",
		broker.RedactURL(info.NATSURL), creds, subjects.InboxPrefix(exampleOwner, "cli"), subjects.ServiceName)
}
