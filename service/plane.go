package service

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/cotal-ai/authplane/internal/capability/instance"
	"github.com/cotal-ai/authplane/internal/capability/signers"
	"github.com/cotal-ai/authplane/internal/core/fault"
	"github.com/cotal-ai/authplane/internal/core/issue"
	"github.com/cotal-ai/authplane/internal/core/store"
	"github.com/cotal-ai/authplane/internal/platform/broker"
	"github.com/cotal-ai/authplane/internal/platform/conns"
	"github.com/cotal-ai/authplane/internal/platform/metrics"
	"github.com/cotal-ai/authplane/internal/platform/space"
	"github.com/cotal-ai/authplane/subjects"
)

// Errors Start, Err and Close report. Test them with errors.Is.
var (
	// ErrFenced: a newer registration of this instance fenced the plane.
	ErrFenced = instance.ErrFenced
	// ErrLocked: another process holds the state directory.
	ErrLocked = instance.ErrLocked
	// ErrMisconfigured: a bucket or stream exists with a configuration its rule forbids.
	ErrMisconfigured = store.ErrMisconfigured
	// ErrLost: a bucket or stream of a space that existed is gone, or the plane's own gate.
	ErrLost = store.ErrLost
)

// Info is what a started plane tells whoever started it: where it serves and what it is.
type Info struct {
	Space      string
	InstanceID string
	// Epoch is the process epoch this start registered.
	Epoch   uint64
	NATSURL string
	HTTPURL string
	// PublicURL is the public face's URL as clients see it, "" without one; PublicListen is
	// where it is bound.
	PublicURL    string
	PublicListen string
	// SpaceDir holds the space material; CreatedMaterial says this start wrote it.
	SpaceDir        string
	CreatedMaterial bool
	// Embedded says the plane runs its own nats-server.
	Embedded bool
	// InstanceCapacity is the most live manager instances the space holds: as many signing
	// keys as the data account's JWT can list within one message of the broker.
	InstanceCapacity int
}

// Plane is a running authority plane.
type Plane struct {
	cfg  Config
	log  *slog.Logger
	info Info

	keys     *space.Keys
	identity instance.Identity
	gate     *issue.Gate
	stores   *store.Stores
	storeNC  *nats.Conn
	// inProcess, with an embedded broker, connects the plane's own users in process: no
	// socket between the plane and its stores. Nil against a cluster.
	inProcess nats.Option
	serving   atomic.Pointer[serving]
	callout   atomic.Pointer[nats.Conn]
	metrics   *metrics.Metrics
	// opened is the stores once open, for the metrics (the loopback face serves them from the
	// start).
	opened atomic.Pointer[store.Stores]
	// system is the plane's system-account user's connection; unsynced names the servers that
	// did not sync every write at the last reading (durable.go).
	system   *nats.Conn
	unsynced atomic.Pointer[[]string]
	// signers are the data account's live signing keys, applied through the system user;
	// repush asks for the newest account JWT to be pushed again (a server (re)joined).
	signers *signers.Set
	repush  chan struct{}
	rot     planeRotation
	// dataAccount is the data account reached through the system user's connection; conns
	// the account's connections held to their budgets through it, relisted when relist is
	// signalled (its reconnection).
	dataAccount broker.Account
	conns       *conns.Ledger
	relist      chan struct{}
	overReserve atomic.Bool
	kicked      atomic.Uint64
	// renewFailing says, by role, why the last renewal of one of the plane's users failed.
	renewMu      sync.Mutex
	renewFailing map[string]string

	fenced   atomic.Bool
	ready    atomic.Bool
	draining atomic.Bool
	// phase says what a start is doing, for /health until the plane is ready.
	phase atomic.Pointer[string]
	// loopback is the loopback face's handler: a starting face until the doors exist.
	loopback atomic.Pointer[http.Handler]
	// startCtx is Start's context (a signal ends it); connectBy is when the start stops
	// retrying its first connection to NATS.
	startCtx  context.Context
	connectBy time.Time
	// drainBy is when a stop stops waiting for requests in flight; nil until it starts.
	drainBy atomic.Pointer[time.Time]
	// rewatch asks the fence watch to start again, after the store connection reconnected.
	rewatch chan struct{}
	// closers tear the plane down in the reverse order Start built it.
	closers  []closer
	bg       sync.WaitGroup
	done     chan struct{}
	doneOnce sync.Once
	err      error
	closing  sync.Once
	closeErr error
}

// Start brings the plane up in the order docs/OPERATIONS.md ("What it runs") gives; auth-service.json is written
// last, as the readiness signal. On any failure it unwinds what it started.
func Start(ctx context.Context, cfg Config) (_ *Plane, err error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	p := &Plane{cfg: cfg, log: cfg.Logger, done: make(chan struct{}), rewatch: make(chan struct{}, 1), relist: make(chan struct{}, 1),
		repush: make(chan struct{}, 1), startCtx: ctx, connectBy: time.Now().Add(cfg.ConnectTimeout)}
	p.info.Space = cfg.Space
	p.setPhase("taking the state directory")
	p.metrics = metrics.New(func() uint64 { return p.info.Epoch }, p.fenced.Load, func() int64 {
		if s := p.opened.Load(); s != nil {
			return s.Retries.Load()
		}
		return 0 // the loopback face serves /metrics before the stores open
	})
	p.metrics.Declare(series())
	p.metrics.Unsynced(func() int { return len(p.unsyncedServers()) })
	defer func() {
		if err != nil {
			err = errors.Join(err, p.teardown())
		}
	}()

	lock, err := instance.Acquire(cfg.Dir)
	if err != nil {
		return nil, err
	}
	p.onClose("release the state directory", lock.Release)
	// Every goroutine of the plane has ended before the lock is given up.
	p.onClose("wait for the plane's goroutines", func() error { p.bg.Wait(); return nil })
	// A stale readiness file from a crashed run must not point anyone at a dead plane.
	if err := instance.RemoveServiceInfo(cfg.Dir); err != nil {
		return nil, err
	}
	// The loopback face answers from here on: /health says what the start is doing (503)
	// until the plane is ready.
	if err := p.serveLoopback(); err != nil {
		return nil, err
	}
	p.setPhase("loading the space material")
	if err := p.loadKeys(); err != nil {
		return nil, err
	}
	if cfg.IdentityStore != instance.StoreKV {
		if p.identity, err = instance.LoadIdentity(cfg.Dir, cfg.Space); err != nil {
			return nil, err
		}
	}
	if err := p.startBroker(); err != nil {
		return nil, err
	}

	planeIssuer, err := issue.NewIssuer(p.keys.Plane.Public(), p.keys.Plane.Signer, cfg.Now)
	if err != nil {
		return nil, err
	}
	// After a reconnection of the store connection the fence watch starts again: its consumer
	// may have gone with the broker, and a new one reads the gate as it is now.
	rewatch := func() {
		select {
		case p.rewatch <- struct{}{}:
		default: // one is pending already
		}
	}
	p.setPhase("connecting to NATS at " + broker.RedactURL(p.info.NATSURL))
	if p.storeNC, err = p.connectRenewed("store", planeIssuer, subjects.StorePermissions(cfg.Space), rewatch); err != nil {
		return nil, err
	}
	if err := p.connectSystem(); err != nil {
		return nil, err
	}
	p.setPhase("reading how the servers sync their stores")
	if err := p.checkSync(ctx); err != nil {
		return nil, err
	}
	p.setPhase("opening the stores")
	openCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	p.stores, err = store.Open(openCtx, p.storeNC, cfg.Space, store.Options{
		Replicas:     cfg.Replicas,
		WitnessBytes: cfg.WitnessBytes,
		WitnessRuns:  cfg.WitnessRuns,
		MintedBytes:  cfg.MintedBytes,
		AuditBytes:   cfg.AuditBytes,
		// The auditors' readers of the minted and audit streams.
		ReaderConsumers: cfg.AuditorConsumers,
		// The embedded server is no cluster: a bucket there can have no follower.
		DirectReads: cfg.NATSURL == "",
		// An identity file is written once its gate is: the stores existed.
		Existed:  cfg.IdentityStore != instance.StoreKV && !p.identity.Fresh,
		Recreate: cfg.RecreateStores,
	}, p.log)
	if err != nil {
		return nil, fmt.Errorf("stores: %w", err)
	}
	p.opened.Store(p.stores)
	p.watchWitnesses()
	if cfg.IdentityStore == instance.StoreKV {
		if p.identity, err = instance.Claim(openCtx, p.stores.Secrets, cfg.Dir, cfg.Space, cfg.InstanceName); err != nil {
			return nil, err
		}
	}
	p.info.InstanceID = p.identity.InstanceID
	p.setPhase("registering instance " + p.identity.InstanceID)
	if p.gate, err = instance.Register(openCtx, p.stores.Auth, p.identity.InstanceID, !p.identity.Fresh && !cfg.RecreateStores); err != nil {
		return nil, err
	}
	if p.identity.Fresh {
		if cfg.IdentityStore == instance.StoreKV {
			err = instance.MarkRegistered(openCtx, p.stores.Secrets, p.identity, cfg.InstanceName)
		} else {
			err = instance.SaveIdentity(cfg.Dir, p.identity)
		}
		if err != nil {
			return nil, err
		}
	}
	p.info.Epoch = p.gate.Row.ProcessEpoch
	if err := p.applyAccountPolicy(openCtx); err != nil {
		return nil, err
	}
	if err := p.watchConnections(openCtx); err != nil {
		return nil, err
	}
	if err := p.serveAuditors(planeIssuer); err != nil {
		return nil, err
	}

	p.setPhase("starting the services")
	// One issuer for the data account: its signing key is derived once, for every user of it.
	dataIssuer, err := issue.NewIssuer(p.keys.Data.Public(), p.keys.Data.Signer, cfg.Now)
	if err != nil {
		return nil, err
	}
	d, err := p.buildDoors(dataIssuer)
	if err != nil {
		return nil, err
	}
	// The HTTP face comes up before the services and goes down after them, so /health tells
	// the truth while the plane starts and while it drains.
	if err := p.serveHTTP(d.http); err != nil {
		return nil, err
	}
	if err := p.serveBus(dataIssuer, d); err != nil {
		return nil, err
	}
	if err := p.serveCallout(d.callout); err != nil {
		return nil, err
	}
	p.watchFence()
	// Ready before the readiness file: whoever reads auth-service.json finds /health ok.
	p.ready.Store(true)
	if err := instance.WriteServiceInfo(cfg.Dir, instance.ServiceInfo{
		Ver: 1, URL: p.info.HTTPURL, NATSURL: p.info.NATSURL, SpaceDir: p.info.SpaceDir, PID: os.Getpid(), Cap: d.http.Cap,
	}); err != nil {
		p.ready.Store(false)
		return nil, err
	}
	p.onClose("remove "+instance.ServiceInfoFile, func() error { return instance.RemoveServiceInfo(cfg.Dir) })
	p.log.Info("authority plane ready", "space", cfg.Space, "instance", p.identity.InstanceID, "instance_capacity", p.info.InstanceCapacity,
		"epoch", p.info.Epoch, "nats", broker.RedactURL(p.info.NATSURL), "http", p.info.HTTPURL)
	return p, nil
}

// Info says where the plane serves and what it is.
func (p *Plane) Info() Info { return p.info }

// applyAccountPolicy re-signs the plane account's JWT (its exports to auditors) and the data
// account's (this start's limits, the auditors' imports, the live instances' signing keys) and
// pushes them to every server as the plane's system user, the exporter first, so a broker that
// lost the live signing keys gets them back. Without the operator signing key it says so and
// leaves the accounts as the material has them.
func (p *Plane) applyAccountPolicy(ctx context.Context) error {
	system := p.system
	p.dataAccount = broker.Account{NC: system, Public: p.keys.Data.Public()}
	if err := p.newSigners(system); err != nil {
		return err
	}
	p.newRotation()
	if p.keys.OperatorSigner == nil {
		p.log.Warn("the plane and data accounts keep the exports and limits of the space material, and ends cannot revoke at the broker: " + space.ErrNoOperatorSigner.Error())
		return nil
	}
	plane, err := p.keys.PlaneAccountJWT()
	if err != nil {
		return err
	}
	if _, err := (broker.Account{NC: system, Public: p.keys.Plane.Public()}).PushIfChanged(ctx, plane); err != nil {
		return fmt.Errorf("plane account exports: %w", err)
	}
	if err := p.signers.Repush(ctx, true); err != nil {
		return fmt.Errorf("data account policy: %w", err)
	}
	p.recheckSigners()
	p.watchServers()
	p.rotateOnTick()
	return p.pinServers()
}

// healthy says whether the plane can serve now: started, not draining, not fenced, connected,
// and able to read its own gate (a leader read) and find its registration there.
func (p *Plane) healthy(ctx context.Context) (bool, string) {
	switch {
	case p.draining.Load():
		return false, "draining: the plane is stopping"
	case p.fenced.Load():
		return false, "fenced: another process registered this instance at a newer epoch"
	case !p.ready.Load():
		return false, "starting: " + *p.phase.Load()
	case p.unsyncedRefused() != "":
		return false, p.unsyncedRefused()
	}
	if !p.connected() {
		return false, "disconnected from NATS"
	}
	if reason := p.renewalFailing(); reason != "" {
		return false, reason
	}
	g, err := issue.GateOf(p.stores.Auth, subjects.GateEndpointAuth, p.identity.InstanceID).Observe(ctx)
	switch {
	case err != nil:
		return false, "cannot read its gate: " + fault.Store(err, "reading").Message
	case g.Absent() || g.Row.Nonce != p.gate.Row.Nonce:
		return false, "fenced: its gate moved past this registration"
	}
	return true, ""
}

// setPhase records what the start is doing now, for /health.
func (p *Plane) setPhase(what string) { p.phase.Store(&what) }

// loadKeys loads the space material, creating it on a first embedded start. Against an
// existing cluster the material must be the one its servers were configured from (`authplane
// init`), so it is never created there.
func (p *Plane) loadKeys() error {
	dir := p.cfg.SpaceDirOrDefault()
	if p.cfg.NATSURL == "" {
		var err error
		p.keys, p.info.CreatedMaterial, err = space.LoadOrCreate(dir, p.cfg.Space)
		if err != nil {
			return err
		}
	} else {
		k, err := space.Load(dir)
		if errors.Is(err, space.ErrNotFound) {
			return fmt.Errorf("--nats-url needs the space material its servers were set up with: none in %s (write it with 'authplane init' and pass --space-dir)", dir)
		}
		if err != nil {
			return err
		}
		if k.Space != p.cfg.Space {
			return fmt.Errorf("space material in %s is for space %q, not --space %q", dir, k.Space, p.cfg.Space)
		}
		p.keys = k
	}
	abs, err := filepath.Abs(p.keys.Dir)
	if err != nil {
		return err
	}
	p.info.SpaceDir = abs
	return nil
}

// startBroker starts the embedded nats-server, unless the plane serves an existing cluster.
func (p *Plane) startBroker() error {
	if p.cfg.NATSURL != "" {
		p.info.NATSURL = p.cfg.NATSURL
		return nil
	}
	// The newest data account JWT this plane signed is in the resolver before a client is
	// admitted: the resolver's own file may be older (it is not synced).
	kept, err := p.keptAccountJWT()
	if err != nil {
		return err
	}
	var newer []string
	if kept != "" {
		newer = append(newer, kept)
	}
	b, err := broker.Start(p.keys, broker.Options{
		Dir:      filepath.Join(p.cfg.Dir, "nats"),
		Port:     p.cfg.NATSPort,
		Name:     "authplane-" + p.self(),
		Logger:   p.log.With("component", "nats-server"),
		Unsynced: p.cfg.AllowUnsynced,
		Newer:    newer,
	})
	if errors.Is(err, broker.ErrPortInUse) {
		return fmt.Errorf("--nats-port %d: %w (pick another port, or 0 for a free one)", p.cfg.NATSPort, err)
	}
	if err != nil {
		return err
	}
	p.onClose("shut the embedded nats-server down", func() error { b.Shutdown(); return nil })
	p.info.NATSURL, p.info.Embedded = b.ClientURL(), true
	p.inProcess = nats.InProcessServer(b.Server())
	return nil
}

// self names this process in server and connection names: its instance id, or, before a
// claimed identity is read, the instance name it is claimed under.
func (p *Plane) self() string {
	if p.identity.InstanceID != "" {
		return p.identity.InstanceID
	}
	return p.cfg.InstanceName
}
