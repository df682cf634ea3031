package service

import (
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"path/filepath"
	"runtime"
	"strings"
	"time"

	"github.com/cotal-ai/authplane/handlers"
	"github.com/cotal-ai/authplane/internal/capability/bearer"
	"github.com/cotal-ai/authplane/internal/capability/instance"
	"github.com/cotal-ai/authplane/internal/capability/manager"
	"github.com/cotal-ai/authplane/internal/core/audit"
	"github.com/cotal-ai/authplane/internal/core/issue"
	"github.com/cotal-ai/authplane/internal/core/store"
	"github.com/cotal-ai/authplane/internal/platform/broker"
	"github.com/cotal-ai/authplane/subjects"
)

// Version is the plane's release, the micro service version.
const Version = "0.1.0"

// Config is everything `authplane serve` is told.
type Config struct {
	// Dir is the process state directory: lock, identity, auth-service.json, the embedded
	// broker's store.
	Dir string
	// SpaceDir is the space material directory; "" means Dir/space.
	SpaceDir string
	// Space is the space served.
	Space string

	// NATSURL selects an existing broker; "" runs an embedded one on NATSPort (0 = a free port).
	NATSURL  string
	NATSPort int
	// HTTPPort is the loopback HTTP face's port (0 = a free port).
	HTTPPort int
	// PublicPort is the public HTTP face's port on PublicHost, behind a TLS-ending proxy (0 = a
	// free port, -1 = no public face).
	PublicPort int
	// PublicHost is the IP address the public face listens on: 127.0.0.1, or 0.0.0.0 in a
	// container whose port is published.
	PublicHost string
	// PublicURL is the public face's URL as clients see it (https://…, or http:// on a loopback
	// IP literal), what the discovery bundle names; "" names the bound port.
	PublicURL string
	// TrustedProxy says the public face sits behind a proxy whose last X-Forwarded-For hop
	// names the peer.
	TrustedProxy bool
	// PublicPeerInFlight bounds one peer's requests in flight on the public face (of the face's
	// 64), per replica.
	PublicPeerInFlight int
	// LoopbackInFlight bounds the loopback face's door requests in flight, the capability's
	// holders together, per replica.
	LoopbackInFlight int
	// HTTPBodyTimeout is how long a door of either face waits for a request's body after its
	// headers.
	HTTPBodyTimeout time.Duration
	// AdvertisedServer is the broker URL the bundle gives clients; "" gives the plane's own.
	AdvertisedServer string
	// IdP is the identity provider the space trusts; its URL "" trusts none.
	IdP bearer.IdPConfig
	// PProf exposes net/http/pprof on the loopback HTTP face (/debug/pprof/…); off by default.
	PProf bool

	// Replicas of every bucket and stream.
	Replicas int
	// Workers is how many requests each endpoint answers at once: the bound of its pool behind
	// the one micro service instance (micro hands an endpoint's requests over one at a time).
	Workers int
	// Rate and Burst are the per-principal token bucket (Rate 0 disables it); OwnerInFlight
	// bounds an owner's requests under way on each endpoint (0: unbounded). Both per replica.
	Rate          float64
	Burst         int
	OwnerInFlight int
	// RequestTimeout bounds every request, retries included.
	RequestTimeout time.Duration

	// PlaneUserTTL is the lifetime of the plane's own users; they renew at two thirds of it.
	PlaneUserTTL time.Duration
	// StandingTTL is the lifetime of standing credentials (5s to 24h).
	StandingTTL time.Duration
	// RotateSigningEvery, when set, makes the plane begin a scheduled rotation of the data
	// account's signing keys once the current ones have signed that long (0: never on its own).
	RotateSigningEvery time.Duration
	// MaxAssignmentTTL bounds a platform supervisor assignment.
	MaxAssignmentTTL time.Duration
	// MaxInstancesPerOwner bounds an owner's live (non-retired) manager instances.
	MaxInstancesPerOwner int
	// NewKeysPerOwner bounds the user nkeys one owner claims anew (a registration's, a
	// re-registration's fresh ones, a run attempt's driver and mediator) over the minted
	// records' retention (48 h): each claim is for life, and each new key's `minted` record
	// stays in the stream every tenant shares. Kept in the store: per space.
	NewKeysPerOwner int
	// ReregistrationsPerInstance and ReregistrationsPerOwner bound, an hour, the prepares of an
	// instance already registered (each advances its epoch, and may bring fresh keys). Kept in
	// the store: per space.
	ReregistrationsPerInstance int
	ReregistrationsPerOwner    int
	// MaxSubscriptions and MaxPayload bound every user the plane mints; MaxConnections bounds
	// the data account's connections (the plane's own serving ones included).
	MaxSubscriptions int64
	MaxPayload       int64
	MaxConnections   int64
	// ReservedConnections of MaxConnections are the plane's own (two per replica): tenants hold
	// the rest. MaxConnectionsPerPrincipal bounds one principal's connections,
	// MaxConnectionsPerOwner one owner's over all its principals, and how many the callout lets
	// in for the owner a bearer's life (each a key the broker chose, with its `minted` record).
	// Each holds per space (docs/OPERATIONS.md, "Budgets").
	ReservedConnections        int64
	MaxConnectionsPerPrincipal int64
	MaxConnectionsPerOwner     int64

	// WitnessBytes and WitnessRuns bound each owner's witness stream: its run-starts of the
	// last five minutes, in bytes and in count (per space: the stream is in the store).
	WitnessBytes int64
	WitnessRuns  int64
	// MintedBytes and AuditBytes bound those streams.
	MintedBytes int64
	AuditBytes  int64
	// AuditRecords is how many full audit records of each decision one owner gets a minute
	// from this replica; past it, they are counted in one summary record for the minute.
	AuditRecords int
	// AuditorConsumers bounds the consumers (auditors' readers) each of the minted and audit
	// streams holds, per space.
	AuditorConsumers int

	// DrainTimeout bounds a stop: requests in flight get this long to finish once no new one is
	// taken.
	DrainTimeout time.Duration
	// ConnectTimeout is how long the start retries its first connection to NATS (--nats-url),
	// with backoff, before it gives up: a plane started beside its cluster waits for it. 0 tries
	// once.
	ConnectTimeout time.Duration

	// AllowUnsynced serves on servers that do not sync every write, and runs the embedded one
	// so; RecreateStores creates the stores of a space that lost them (docs/OPERATIONS.md).
	AllowUnsynced  bool
	RecreateStores bool

	// IdentityStore is where the plane's instance identity lives: instance.StoreFile
	// (Dir/identity.json) or instance.StoreKV (claimed in the space's secrets bucket under
	// InstanceName, so a restart without the disk is the same instance).
	IdentityStore string
	InstanceName  string

	// Logger receives the plane's log; nil discards it.
	Logger *slog.Logger
	// Now is the clock; nil means time.Now.
	Now func() time.Time
	// Hooks are test seams; nil in production.
	Hooks *Hooks
}

// DefaultWorkersPerCPU is how many requests each endpoint answers at once, per CPU, unless
// --workers says otherwise. A request waits on the stores for most of its time (a ledger and a
// gate read, the minted records, the commit), so many are under way per CPU; the bound keeps a
// flood from starting more than the stores can answer before the deadline.
const DefaultWorkersPerCPU = 16

// witnessMargin is what a stored run-start takes beyond its payload, with room to spare: its
// subject (at most a few hundred bytes) and the store's own framing.
const witnessMargin = 4 << 10

// DefaultReservedConnections is how many of the data account's connections the plane keeps for
// its own serving users unless --reserved-connections says otherwise: two per replica (the
// current one and the next while it renews), for up to four replicas.
const DefaultReservedConnections = 8

// DefaultMaxConnectionsPerPrincipal is how many connections one principal may hold in the data
// account unless --max-connections-per-principal says otherwise: a manager's duties hold one
// each, a person's tools a few.
const DefaultMaxConnectionsPerPrincipal = 64

// DefaultMaxConnectionsPerOwner is how many connections one owner's principals may hold
// together unless --max-connections-per-owner says otherwise: a tenth of the default
// --max-connections, so one owner's fleet leaves the others nine tenths.
const DefaultMaxConnectionsPerOwner = 1000

// Defaults returns the configuration `authplane serve` starts from.
func Defaults() Config {
	return Config{
		Dir:                        ".authplane",
		Space:                      "default",
		NATSPort:                   4222,
		HTTPPort:                   8480,
		PublicPort:                 -1,
		PublicHost:                 "127.0.0.1",
		PublicPeerInFlight:         handlers.DefaultPeerInFlight,
		LoopbackInFlight:           handlers.DefaultLoopbackInFlight,
		HTTPBodyTimeout:            handlers.DefaultBodyTimeout,
		Replicas:                   1,
		Workers:                    DefaultWorkersPerCPU * runtime.GOMAXPROCS(0),
		Rate:                       100,
		Burst:                      200,
		OwnerInFlight:              handlers.DefaultOwnerInFlight,
		RequestTimeout:             5 * time.Second,
		PlaneUserTTL:               time.Hour,
		StandingTTL:                24 * time.Hour,
		MaxAssignmentTTL:           30 * 24 * time.Hour,
		MaxInstancesPerOwner:       64,
		NewKeysPerOwner:            10_000,
		ReregistrationsPerInstance: 60,
		ReregistrationsPerOwner:    600,
		MaxSubscriptions:           issue.DefaultLimits.Subs,
		MaxPayload:                 issue.DefaultLimits.Payload,
		MaxConnections:             10_000,
		WitnessBytes:               store.DefaultWitnessBytes,
		WitnessRuns:                store.DefaultWitnessRuns,
		MintedBytes:                store.DefaultMintedBytes,
		AuditBytes:                 store.DefaultAuditBytes,
		AuditRecords:               audit.DefaultPerMinute,
		AuditorConsumers:           store.DefaultReaderConsumers,
		IdentityStore:              instance.StoreFile,
		DrainTimeout:               10 * time.Second,
		ConnectTimeout:             time.Minute,

		// The connection budgets (internal/platform/conns).
		ReservedConnections:        DefaultReservedConnections,
		MaxConnectionsPerPrincipal: DefaultMaxConnectionsPerPrincipal,
		MaxConnectionsPerOwner:     DefaultMaxConnectionsPerOwner,
	}
}

// SpaceDirOrDefault returns SpaceDir, or Dir/space when it is empty.
func (c Config) SpaceDirOrDefault() string {
	if c.SpaceDir != "" {
		return c.SpaceDir
	}
	return filepath.Join(c.Dir, "space")
}

// Validate returns every problem with the configuration at once, each naming its flag.
func (c Config) Validate() error {
	var p []error
	bad := func(format string, args ...any) { p = append(p, fmt.Errorf(format, args...)) }
	if c.Dir == "" {
		bad("--dir: must not be empty")
	}
	if !subjects.ValidSpace(c.Space) {
		bad("--space %q: want [a-z0-9][a-z0-9_-]{0,31}", c.Space)
	}
	if c.NATSURL != "" {
		for _, u := range strings.Split(c.NATSURL, ",") {
			if pu, err := url.Parse(strings.TrimSpace(u)); err != nil || pu.Host == "" {
				bad("--nats-url %q: want nats://host:port (comma-separated for a cluster)", broker.RedactURL(u))
			}
		}
	}
	if c.NATSPort < 0 || c.NATSPort > 65535 {
		bad("--nats-port %d: want 0 to 65535", c.NATSPort)
	}
	if c.HTTPPort < 0 || c.HTTPPort > 65535 {
		bad("--http-port %d: want 0 to 65535", c.HTTPPort)
	}
	c.validatePublic(bad)
	c.validateHTTPBudgets(bad)
	if c.Replicas != 1 && c.Replicas != 3 && c.Replicas != 5 {
		bad("--replicas %d: want 1, 3 or 5", c.Replicas)
	}
	if c.Workers < 1 || c.Workers > 1024 {
		bad("--workers %d: want 1 to 1024", c.Workers)
	}
	// A negative or non-finite rate is no silent "no limit": only 0 is.
	if !(c.Rate >= 0 && c.Rate <= 1_000_000) {
		bad("--rate %v: want 0 (no limit) to 1000000 requests a second", c.Rate)
	}
	if c.Burst < 1 || c.Burst > 1_000_000 {
		bad("--burst %d: want 1 to 1000000", c.Burst)
	}
	if c.OwnerInFlight < 0 || c.OwnerInFlight > 1_000_000 {
		bad("--owner-in-flight %d: want 0 (no limit) to 1000000", c.OwnerInFlight)
	}
	if c.RequestTimeout < 100*time.Millisecond || c.RequestTimeout > time.Minute {
		bad("--request-timeout %s: want 100ms to 1m", c.RequestTimeout)
	}
	if c.PlaneUserTTL < 10*time.Second || c.PlaneUserTTL > 24*time.Hour {
		bad("--plane-user-ttl %s: want 10s to 24h", c.PlaneUserTTL)
	} else if c.PlaneUserTTL/3 <= c.RequestTimeout {
		// A user is renewed at two thirds of its life; the requests its old connection still
		// serves must end in the third that is left.
		bad("--plane-user-ttl %s: want more than three times --request-timeout (%s)", c.PlaneUserTTL, c.RequestTimeout)
	}
	// The minted records are kept twice the longest life a credential may have
	// (store.MintedMaxAge): the standing TTL's bound is that life.
	if c.StandingTTL < 5*time.Second || c.StandingTTL > store.MintedMaxAge/2 {
		bad("--standing-ttl %s: want 5s to %s", c.StandingTTL, store.MintedMaxAge/2)
	}
	if c.RotateSigningEvery != 0 && (c.RotateSigningEvery < time.Hour || c.RotateSigningEvery > 365*24*time.Hour) {
		bad("--rotate-signing-every %s: want 0 (never) or 1h to 8760h", c.RotateSigningEvery)
	}
	if c.MaxAssignmentTTL < time.Minute || c.MaxAssignmentTTL > 365*24*time.Hour {
		bad("--max-assignment-ttl %s: want 1m to 8760h", c.MaxAssignmentTTL)
	}
	// An owner's instances are one row of the fence bucket: the flag is bounded by what it holds.
	if c.MaxInstancesPerOwner < 1 || c.MaxInstancesPerOwner > manager.MaxInstancesPerOwner {
		bad("--max-instances-per-owner %d: want 1 to %d", c.MaxInstancesPerOwner, manager.MaxInstancesPerOwner)
	}
	if c.NewKeysPerOwner < 10 || c.NewKeysPerOwner > 10_000_000 {
		bad("--new-keys-per-owner %d: want 10 (a first registration takes 6) to 10000000", c.NewKeysPerOwner)
	}
	if c.ReregistrationsPerInstance < 1 || c.ReregistrationsPerOwner < c.ReregistrationsPerInstance || c.ReregistrationsPerOwner > 1_000_000 {
		bad("--reregistrations-per-instance %d and --reregistrations-per-owner %d: want at least 1 an hour for an instance, and for an owner at least an instance's and at most 1000000", c.ReregistrationsPerInstance, c.ReregistrationsPerOwner)
	}
	if err := (issue.Limits{Subs: c.MaxSubscriptions, Payload: c.MaxPayload}).Validate(); err != nil {
		p = append(p, err)
	}
	if c.MaxConnections < 2 || c.MaxConnections > 10_000_000 {
		bad("--max-connections %d: want 2 to 10000000 (the plane's own serving connection counts)", c.MaxConnections)
	} else if c.ReservedConnections < 2 || c.ReservedConnections >= c.MaxConnections {
		bad("--reserved-connections %d: want 2 (one replica renewing its serving user) to less than --max-connections (%d)", c.ReservedConnections, c.MaxConnections)
	} else if c.MaxConnectionsPerPrincipal < 1 || c.MaxConnectionsPerPrincipal > c.MaxConnections-c.ReservedConnections {
		bad("--max-connections-per-principal %d: want 1 to --max-connections less --reserved-connections (%d)", c.MaxConnectionsPerPrincipal, c.MaxConnections-c.ReservedConnections)
	} else if c.MaxConnectionsPerOwner < c.MaxConnectionsPerPrincipal || c.MaxConnectionsPerOwner > 10_000_000 {
		bad("--max-connections-per-owner %d: want --max-connections-per-principal (%d) to 10000000", c.MaxConnectionsPerOwner, c.MaxConnectionsPerPrincipal)
	}
	if c.WitnessBytes < 1<<20 || c.WitnessBytes < c.MaxPayload+witnessMargin {
		// One run-start of the largest payload a caller may publish, with its subject, fits.
		bad("--witness-bytes %d: want at least 1 MiB and at least --max-payload (%d) plus 4 KiB", c.WitnessBytes, c.MaxPayload)
	}
	if c.WitnessRuns < 1 || c.WitnessRuns > 1_000_000 {
		bad("--witness-runs %d: want 1 to 1000000", c.WitnessRuns)
	}
	if c.MintedBytes < 1<<20 {
		bad("--minted-bytes %d: want at least 1 MiB", c.MintedBytes)
	}
	if c.AuditBytes < 1<<20 {
		bad("--audit-bytes %d: want at least 1 MiB", c.AuditBytes)
	}
	if c.AuditRecords < 1 || c.AuditRecords > 100_000 {
		bad("--audit-records %d: want 1 to 100000", c.AuditRecords)
	}
	if c.AuditorConsumers < 1 || c.AuditorConsumers > 10000 {
		bad("--auditor-consumers %d: want 1 to 10000", c.AuditorConsumers)
	}
	p = append(p, c.validateOperations()...)
	return errors.Join(p...)
}

// validateOperations checks what running the plane as a service adds: where its identity
// lives, and how long a stop waits.
func (c Config) validateOperations() []error {
	var p []error
	if c.DrainTimeout < 0 || c.DrainTimeout > 10*time.Minute {
		p = append(p, fmt.Errorf("--drain-timeout %s: want 0 to 10m", c.DrainTimeout))
	}
	if c.ConnectTimeout < 0 || c.ConnectTimeout > time.Hour {
		p = append(p, fmt.Errorf("--connect-timeout %s: want 0 to 1h", c.ConnectTimeout))
	}
	switch c.IdentityStore {
	case "", instance.StoreFile:
		if c.InstanceName != "" {
			p = append(p, fmt.Errorf("--instance-name %q: only with --identity-store %s", c.InstanceName, instance.StoreKV))
		}
	case instance.StoreKV:
		if !subjects.ValidInstanceName(c.InstanceName) {
			p = append(p, fmt.Errorf("--instance-name %q: --identity-store %s needs one, [A-Za-z0-9_-]{1,64} (not the host name: a container's changes)",
				c.InstanceName, instance.StoreKV))
		}
	default:
		p = append(p, fmt.Errorf("--identity-store %q: want %s or %s", c.IdentityStore, instance.StoreFile, instance.StoreKV))
	}
	return p
}

// IdPConfig is the IdP the space trusts with its defaults: issuer and audience the URL's
// origin, the JWKS at the URL's /jwks.
func (c Config) IdPConfig() bearer.IdPConfig {
	cfg := c.IdP
	if cfg.URL == "" {
		return cfg
	}
	origin := cfg.URL
	if u, err := url.Parse(cfg.URL); err == nil {
		origin = u.Scheme + "://" + u.Host
	}
	if cfg.Issuer == "" {
		cfg.Issuer = origin
	}
	if cfg.Audience == "" {
		cfg.Audience = origin
	}
	if cfg.JWKS == "" {
		cfg.JWKS = strings.TrimSuffix(cfg.URL, "/") + "/jwks"
	}
	return cfg
}
