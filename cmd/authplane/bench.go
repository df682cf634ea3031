package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/cotal-ai/authplane/admin"
	"github.com/cotal-ai/authplane/internal/bench"
	"github.com/cotal-ai/authplane/service"
)

// benchCmd starts a plane (embedded broker, or --nats-url), measures it with internal/bench,
// and prints what it measured: a table, or with --json one object as the last line of stdout.
// Progress goes to stderr.
func benchCmd(args []string, stdout, stderr io.Writer) error {
	cfg := service.Defaults()
	b := bench.Config{Progress: stderr}
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.IntVar(&b.Requesters, "requesters", 32, "N: principals requesting at once, each on its own connection (1 to 1024)")
	fs.DurationVar(&b.Duration, "duration", 5*time.Second, "length of each measured phase, after a warm-up of a fifth of it, at most 1s (100ms to 10m)")
	phases := fs.String("phases", bench.PhaseOps, "phases to run, in this order: ops (the operations against the echo and mint ceilings), ends (supervisor-end with the space filled with live instances), owners (--owners owners each trying to register their quota and one more, then another owner's end), storm (bearer connections at once through the auth callout)")
	endFill := fs.String("end-fill", "0,1000,5000,max", "ends: the live instances to fill the space with, ascending (each 0 to 1000000, or max: the most below its capacity that leaves room for the phase's own ends)")
	endConcurrency := fs.String("end-concurrency", "1,8,20", "ends: how many supervisor-ends run at once, at each size (each 1 to 256)")
	fs.IntVar(&b.EndRounds, "end-rounds", 3, "ends: rounds of that many ends at once, at each size and concurrency (1 to 100)")
	fs.IntVar(&b.Owners, "owners", 1000, "owners: how many owners, each its own principal and connection, try to register --max-instances-per-owner instances and one more (1 to 10000)")
	storm := fs.String("storm", "1000,5000", "storm: how many bearer connections connect at once through the auth callout, each its own principal, and as many through the callout ceiling and with direct JWTs (each 1 to 100000)")
	ops := fs.String("ops", strings.Join(bench.Operations, ","), "operations to drive, in this order: renew, renewStandingBundle, prepare")
	fs.BoolVar(&b.OneInstance, "one-instance", false, "every requester renews (or prepares) one shared instance instead of its own")
	fs.IntVar(&cfg.Workers, "workers", cfg.Workers, "requests each endpoint of the plane answers at once, and the echo ceiling's service instances (1 to 1024)")
	fs.StringVar(&cfg.NATSURL, "nats-url", "", "use this NATS cluster (set up by 'authplane init') instead of an embedded server")
	fs.StringVar(&cfg.SpaceDir, "space-dir", "", "space material directory (default <dir>/space; with --nats-url, the one its servers were set up with)")
	fs.StringVar(&cfg.Space, "space", cfg.Space, "space name")
	fs.IntVar(&cfg.Replicas, "replicas", cfg.Replicas, "replicas of every bucket and stream (1, 3 or 5; 3 on a cluster: --cluster 3 sets it)")
	cluster := fs.Int("cluster", 0, "start a cluster of this many nats-servers in --dir (fresh space material, JetStream, routes on 127.0.0.1) and serve it as --nats-url would (0 to 5; 0 = an embedded server)")
	fs.BoolVar(&cfg.AllowUnsynced, "allow-unsynced", false, "run the broker (the embedded one, or --cluster's) without syncing every write to disk, as serve --allow-unsynced does, to measure what syncing costs")
	dir := fs.String("dir", "", "the bench plane's state directory (default: a temporary one, removed afterwards)")
	asJSON := fs.Bool("json", false, "print one JSON object as the last line of stdout instead of a table")
	cpuProfile := fs.String("cpuprofile", "", "write a CPU profile to this file: of the first operation's measured phase, or without ops of the largest storm through the callout")
	if err := parse(fs, args); err != nil {
		return err
	}
	b.Ops = strings.Split(*ops, ",")
	b.Phases = strings.Split(*phases, ",")
	b.Workers = cfg.Workers
	var problems []error
	for _, l := range []struct {
		flag string
		in   string
		out  *[]int
	}{{"--end-fill", *endFill, &b.EndFill}, {"--end-concurrency", *endConcurrency, &b.EndConcurrency}, {"--storm", *storm, &b.Storm}} {
		var err error
		in := l.in
		if l.flag == "--end-fill" {
			in = strings.ReplaceAll(in, "max", strconv.Itoa(bench.FillMax))
		}
		if *l.out, err = intList(in); err != nil {
			problems = append(problems, fmt.Errorf("%s %q: %w", l.flag, l.in, err))
		}
	}
	if err := b.Validate(); err != nil {
		problems = append(problems, err)
	}
	if cfg.Replicas != 1 && cfg.Replicas != 3 && cfg.Replicas != 5 {
		problems = append(problems, fmt.Errorf("--replicas %d: want 1, 3 or 5", cfg.Replicas))
	}
	switch {
	case *cluster < 0 || *cluster > 5:
		problems = append(problems, fmt.Errorf("--cluster %d: want 0 (an embedded server) to 5", *cluster))
	case *cluster > 0 && cfg.NATSURL != "":
		problems = append(problems, errors.New("--cluster starts its own servers: drop --nats-url"))
	case *cluster > 0 && !flagSet(fs, "replicas"):
		cfg.Replicas = 1
		if *cluster >= 3 {
			cfg.Replicas = 3
		}
	}
	if err := errors.Join(problems...); err != nil {
		return err
	}
	if *dir == "" {
		tmp, err := os.MkdirTemp("", "authplane-bench-")
		if err != nil {
			return err
		}
		defer os.RemoveAll(tmp)
		*dir = tmp
	} else if err := secretAt("--dir", *dir, admin.ServiceInfoFile); err != nil {
		return err
	}
	cfg.Dir = *dir
	benchPlane(&cfg, b)
	if *cpuProfile != "" {
		f, err := os.Create(*cpuProfile)
		if err != nil {
			return err
		}
		defer f.Close()
		if slices.Contains(b.Phases, bench.PhaseOps) {
			b.CPUProfile = f
		} else {
			b.StormProfile = f
		}
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	b.Broker = "embedded"
	switch {
	case *cluster > 0:
		fmt.Fprintf(stderr, "bench: starting a cluster of %d nats-servers in %s\n", *cluster, cfg.Dir)
		c, err := bench.StartCluster(filepath.Join(cfg.Dir, "cluster"), cfg.Space, *cluster, cfg.AllowUnsynced)
		if err != nil {
			return err
		}
		defer c.Shutdown()
		cfg.NATSURL, cfg.SpaceDir = c.URLs(), c.SpaceDir
		b.Broker = fmt.Sprintf("cluster of %d", c.Size())
	case cfg.NATSURL != "":
		b.Broker = "--nats-url"
	}
	b.Replicas, b.Synced = cfg.Replicas, !cfg.AllowUnsynced
	fmt.Fprintf(stderr, "bench: starting a plane (%d workers, replicas %d) in %s\n", cfg.Workers, cfg.Replicas, cfg.Dir)
	plane, err := service.Start(ctx, cfg)
	if err != nil {
		return err
	}
	report, err := measure(ctx, plane, cfg.MaxConnections, cfg.MaxInstancesPerOwner, cfg.Dir, b)
	if cerr := plane.Close(); cerr != nil && err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	if *asJSON {
		data, err := json.Marshal(report)
		if err != nil {
			return err
		}
		if _, err := fmt.Fprintln(stdout, string(data)); err != nil {
			return err
		}
	} else {
		printReport(stdout, report)
	}
	return unmeasured(report)
}

// benchPlane makes cfg the bench's plane: ports of its own, and no tenant budget but the
// quota (the bench measures the plane, not a tenant's budgets: one owner drives it all; the
// owners phase fills each owner's quota).
func benchPlane(cfg *service.Config, b bench.Config) {
	cfg.NATSPort, cfg.HTTPPort = 0, 0
	cfg.Rate, cfg.OwnerInFlight = 0, 0
	cfg.ReregistrationsPerInstance, cfg.ReregistrationsPerOwner = 1_000_000, 1_000_000
	cfg.NewKeysPerOwner = 10_000_000
	cfg.MaxConnectionsPerOwner = cfg.MaxConnections - cfg.ReservedConnections
	cfg.MaxInstancesPerOwner = max(cfg.MaxInstancesPerOwner, b.Requesters+1)
	// The plane logs every mint as it does in production; the lines are formatted and dropped.
	cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, &slog.HandlerOptions{Level: slog.LevelInfo}))
}

// unmeasured is an error naming each operation of r that no answer measured: a bench whose
// every request was refused measured nothing, and says so.
func unmeasured(r *bench.Report) error {
	var p []error
	for _, op := range r.Operations {
		if op.Requests == 0 {
			p = append(p, fmt.Errorf("%s: no request was answered (refused %v): nothing was measured", op.Op, op.Refused))
		}
	}
	return errors.Join(p...)
}

// intList parses a comma-separated list of integers.
func intList(s string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil {
			return nil, errors.New("want comma-separated integers")
		}
		out = append(out, n)
	}
	return out, nil
}

// flagSet reports whether the command line or the environment set flag name.
func flagSet(fs *flag.FlagSet, name string) bool {
	set := false
	fs.Visit(func(f *flag.Flag) { set = set || f.Name == name })
	_, fromEnv := os.LookupEnv(envName(envPrefix, name)) // parse sets those beside the flag package
	return set || fromEnv
}

// measure runs the bench against a started plane.
func measure(ctx context.Context, plane *service.Plane, maxConnections int64, maxPerOwner int, dir string, b bench.Config) (*bench.Report, error) {
	info := plane.Info()
	keys, err := (admin.Locate{SpaceDir: info.SpaceDir}).Keys()
	if err != nil {
		return nil, err
	}
	r, err := bench.Run(ctx, bench.Target{NATSURL: info.NATSURL, Keys: keys, MaxConnections: maxConnections, HTTPURL: info.HTTPURL,
		InstanceCapacity: info.InstanceCapacity, MaxInstancesPerOwner: maxPerOwner, Dir: dir}, b)
	if err == nil && ctx.Err() != nil {
		err = errors.New("interrupted")
	}
	return r, err
}

// printReport prints r as a table with the ceilings and ratios.
func printReport(w io.Writer, r *bench.Report) {
	synced := "syncing every write"
	if !r.Synced {
		synced = "not syncing every write (--allow-unsynced)"
	}
	fmt.Fprintf(w, "authplane bench: %s broker (replicas %d) %s, %d workers, %d CPUs, %s\n",
		r.Broker, r.Replicas, synced, r.Workers, r.CPUs, r.GoVersion)
	if len(r.Operations) > 0 {
		printOps(w, r)
	}
	if len(r.Ends) > 0 {
		printEnds(w, r.Ends)
	}
	if r.Owners != nil {
		printOwners(w, r.Owners)
	}
	if len(r.Storms) > 0 {
		printStorms(w, r.Storms)
	}
}

// printOwners prints the owners phase.
func printOwners(w io.Writer, o *bench.Owners) {
	fmt.Fprintf(w, "\n%d owners, quota %d each, space of %d: %d live instances, account JWT %d bytes\n",
		o.Owners, o.Quota, o.Capacity, o.Live, o.JWTBytes)
	fmt.Fprintf(w, "owners in: %d; instances × owners: %s\n", o.In, bench.HeldText(o.Held))
	fmt.Fprintf(w, "prepares registered: %d in %.1f s (all owners stopped at %.1f s); refused: %s\n",
		o.Prepares, o.FullS, o.AllS, refusedText(o.Refused))
	if o.Listed > 0 {
		fmt.Fprintf(w, "keys of prepares refused after their key was listed: %d when the owners stopped, all gone %.1f s later (-1: not in 3 min)\n", o.Listed, o.ListedS)
	}
	end := "done"
	if !o.EndDone {
		end = "NOT done " + o.EndRefused
	}
	fmt.Fprintf(w, "another owner's end: %s in %.0f ms; its credential refused by the broker: %v\n", end, o.EndMs, o.CredsRefused)
}

// printStorms prints the storm phase's runs.
func printStorms(w io.Writer, storms []bench.Storm) {
	fmt.Fprintf(w, "\n%-22s %7s %9s %10s %8s %8s %10s %12s %10s %8s  %s\n",
		"storm", "N", "connected", "all in s", "conn/s", "p50 ms", "p99 ms", "failed/tries", "cpu µs/c", "÷ceiling", "callout answers")
	for _, s := range storms {
		all, ratio := "-", "-"
		if s.AllS > 0 {
			all = fmt.Sprintf("%.2f", s.AllS)
		}
		if s.RatioToCeiling > 0 {
			ratio = fmt.Sprintf("%.3f", s.RatioToCeiling)
		}
		answers := "-"
		if s.Via == bench.ViaCallout {
			answers = refusedText(s.Answers)
		}
		fmt.Fprintf(w, "%-22s %7d %9d %10s %8.0f %8.0f %10.0f %12s %10.0f %8s  %s\n",
			s.Via, s.N, s.Connected, all, s.ConnectsPerS, s.P50, s.P99, fmt.Sprintf("%d/%d", s.FailedAttempts, s.Attempts), s.CPUPerConnect, ratio, answers)
	}
}

// printOps prints the operations with their ceilings.
func printOps(w io.Writer, r *bench.Report) {
	fmt.Fprintf(w, "\n%d requesters (one instance: %v), %.0fs a phase\n", r.Requesters, r.OneInstance, r.DurationS)
	fmt.Fprintf(w, "%-26s %10s %10s %8s %8s %8s %10s %8s %8s %8s %8s  %s\n",
		"", "req/s", "creds/s", "p50 ms", "p99 ms", "max ms", "cpu µs/req", "÷echo", "÷mint", "÷sync", "÷stream", "refused")
	fmt.Fprintf(w, "%-26s %10.0f %10s %8.2f %8.2f %8s %10.0f %8s %8s %8s %8s\n",
		"echo (ceiling)", r.CeilingEchoPerS, "-", r.EchoP50, r.EchoP99, "-", r.EchoCPU, "1", "-", "-", "-")
	fmt.Fprintf(w, "%-26s %10s %10.0f %8s %8s %8s %10s %8s %8s %8s %8s\n",
		"mint (ceiling)", "-", r.CeilingMintPerS, "-", "-", "-", "-", "-", "1", "-", "-")
	if d := r.Disk; d != nil {
		fmt.Fprintf(w, "%-26s %10.0f %10s %8s %8s %8s %10s %8s %8s %8s %8s  %.0f µs a write\n",
			"synced write (ceiling)", d.SyncedWritesPerS, "-", "-", "-", "-", "-", "-", "-", "1", "-", d.SyncedWriteUs)
		fmt.Fprintf(w, "%-26s %10.0f %10s %8s %8.2f %8s %10s %8s %8s %8s %8s\n",
			"synced stream, 1 at once", d.StreamPerS, "-", "-", d.StreamP99, "-", "-", "-", "-", "-", "-")
		fmt.Fprintf(w, "%-26s %10.0f %10s %8s %8.2f %8s %10s %8s %8s %8s %8s\n",
			fmt.Sprintf("synced stream, %d at once", d.Publishers), d.StreamConcurrentPerS, "-", "-", d.StreamConcurrentP99, "-", "-", "-", "-", "-", "1")
	}
	for _, p := range r.Operations {
		fmt.Fprintf(w, "%-26s %10.0f %10.0f %8.2f %8.2f %8.2f %10.0f %8.3f %8.3f %8.3f %8.3f  %v\n",
			p.Op, p.RequestsPerS, p.CredentialsPerS, p.P50, p.P99, p.Max, p.CPUPerRequest, p.RatioToEcho, p.RatioToMint, p.RatioToSync, p.RatioToStream, refusedText(p.Refused))
	}
}

// printEnds prints the end phase's cells.
func printEnds(w io.Writer, cells []bench.EndCell) {
	fmt.Fprintf(w, "\n%-20s %8s %8s %8s %8s %8s %10s %10s  %s\n",
		"supervisor-end", "at once", "ends/s", "p50 ms", "p99 ms", "max ms", "signers", "JWT bytes", "failed")
	for _, c := range cells {
		failed := refusedText(c.Failed)
		if c.NotEvicted > 0 {
			failed += fmt.Sprintf(" (%d confirmed but not all evicted)", c.NotEvicted)
		}
		fmt.Fprintf(w, "%-20s %8d %8.1f %8.0f %8.0f %8.0f %10d %10d  %s\n",
			fmt.Sprintf("%d live", c.Fill), c.Concurrency, c.EndsPerS, c.P50, c.P99, c.Max, c.Signers, c.JWTBytes, failed)
	}
}

func refusedText(m map[string]int) string {
	if len(m) == 0 {
		return "none"
	}
	var parts []string
	for _, code := range slices.Sorted(maps.Keys(m)) {
		parts = append(parts, fmt.Sprintf("%s %d", code, m[code]))
	}
	return strings.Join(parts, ", ")
}
