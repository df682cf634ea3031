// Package bench measures a running plane against its own ceilings: N requesters, each its own
// principal on its own connection, drive renew, renewStandingBundle and prepare for a fixed
// time, and in the same run a trivial micro echo service (same broker, same N, same body size),
// the mint alone (same signer) and synced writes in the plane's directory (a file, a stream)
// say what the machine allows.
package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"runtime"
	"runtime/pprof"
	"slices"
	"time"

	"github.com/cotal-ai/authplane/client"
	"github.com/cotal-ai/authplane/internal/core/issue"
	"github.com/cotal-ai/authplane/internal/platform/space"
)

// Phases of a run, in the order they run: the operations against their ceilings, the
// supervisor ends in a space filled with live instances, the reconnect storm through the callout.
const (
	PhaseOps   = "ops"
	PhaseEnds  = "ends"
	PhaseStorm = "storm"
	// PhaseOwners: owners each trying to fill their quota, then another owner's end.
	PhaseOwners = "owners"
)

// Phases lists every phase in the order a run takes them.
var Phases = []string{PhaseOps, PhaseEnds, PhaseOwners, PhaseStorm}

// Operations the bench drives, in the order it drives them: prepare re-registers every
// instance, so it runs last.
var Operations = []string{client.OpRenew, client.OpRenewStandingBundle, client.OpPrepare}

// Config is what one run measures.
type Config struct {
	// Phases are the phases to run, a subset of Phases.
	Phases []string
	// Requesters is N: how many principals request at once, each on its own connection.
	Requesters int
	// Duration is how long each measured phase lasts, after a warm-up of a fifth of it (at
	// most a second) that is not counted.
	Duration time.Duration
	// Ops are the operations to drive, a subset of Operations.
	Ops []string
	// OneInstance makes every requester renew (or prepare) one shared instance instead of its
	// own.
	OneInstance bool
	// Workers is how many micro service instances serve the echo ceiling: the plane's own
	// --workers, so the echo answers as many requests at once as the plane's endpoint does.
	Workers int
	// EndFill are the live instances the end phase fills the space with, in ascending
	// order; EndConcurrency the numbers of ends it runs at once at each; EndRounds how many
	// rounds of them at each.
	EndFill        []int
	EndConcurrency []int
	EndRounds      int
	// Owners is how many owners the owners phase fills the space with.
	Owners int
	// Storm are the sizes of the reconnect storms: N connections at once, each its own
	// principal.
	Storm []int
	// StormProfile, when set, receives a CPU profile of the largest storm through the plane's
	// callout.
	StormProfile io.Writer
	// Broker names what the plane serves on, for the report: "embedded", "cluster of 3",
	// "--nats-url"; Replicas is its buckets' and streams' replicas.
	Broker   string
	Replicas int
	// Synced says the broker syncs every write to disk before it acknowledges it; false with
	// --allow-unsynced.
	Synced bool
	// Progress receives a line per phase; nil discards them.
	Progress io.Writer
	// CPUProfile, when set, receives a CPU profile of the first operation's measured phase.
	CPUProfile io.Writer
}

// Validate returns every problem with c at once.
func (c Config) Validate() error {
	var p []error
	if c.Requesters < 1 || c.Requesters > 1024 {
		p = append(p, fmt.Errorf("--requesters %d: want 1 to 1024", c.Requesters))
	}
	if c.Duration < 100*time.Millisecond || c.Duration > 10*time.Minute {
		p = append(p, fmt.Errorf("--duration %s: want 100ms to 10m", c.Duration))
	}
	if c.Workers < 1 || c.Workers > 1024 {
		p = append(p, fmt.Errorf("--workers %d: want 1 to 1024", c.Workers))
	}
	for _, ph := range c.Phases {
		if !slices.Contains(Phases, ph) {
			p = append(p, fmt.Errorf("--phases: %q is not one of ops, ends, owners, storm", ph))
		}
	}
	if len(c.Phases) == 0 {
		p = append(p, errors.New("--phases: want at least one of ops, ends, owners, storm"))
	}
	if c.Owners < 1 || c.Owners > 10_000 {
		p = append(p, fmt.Errorf("--owners %d: want 1 to 10000", c.Owners))
	}
	// Every flag is held to its range, whichever phases run.
	p = append(p, c.validateEnds()...)
	if len(c.Storm) == 0 || slices.Min(c.Storm) < 1 || slices.Max(c.Storm) > 100_000 {
		p = append(p, fmt.Errorf("--storm %v: want 1 to 100000 connections each", c.Storm))
	}
	if len(c.Ops) == 0 {
		p = append(p, errors.New("--ops: want at least one of renew, renewStandingBundle, prepare"))
	}
	for _, op := range c.Ops {
		if !slices.Contains(Operations, op) {
			p = append(p, fmt.Errorf("--ops: %q is not one of renew, renewStandingBundle, prepare", op))
		}
	}
	return errors.Join(p...)
}

func (c Config) validateEnds() []error {
	var p []error
	if len(c.EndFill) == 0 || slices.ContainsFunc(c.EndFill, func(f int) bool { return f < FillMax || f > 1_000_000 }) {
		p = append(p, fmt.Errorf("--end-fill %v: want sizes from 0 in ascending order, or max", c.EndFill))
	}
	if len(c.EndConcurrency) == 0 || slices.Min(c.EndConcurrency) < 1 || slices.Max(c.EndConcurrency) > 256 {
		p = append(p, fmt.Errorf("--end-concurrency %v: want 1 to 256 each", c.EndConcurrency))
	}
	if c.EndRounds < 1 || c.EndRounds > 100 {
		p = append(p, fmt.Errorf("--end-rounds %d: want 1 to 100", c.EndRounds))
	}
	return p
}

// runs says whether the run includes phase.
func (c Config) runs(phase string) bool { return slices.Contains(c.Phases, phase) }

func (c Config) warmup() time.Duration { return min(c.Duration/5, time.Second) }

// Target is the running plane a bench drives.
type Target struct {
	// NATSURL is the broker the plane serves on.
	NATSURL string
	// Keys is the plane's space material: the bench signs its requesters' credentials, its echo
	// user and its mint ceiling with it.
	Keys *space.Keys
	// MaxConnections is the plane's limit on the data account's connections, which the data
	// account's JWT carries: the bench signs that JWT as the plane does when it fills the
	// space with live instances.
	MaxConnections int64
	// HTTPURL is the plane's loopback HTTP face; its metrics count the callout's answers.
	HTTPURL string
	// InstanceCapacity is the most live manager instances the space holds;
	// MaxInstancesPerOwner the most one owner may register.
	InstanceCapacity     int
	MaxInstancesPerOwner int
	// Dir is the plane's state directory: where the disk ceilings are measured.
	Dir string
}

// Phase is what one measured phase counted. Rates count successful requests only; refusals
// are counted apart, by code.
type Phase struct {
	Op       string         `json:"op"`
	Requests int            `json:"requests"`
	Refused  map[string]int `json:"refused,omitempty"`
	// RequestsPerS and CredentialsPerS are per second of the phase.
	RequestsPerS    float64 `json:"requests_per_s"`
	CredentialsPerS float64 `json:"credentials_per_s"`
	// Latencies of the successful requests, in milliseconds.
	P50 float64 `json:"p50_ms"`
	P90 float64 `json:"p90_ms"`
	P99 float64 `json:"p99_ms"`
	Max float64 `json:"max_ms"`
	// CPUPerRequest is the process's CPU time (plane, broker and requesters alike, all in this
	// process unless the broker is elsewhere) per successful request, in microseconds; 0 where
	// the platform does not say.
	CPUPerRequest float64 `json:"cpu_us_per_request"`
	// RatioToEcho and RatioToMint compare the phase with the ceilings of the same run, and
	// RatioToSync and RatioToStream with its disk's: synced writes, and a synced stream's
	// publishes at N publishers.
	RatioToEcho   float64 `json:"ratio_to_echo"`
	RatioToMint   float64 `json:"ratio_to_mint"`
	RatioToSync   float64 `json:"ratio_to_synced_write"`
	RatioToStream float64 `json:"ratio_to_synced_stream"`
}

// Report is a whole run. Its top-level rates are the first operation's; Operations has each.
type Report struct {
	Requesters  int    `json:"requesters"`
	OneInstance bool   `json:"one_instance"`
	Workers     int    `json:"workers"`
	Broker      string `json:"broker"`
	Replicas    int    `json:"replicas"`
	Synced      bool   `json:"synced"`
	CPUs        int    `json:"cpus"`
	GoVersion   string `json:"go"`
	// DurationS is each measured phase's length, in seconds.
	DurationS float64 `json:"duration_s"`
	Phase
	// CeilingEchoPerS is the echo service's requests per second at the same N and body size;
	// EchoP50 and EchoP99 its latencies (ms).
	CeilingEchoPerS float64 `json:"ceiling_echo_per_s"`
	EchoP50         float64 `json:"echo_p50_ms"`
	EchoP99         float64 `json:"echo_p99_ms"`
	EchoCPU         float64 `json:"echo_cpu_us_per_request"`
	// CeilingMintPerS is credentials per second signed (and validated) by the plane's mint
	// alone, with the same signing key, on every CPU.
	CeilingMintPerS float64 `json:"ceiling_mint_per_s"`
	// Disk is what the state directory allows a durable write.
	Disk       *Disk   `json:"disk,omitempty"`
	Operations []Phase `json:"operations"`
	// Ends are the end phase's cells.
	Ends []EndCell `json:"ends,omitempty"`
	// Owners is the owners phase.
	Owners *Owners `json:"owners,omitempty"`
	// Storms are the storm phase's runs: for each N, the ceiling, the callout, direct JWTs.
	Storms []Storm `json:"storms,omitempty"`
}

// Run measures t, phase by phase: the operations against the echo and mint ceilings, then the
// supervisor ends, then the owners filling the space and another owner's end (after the end
// phase, in a space that phase filled), then the reconnect storm, each if cfg names it.
func Run(ctx context.Context, t Target, cfg Config) (*Report, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	progress := cfg.Progress
	if progress == nil {
		progress = io.Discard
	}
	r := &Report{Requesters: cfg.Requesters, OneInstance: cfg.OneInstance, Workers: cfg.Workers,
		Broker: cfg.Broker, Replicas: cfg.Replicas, Synced: cfg.Synced, CPUs: runtime.GOMAXPROCS(0), GoVersion: runtime.Version(), DurationS: cfg.Duration.Seconds()}
	if cfg.runs(PhaseOps) {
		if err := runOps(ctx, t, cfg, r, progress); err != nil {
			return nil, err
		}
	}
	if !cfg.runs(PhaseEnds) && !cfg.runs(PhaseOwners) && !cfg.runs(PhaseStorm) {
		return r, nil
	}
	s, err := openSide(ctx, t)
	if err != nil {
		return nil, err
	}
	defer s.close()
	if cfg.runs(PhaseEnds) {
		if r.Ends, err = runEnds(ctx, t, s, cfg, progress); err != nil {
			return nil, fmt.Errorf("end phase: %w", err)
		}
	}
	if cfg.runs(PhaseOwners) {
		if r.Owners, err = runOwners(ctx, t, s, cfg, progress); err != nil {
			return nil, fmt.Errorf("owners phase: %w", err)
		}
	}
	if cfg.runs(PhaseStorm) {
		if r.Storms, err = runStorms(ctx, t, s, cfg, progress); err != nil {
			return nil, fmt.Errorf("storm phase: %w", err)
		}
	}
	return r, nil
}

// runOps registers the requesters, measures the echo and mint ceilings, then drives each
// operation of cfg in Operations' order, into r.
func runOps(ctx context.Context, t Target, cfg Config, r *Report, progress io.Writer) error {
	iss, err := issue.NewIssuer(t.Keys.Data.Public(), t.Keys.Data.Signer, time.Now)
	if err != nil {
		return err
	}
	fmt.Fprintf(progress, "bench: registering %d requesters (one instance: %v)\n", cfg.Requesters, cfg.OneInstance)
	reqs, err := register(ctx, t, cfg)
	defer closeAll(reqs)
	if err != nil {
		return err
	}
	echo, err := echoCeiling(ctx, t, iss, cfg, reqs)
	if err != nil {
		return err
	}
	r.CeilingEchoPerS, r.EchoP50, r.EchoP99, r.EchoCPU = echo.RequestsPerS, echo.P50, echo.P99, echo.CPUPerRequest
	fmt.Fprintf(progress, "bench: echo ceiling %.0f req/s, p50 %.2f ms, p99 %.2f ms\n", echo.RequestsPerS, echo.P50, echo.P99)

	if r.CeilingMintPerS, err = mintCeiling(ctx, iss, t.Keys.Space, cfg); err != nil {
		return err
	}
	fmt.Fprintf(progress, "bench: mint ceiling %.0f credentials/s\n", r.CeilingMintPerS)
	if r.Disk, err = diskCeiling(ctx, t.Dir, cfg); err != nil {
		return err
	}
	fmt.Fprintf(progress, "bench: synced-write ceiling %.0f writes/s (%.0f µs each); a synced stream %.0f publishes/s, %.0f at %d publishers\n",
		r.Disk.SyncedWritesPerS, r.Disk.SyncedWriteUs, r.Disk.StreamPerS, r.Disk.StreamConcurrentPerS, r.Disk.Publishers)

	profiled := false
	for _, op := range Operations {
		if !slices.Contains(cfg.Ops, op) {
			continue
		}
		var prof io.Writer
		if !profiled {
			prof, profiled = cfg.CPUProfile, true
		}
		ph := drive(ctx, cfg, prof, func(ctx context.Context, i int) (int, error) { return reqs[i].do(ctx, op) })
		ph.Op = op
		if r.CeilingEchoPerS > 0 {
			ph.RatioToEcho = ph.RequestsPerS / r.CeilingEchoPerS
		}
		if r.CeilingMintPerS > 0 {
			ph.RatioToMint = ph.CredentialsPerS / r.CeilingMintPerS
		}
		if r.Disk.SyncedWritesPerS > 0 {
			ph.RatioToSync = ph.RequestsPerS / r.Disk.SyncedWritesPerS
		}
		if r.Disk.StreamConcurrentPerS > 0 {
			ph.RatioToStream = ph.RequestsPerS / r.Disk.StreamConcurrentPerS
		}
		fmt.Fprintf(progress, "bench: %s %.0f req/s (%.0f credentials/s), p50 %.2f ms, p99 %.2f ms, refused %v\n",
			op, ph.RequestsPerS, ph.CredentialsPerS, ph.P50, ph.P99, ph.Refused)
		r.Operations = append(r.Operations, ph)
	}
	r.Phase = r.Operations[0]
	return nil
}

// startProfile starts a CPU profile into w (nil: none) and returns its stop.
func startProfile(w io.Writer) (func(), error) {
	if w == nil {
		return func() {}, nil
	}
	if err := pprof.StartCPUProfile(w); err != nil {
		return nil, err
	}
	return pprof.StopCPUProfile, nil
}
