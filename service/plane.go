package service

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
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
	"github.com/cotal-ai/authplane/internal/broker"
	"github.com/cotal-ai/authplane/internal/files"
	"github.com/cotal-ai/authplane/internal/gate"
	"github.com/cotal-ai/authplane/internal/httpface"
	"github.com/cotal-ai/authplane/internal/instance"
	"github.com/cotal-ai/authplane/internal/manager"
	"github.com/cotal-ai/authplane/internal/mint"
	"github.com/cotal-ai/authplane/internal/records"
	"github.com/cotal-ai/authplane/internal/space"
	"github.com/cotal-ai/authplane/internal/store"
	"github.com/cotal-ai/authplane/subjects"
)

// ServiceInfoFile is the readiness file written last into the state directory.
const ServiceInfoFile = "auth-service.json"

// ServiceInfo is the content of auth-service.json: where a local client finds the plane.
type ServiceInfo struct {
	Ver      int    `json:"ver"`
	URL      string `json:"url"`
	NATSURL  string `json:"natsUrl"`
	SpaceDir string `json:"spaceDir"`
	PID      int    `json:"pid"`
	Cap      string `json:"cap"`
}

// ErrFenced is what Err and Close report when a newer registration of this instance fenced
// the plane.
var ErrFenced = instance.ErrFenced

// Plane is a running authority plane.
type Plane struct {
	cfg      Config
	log      *slog.Logger
	lock     *instance.Lock
	material *space.Material
	created  bool
	broker   *broker.Broker
	natsURL  string
	identity instance.Identity
	gate     *gate.Gate
	storeNC  *nats.Conn
	serveNC  *nats.Conn
	stores   *store.Stores
	recorder *records.Recorder
	// dataIssuer signs every user of the data account: the plane's serving user and mints.
	dataIssuer *mint.Issuer
	manager    *manager.Engine
	svc        micro.Service
	httpSrv    *http.Server
	httpURL    string

	fenced   atomic.Bool
	stop     context.CancelFunc
	bg       sync.WaitGroup
	done     chan struct{}
	doneOnce sync.Once
	err      error
	closing  sync.Once
}

// Start brings the plane up in the order DESIGN §3 and §6.7 give; auth-service.json is written
// last, as the readiness signal. On any failure it unwinds what it started.
func Start(ctx context.Context, cfg Config) (_ *Plane, err error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	p := &Plane{cfg: cfg, log: cfg.Logger, done: make(chan struct{})}
	defer func() {
		if err != nil {
			err = errors.Join(err, p.teardown())
		}
	}()

	if p.lock, err = instance.Acquire(cfg.Dir); err != nil {
		return nil, err
	}
	// A stale readiness file from a crashed run must not point anyone at a dead plane.
	if err := os.Remove(filepath.Join(cfg.Dir, ServiceInfoFile)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, err
	}
	if err := p.loadMaterial(); err != nil {
		return nil, err
	}
	if p.identity, err = instance.LoadOrCreateIdentity(cfg.Dir, cfg.Space); err != nil {
		return nil, err
	}

	p.natsURL = cfg.NATSURL
	if p.natsURL == "" {
		p.broker, err = broker.Start(p.material, broker.Options{
			Dir:    filepath.Join(cfg.Dir, "nats"),
			Port:   cfg.NATSPort,
			Name:   "authplane-" + p.identity.InstanceID,
			Logger: p.log.With("component", "nats-server"),
		})
		if errors.Is(err, broker.ErrPortInUse) {
			return nil, fmt.Errorf("--nats-port %d: %w (pick another port, or 0 for a free one)", cfg.NATSPort, err)
		}
		if err != nil {
			return nil, err
		}
		p.natsURL = p.broker.ClientURL()
	}

	bg, stop := context.WithCancel(context.Background())
	p.stop = stop

	planeIssuer, err := mint.NewIssuer(p.material.Plane.Public(), p.material.Plane.Signer, cfg.Now)
	if err != nil {
		return nil, err
	}
	if p.storeNC, err = p.connect("store", planeIssuer, subjects.StoreGrant(cfg.Space)); err != nil {
		return nil, err
	}
	openCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	p.stores, err = store.Open(openCtx, p.storeNC, cfg.Space, store.Options{
		Replicas:     cfg.Replicas,
		WitnessBytes: cfg.WitnessBytes,
		MintedBytes:  cfg.MintedBytes,
	}, p.log)
	if err != nil {
		return nil, fmt.Errorf("stores: %w", err)
	}
	if p.gate, err = instance.Register(openCtx, p.stores.Auth, p.identity.InstanceID); err != nil {
		return nil, fmt.Errorf("register instance %s: %w", p.identity.InstanceID, err)
	}

	// One issuer for the data account: its signing key is derived once, for every user of it.
	if p.dataIssuer, err = mint.NewIssuer(p.material.Data.Public(), p.material.Data.Signer, cfg.Now); err != nil {
		return nil, err
	}
	if p.serveNC, err = p.connect("serving", p.dataIssuer, subjects.ServingGrant(cfg.Space)); err != nil {
		return nil, err
	}
	if err := p.addService(); err != nil {
		return nil, err
	}
	// Watch from here on: the watch's first value is the gate as it is now, so an epoch that
	// moved since the registration fences at once.
	p.bg.Add(1)
	go func() {
		defer p.bg.Done()
		if err := instance.Watch(bg, p.stores.Auth, p.gate); err != nil && bg.Err() == nil {
			p.fence(err)
		}
	}()
	if err := p.serveHTTP(); err != nil {
		return nil, err
	}
	if err := p.writeServiceInfo(); err != nil {
		return nil, err
	}
	p.log.Info("authority plane ready", "space", cfg.Space, "instance", p.identity.InstanceID,
		"epoch", p.gate.Row.ProcessEpoch, "nats", p.natsURL, "http", p.httpURL)
	return p, nil
}

// loadMaterial loads the space material, creating it on a first embedded start. Against an
// existing cluster the material must be the one its servers were configured from (`authplane
// init`), so it is never created there.
func (p *Plane) loadMaterial() error {
	dir := p.cfg.SpaceDirOrDefault()
	if p.cfg.NATSURL == "" {
		var err error
		p.material, p.created, err = space.LoadOrCreate(dir, p.cfg.Space)
		return err
	}
	m, err := space.Load(dir)
	if errors.Is(err, space.ErrNotFound) {
		return fmt.Errorf("--nats-url needs the space material its servers were set up with: none in %s (write it with 'authplane init' and pass --space-dir)", dir)
	}
	if err != nil {
		return err
	}
	if m.Space != p.cfg.Space {
		return fmt.Errorf("space material in %s is for space %q, not --space %q", dir, m.Space, p.cfg.Space)
	}
	p.material = m
	return nil
}

// connect opens one of the plane's own connections as a fresh short-lived user of issuer's
// account, renewed by reconnecting at two thirds of its life.
func (p *Plane) connect(role string, iss *mint.Issuer, g subjects.Grant) (*nats.Conn, error) {
	ttl := p.cfg.PlaneUserTTL
	auth, err := iss.Connect("plane."+role+"_"+p.identity.InstanceID, g, ttl)
	if err != nil {
		return nil, err
	}
	log := p.log.With("conn", role)
	nc, err := nats.Connect(p.natsURL, auth,
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
		return nil, fmt.Errorf("connect %s user to %s: %w", role, p.natsURL, err)
	}
	p.bg.Add(1)
	go func() {
		defer p.bg.Done()
		t := time.NewTicker(ttl * 2 / 3)
		defer t.Stop()
		for {
			select {
			case <-p.done:
				return
			case <-t.C:
				if err := nc.ForceReconnect(); err != nil && !nc.IsClosed() {
					log.Warn("renewing the plane's user failed", "err", err)
				}
			}
		}
	}()
	return nc, nil
}

func (p *Plane) addService() error {
	cfg := p.cfg
	svc, err := micro.AddService(p.serveNC, micro.Config{
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
		StatsHandler: handlers.Stats,
	})
	if err != nil {
		return fmt.Errorf("micro service: %w", err)
	}
	p.svc = svc
	p.recorder = records.New(cfg.Space, p.stores, p.log, cfg.Now)
	guard := &handlers.Guard{
		Space:    cfg.Space,
		Timeout:  cfg.RequestTimeout,
		Limiter:  handlers.NewLimiter(cfg.Rate, cfg.Burst),
		Recorder: p.recorder,
		Log:      p.log,
		Fenced:   p.fenced.Load,
	}
	if p.manager, err = p.managerEngine(); err != nil {
		return err
	}
	serve := map[string]handlers.Func{
		subjects.EndpointManagerAuthority:    handlers.ManagerAuthority(p.manager),
		subjects.EndpointRunRevoke:           handlers.Unimplemented(subjects.EndpointRunRevoke),
		subjects.EndpointSupervisorAssign:    handlers.Unimplemented(subjects.EndpointSupervisorAssign),
		subjects.EndpointSupervisorAuthority: handlers.Unimplemented(subjects.EndpointSupervisorAuthority),
		subjects.EndpointSupervisorEnd:       handlers.Unimplemented(subjects.EndpointSupervisorEnd),
	}
	group := svc.AddGroup(subjects.AuthPrefix(cfg.Space))
	for _, endpoint := range subjects.Endpoints {
		if err := handlers.Register(group, guard, endpoint, serve[endpoint], cfg.Workers); err != nil {
			return fmt.Errorf("register endpoint %s: %w", endpoint, err)
		}
	}
	return nil
}

func (p *Plane) managerEngine() (*manager.Engine, error) {
	m := p.material
	key, err := manager.ProofKey(m.Data.Signer)
	if err != nil {
		return nil, err
	}
	e := &manager.Engine{
		Space:       p.cfg.Space,
		Account:     m.Data.Public(),
		Gates:       p.stores.Auth,
		Ledger:      p.stores.Actors,
		Issuer:      p.dataIssuer,
		ProofKey:    key,
		Records:     p.recorder,
		StandingTTL: p.cfg.StandingTTL,
		Now:         p.cfg.Now,
		Fenced:      p.fenced.Load,
	}
	if p.cfg.Hooks != nil {
		e.BeforeCommit = p.cfg.Hooks.BeforeCommit
	}
	return e, nil
}

func (p *Plane) serveHTTP() error {
	l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(p.cfg.HTTPPort)))
	if err != nil {
		return fmt.Errorf("--http-port %d: %w (pick another port, or 0 for a free one)", p.cfg.HTTPPort, err)
	}
	p.httpURL = "http://" + l.Addr().String()
	p.httpSrv = &http.Server{
		Handler:           httpface.Loopback(subjects.Issuer(p.cfg.Space)),
		ReadHeaderTimeout: 5 * time.Second,
		ReadTimeout:       10 * time.Second,
		WriteTimeout:      15 * time.Second,
		MaxHeaderBytes:    16 << 10,
		ErrorLog:          slog.NewLogLogger(p.log.Handler(), slog.LevelDebug),
	}
	p.bg.Add(1)
	go func() {
		defer p.bg.Done()
		if err := p.httpSrv.Serve(l); err != nil && !errors.Is(err, http.ErrServerClosed) {
			p.finish(fmt.Errorf("http face: %w", err))
		}
	}()
	return nil
}

func (p *Plane) writeServiceInfo() error {
	c := make([]byte, 32)
	if _, err := rand.Read(c); err != nil {
		return err
	}
	spaceDir, err := filepath.Abs(p.material.Dir)
	if err != nil {
		return err
	}
	data, err := json.MarshalIndent(ServiceInfo{
		Ver: 1, URL: p.httpURL, NATSURL: p.natsURL, SpaceDir: spaceDir, PID: os.Getpid(), Cap: hex.EncodeToString(c),
	}, "", "  ")
	if err != nil {
		return err
	}
	return files.WriteAtomic(filepath.Join(p.cfg.Dir, ServiceInfoFile), append(data, '\n'), files.Private)
}

// fence stops serving at once: a newer registration of this instance owns it now.
func (p *Plane) fence(cause error) {
	if !errors.Is(cause, instance.ErrFenced) {
		p.log.Error("instance watch failed; stopping", "err", cause)
	} else {
		p.log.Error("fenced: another process registered this instance at a newer epoch; stopping", "err", cause)
	}
	p.fenced.Store(true)
	if p.svc != nil {
		if err := p.svc.Stop(); err != nil {
			p.log.Warn("stopping the micro service", "err", err)
		}
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

// Close stops the plane: the micro service first (in-flight requests finish), then the HTTP
// face, the connections and the embedded broker; it removes auth-service.json and releases the
// state directory. It returns why the plane had stopped on its own, if it had.
func (p *Plane) Close() error {
	err := p.teardown()
	return errors.Join(p.Err(), err)
}

func (p *Plane) teardown() error {
	var errs []error
	p.closing.Do(func() {
		p.finish(nil)
		if p.stop != nil {
			p.stop()
		}
		if p.svc != nil {
			if err := p.svc.Stop(); err != nil {
				errs = append(errs, err)
			}
		}
		if p.httpSrv != nil {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			if err := p.httpSrv.Shutdown(ctx); err != nil {
				errs = append(errs, err)
			}
			cancel()
		}
		// Serving first: its in-flight requests still need the store connection.
		for _, nc := range []*nats.Conn{p.serveNC, p.storeNC} {
			if err := drain(nc, 5*time.Second); err != nil {
				errs = append(errs, err)
			}
		}
		p.bg.Wait()
		if p.broker != nil {
			p.broker.Shutdown()
		}
		if p.lock != nil {
			if err := os.Remove(filepath.Join(p.cfg.Dir, ServiceInfoFile)); err != nil && !errors.Is(err, os.ErrNotExist) {
				errs = append(errs, err)
			}
			if err := p.lock.Release(); err != nil {
				errs = append(errs, err)
			}
		}
	})
	return errors.Join(errs...)
}

// Accessors for main and tests.

// NATSURL is the broker URL the plane serves on.
func (p *Plane) NATSURL() string { return p.natsURL }

// HTTPURL is the loopback HTTP face's base URL.
func (p *Plane) HTTPURL() string { return p.httpURL }

// InstanceID is the plane's instance id.
func (p *Plane) InstanceID() string { return p.identity.InstanceID }

// Epoch is the process epoch this start registered.
func (p *Plane) Epoch() uint64 { return p.gate.Row.ProcessEpoch }

// Material is the space material served.
func (p *Plane) Material() *space.Material { return p.material }

// CreatedMaterial reports whether this start created the space material.
func (p *Plane) CreatedMaterial() bool { return p.created }

// Stores are the plane's buckets, for tools and tests.
func (p *Plane) Stores() *store.Stores { return p.stores }

// Manager is the plane's manager-authority engine, for tests that must act beside the bus.
func (p *Plane) Manager() *manager.Engine { return p.manager }

// ServiceID is the micro service instance id.
func (p *Plane) ServiceID() string { return p.svc.Info().ID }

// drain drains nc and waits until it has closed, or closes it after timeout.
func drain(nc *nats.Conn, timeout time.Duration) error {
	if nc == nil || nc.IsClosed() {
		return nil
	}
	defer nc.Close()
	if err := nc.Drain(); err != nil {
		if errors.Is(err, nats.ErrConnectionClosed) {
			return nil
		}
		return err
	}
	deadline := time.Now().Add(timeout)
	for !nc.IsClosed() && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	return nil
}
