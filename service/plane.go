package service

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"

	"github.com/cotal-ai/authplane/handlers"
	"github.com/cotal-ai/authplane/internal/audit"
	"github.com/cotal-ai/authplane/internal/broker"
	"github.com/cotal-ai/authplane/internal/gate"
	"github.com/cotal-ai/authplane/internal/httpface"
	"github.com/cotal-ai/authplane/internal/ids"
	"github.com/cotal-ai/authplane/internal/instance"
	"github.com/cotal-ai/authplane/internal/issue"
	"github.com/cotal-ai/authplane/internal/manager"
	"github.com/cotal-ai/authplane/internal/mint"
	"github.com/cotal-ai/authplane/internal/space"
	"github.com/cotal-ai/authplane/internal/store"
	"github.com/cotal-ai/authplane/subjects"
)

// ErrFenced is what Err and Close report when a newer registration of this instance fenced
// the plane.
var ErrFenced = instance.ErrFenced

// Info is what a started plane tells whoever started it: where it serves and what it is.
type Info struct {
	Space      string
	InstanceID string
	// Epoch is the process epoch this start registered.
	Epoch   uint64
	NATSURL string
	HTTPURL string
	// SpaceDir holds the space material; CreatedMaterial says this start wrote it.
	SpaceDir        string
	CreatedMaterial bool
	// Embedded says the plane runs its own nats-server.
	Embedded bool
}

// Plane is a running authority plane.
type Plane struct {
	cfg  Config
	log  *slog.Logger
	info Info

	keys     *space.Keys
	identity instance.Identity
	gate     *gate.Gate
	stores   *store.Stores
	svcs     []micro.Service

	fenced atomic.Bool
	// closers tear the plane down in the reverse order Start built it.
	closers  []closer
	bg       sync.WaitGroup
	done     chan struct{}
	doneOnce sync.Once
	err      error
	closing  sync.Once
	closeErr error
}

// closer is one step of the teardown.
type closer struct {
	what string
	fn   func() error
}

// onClose pushes a teardown step; Close runs them last pushed, first run.
func (p *Plane) onClose(what string, fn func() error) {
	p.closers = append(p.closers, closer{what, fn})
}

// Start brings the plane up in the order DESIGN §3 and §6.7 give; auth-service.json is written
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
	p := &Plane{cfg: cfg, log: cfg.Logger, done: make(chan struct{})}
	p.info.Space = cfg.Space
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
	if err := p.loadKeys(); err != nil {
		return nil, err
	}
	if p.identity, err = instance.LoadOrCreateIdentity(cfg.Dir, cfg.Space); err != nil {
		return nil, err
	}
	p.info.InstanceID = p.identity.InstanceID
	if err := p.startBroker(); err != nil {
		return nil, err
	}

	planeIssuer, err := mint.NewIssuer(p.keys.Plane.Public(), p.keys.Plane.Signer, cfg.Now)
	if err != nil {
		return nil, err
	}
	storeNC, err := p.connect("store", planeIssuer, subjects.StorePermissions(cfg.Space))
	if err != nil {
		return nil, err
	}
	openCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	p.stores, err = store.Open(openCtx, storeNC, cfg.Space, store.Options{
		Replicas:     cfg.Replicas,
		WitnessBytes: cfg.WitnessBytes,
		MintedBytes:  cfg.MintedBytes,
	}, p.log)
	if err != nil {
		return nil, fmt.Errorf("stores: %w", err)
	}
	if p.gate, err = instance.Register(openCtx, p.stores.Auth, p.identity.InstanceID); err != nil {
		return nil, err
	}
	p.info.Epoch = p.gate.Row.ProcessEpoch

	// One issuer for the data account: its signing key is derived once, for every user of it.
	dataIssuer, err := mint.NewIssuer(p.keys.Data.Public(), p.keys.Data.Signer, cfg.Now)
	if err != nil {
		return nil, err
	}
	serveNC, err := p.connect("serving", dataIssuer, subjects.ServingPermissions(cfg.Space))
	if err != nil {
		return nil, err
	}
	if err := p.serveBus(serveNC, dataIssuer); err != nil {
		return nil, err
	}
	p.watchFence()
	if err := p.serveHTTP(); err != nil {
		return nil, err
	}
	if err := instance.WriteServiceInfo(cfg.Dir, instance.ServiceInfo{
		Ver: 1, URL: p.info.HTTPURL, NATSURL: p.info.NATSURL, SpaceDir: p.info.SpaceDir, PID: os.Getpid(), Cap: ids.Secret(32),
	}); err != nil {
		return nil, err
	}
	p.onClose("remove "+instance.ServiceInfoFile, func() error { return instance.RemoveServiceInfo(cfg.Dir) })
	p.log.Info("authority plane ready", "space", cfg.Space, "instance", p.identity.InstanceID,
		"epoch", p.info.Epoch, "nats", p.info.NATSURL, "http", p.info.HTTPURL)
	return p, nil
}

// Info says where the plane serves and what it is.
func (p *Plane) Info() Info { return p.info }

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
	b, err := broker.Start(p.keys, broker.Options{
		Dir:    filepath.Join(p.cfg.Dir, "nats"),
		Port:   p.cfg.NATSPort,
		Name:   "authplane-" + p.identity.InstanceID,
		Logger: p.log.With("component", "nats-server"),
	})
	if errors.Is(err, broker.ErrPortInUse) {
		return fmt.Errorf("--nats-port %d: %w (pick another port, or 0 for a free one)", p.cfg.NATSPort, err)
	}
	if err != nil {
		return err
	}
	p.onClose("shut the embedded nats-server down", func() error { b.Shutdown(); return nil })
	p.info.NATSURL, p.info.Embedded = b.ClientURL(), true
	return nil
}

// connect opens one of the plane's own connections as a fresh short-lived user of issuer's
// account, renewed by reconnecting at two thirds of its life. Close drains it.
func (p *Plane) connect(role string, iss *mint.Issuer, perms subjects.Permissions) (*nats.Conn, error) {
	ttl := p.cfg.PlaneUserTTL
	auth, err := iss.Connect("plane."+role+"_"+p.identity.InstanceID, perms, ttl)
	if err != nil {
		return nil, err
	}
	log := p.log.With("conn", role)
	nc, err := nats.Connect(p.info.NATSURL, auth,
		nats.Name("authplane "+role+" "+p.identity.InstanceID),
		nats.MaxReconnects(-1),
		nats.ReconnectWait(250*time.Millisecond),
		nats.DisconnectErrHandler(func(_ *nats.Conn, err error) {
			if err != nil {
				log.Warn("disconnected from NATS", "err", err)
			}
		}),
		nats.ReconnectHandler(func(*nats.Conn) { log.Debug("reconnected to NATS") }),
		nats.ErrorHandler(func(_ *nats.Conn, sub *nats.Subscription, err error) {
			subj := ""
			if sub != nil {
				subj = sub.Subject
			}
			log.Warn("NATS async error", "subject", subj, "err", err)
		}),
	)
	if err != nil {
		return nil, fmt.Errorf("connect %s user to %s: %w", role, p.info.NATSURL, err)
	}
	p.onClose("drain the "+role+" connection", func() error { return drain(nc, 5*time.Second) })
	stop := make(chan struct{})
	p.bg.Go(func() {
		t := time.NewTicker(ttl * 2 / 3)
		defer t.Stop()
		for {
			select {
			case <-stop:
				return
			case <-t.C:
				if err := nc.ForceReconnect(); err != nil && !nc.IsClosed() {
					log.Warn("renewing the plane's user failed", "err", err)
				}
			}
		}
	})
	p.onClose("stop renewing the "+role+" user", func() error { close(stop); return nil })
	return nc, nil
}

// serveBus registers the micro service instances on the serving connection: the guard, the
// issuance pipeline and every endpoint's handler.
func (p *Plane) serveBus(nc *nats.Conn, dataIssuer *mint.Issuer) error {
	cfg := p.cfg
	recorder := audit.New(cfg.Space, p.stores, p.log, cfg.Now)
	pipeline := &issue.Pipeline{Issuer: dataIssuer, Audit: recorder, Now: cfg.Now, Fenced: p.fenced.Load}
	if cfg.Hooks != nil {
		pipeline.BeforeCommit = cfg.Hooks.BeforeCommit
	}
	proofKey, err := manager.ProofKey(p.keys.Data.Signer)
	if err != nil {
		return err
	}
	engine := &manager.Engine{
		Space:       cfg.Space,
		Account:     p.keys.Data.Public(),
		Gates:       p.stores.Auth,
		Ledger:      p.stores.Actors,
		Pipeline:    pipeline,
		ProofKey:    proofKey,
		StandingTTL: cfg.StandingTTL,
	}
	bus := &handlers.Bus{
		Space:   cfg.Space,
		Timeout: cfg.RequestTimeout,
		Guard:   &handlers.Guard{Limiter: handlers.NewLimiter(cfg.Rate, cfg.Burst), Audit: recorder, Fenced: p.fenced.Load},
		Log:     p.log,
	}
	svcs, err := bus.Register(nc, micro.Config{
		Name:        subjects.ServiceName,
		Version:     Version,
		Description: "Cotal authority plane: mints NATS credentials after re-reading their fences",
		QueueGroup:  subjects.QueueGroup,
		Metadata: map[string]string{
			"space":    cfg.Space,
			"issuer":   subjects.Issuer(cfg.Space),
			"instance": p.identity.InstanceID,
			"epoch":    strconv.FormatUint(p.gate.Row.ProcessEpoch, 10),
			"protocol": subjects.Protocol,
		},
	}, map[string]handlers.Func{
		subjects.EndpointManagerAuthority:    handlers.ManagerAuthority(engine),
		subjects.EndpointRunRevoke:           handlers.Unimplemented(subjects.EndpointRunRevoke),
		subjects.EndpointSupervisorAssign:    handlers.Unimplemented(subjects.EndpointSupervisorAssign),
		subjects.EndpointSupervisorAuthority: handlers.Unimplemented(subjects.EndpointSupervisorAuthority),
		subjects.EndpointSupervisorEnd:       handlers.Unimplemented(subjects.EndpointSupervisorEnd),
	}, cfg.Workers)
	p.svcs = svcs
	p.onClose("stop the micro services", p.stopServices)
	return err
}

// stopServices stops every micro service instance: in-flight requests finish, no more arrive.
func (p *Plane) stopServices() error {
	var errs []error
	for _, svc := range p.svcs {
		if err := svc.Stop(); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// watchFence watches the plane's own gate from here on: the watch's first value is the gate as
// it is now, so an epoch that moved since the registration fences at once.
func (p *Plane) watchFence() {
	ctx, stop := context.WithCancel(context.Background())
	p.bg.Go(func() {
		if err := instance.Watch(ctx, p.stores.Auth, p.gate); err != nil && ctx.Err() == nil {
			p.fence(err)
		}
	})
	p.onClose("stop watching the plane's gate", func() error { stop(); return nil })
}

func (p *Plane) serveHTTP() error {
	l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(p.cfg.HTTPPort)))
	if err != nil {
		return fmt.Errorf("--http-port %d: %w (pick another port, or 0 for a free one)", p.cfg.HTTPPort, err)
	}
	p.info.HTTPURL = "http://" + l.Addr().String()
	srv := &http.Server{
		Handler:           httpface.Loopback(subjects.Issuer(p.cfg.Space)),
		ReadHeaderTimeout: 5 * time.Second,
		ReadTimeout:       10 * time.Second,
		WriteTimeout:      15 * time.Second,
		MaxHeaderBytes:    16 << 10,
		ErrorLog:          slog.NewLogLogger(p.log.Handler(), slog.LevelDebug),
	}
	p.bg.Go(func() {
		if err := srv.Serve(l); err != nil && !errors.Is(err, http.ErrServerClosed) {
			p.finish(fmt.Errorf("http face: %w", err))
		}
	})
	p.onClose("shut the HTTP face down", func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		return srv.Shutdown(ctx)
	})
	return nil
}

// fence stops serving at once: a newer registration of this instance owns it now.
func (p *Plane) fence(cause error) {
	if !errors.Is(cause, instance.ErrFenced) {
		p.log.Error("instance watch failed; stopping", "err", cause)
	} else {
		p.log.Error("fenced: another process registered this instance at a newer epoch; stopping", "err", cause)
	}
	p.fenced.Store(true)
	if err := p.stopServices(); err != nil {
		p.log.Warn("stopping the micro services", "err", err)
	}
	p.finish(cause)
}

func (p *Plane) finish(err error) {
	p.doneOnce.Do(func() {
		p.err = err
		close(p.done)
	})
}

// Done is closed when the plane stops on its own (fenced, or a fatal error); Err says why.
func (p *Plane) Done() <-chan struct{} { return p.done }

// Err is why the plane stopped on its own, or nil.
func (p *Plane) Err() error {
	select {
	case <-p.done:
		return p.err
	default:
		return nil
	}
}

// Close stops the plane in the reverse order Start built it: auth-service.json goes first,
// then the HTTP face, the fence watch, the micro services (in-flight requests finish), the
// connections (serving before store: its requests still need the stores), the embedded broker,
// and last the state directory's lock. It returns why the plane had stopped on its own, if it
// had.
func (p *Plane) Close() error {
	err := p.teardown()
	return errors.Join(p.Err(), err)
}

func (p *Plane) teardown() error {
	p.closing.Do(func() {
		p.finish(nil)
		var errs []error
		for i := len(p.closers) - 1; i >= 0; i-- {
			if err := p.closers[i].fn(); err != nil {
				errs = append(errs, fmt.Errorf("%s: %w", p.closers[i].what, err))
			}
		}
		p.closeErr = errors.Join(errs...)
	})
	return p.closeErr
}

// drain drains nc and waits until it has closed, or closes it after timeout.
func drain(nc *nats.Conn, timeout time.Duration) error {
	if nc.IsClosed() {
		return nil
	}
	defer nc.Close()
	closed := make(chan struct{})
	nc.SetClosedHandler(func(*nats.Conn) { close(closed) })
	if err := nc.Drain(); err != nil {
		if errors.Is(err, nats.ErrConnectionClosed) {
			return nil
		}
		return err
	}
	select {
	case <-closed:
	case <-time.After(timeout):
	}
	return nil
}
