package service

import (
	"context"
	"errors"
	"strconv"
	"sync"
	"time"

	"github.com/cotal-ai/authplane/handlers"
	"github.com/cotal-ai/authplane/internal/capability/bearer"
	"github.com/cotal-ai/authplane/internal/capability/instance"
	"github.com/cotal-ai/authplane/internal/capability/manager"
	"github.com/cotal-ai/authplane/internal/capability/supervisor"
	"github.com/cotal-ai/authplane/internal/core/audit"
	"github.com/cotal-ai/authplane/internal/core/fault"
	"github.com/cotal-ai/authplane/internal/core/fence"
	"github.com/cotal-ai/authplane/internal/core/issue"
	"github.com/cotal-ai/authplane/internal/core/store"
	"github.com/cotal-ai/authplane/internal/platform/metrics"
	"github.com/cotal-ai/authplane/subjects"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"
)

// serving is one generation of the serving side: a connection of a fresh data-account user and
// the micro service instance on it. A generation is replaced before its user expires.
type serving struct {
	nc     *nats.Conn
	served *handlers.Served
}

// doors are what every call passes and what serves it, built once and served on the bus and on
// HTTP: the guard, the issuance pipeline, every endpoint's handler, the HTTP doors.
type doors struct {
	records *audit.Writer
	guard   *handlers.Guard
	fns     map[string]handlers.Func
	http    *handlers.HTTP
	callout *handlers.Callout
}

// buildDoors builds the doors, the audit writer's summary flusher with them.
func (p *Plane) buildDoors(dataIssuer *issue.Issuer) (*doors, error) {
	cfg := p.cfg
	recorder := audit.New(cfg.Space, p.stores, p.log, cfg.Now)
	recorder.PerMinute, recorder.Summarized = cfg.AuditRecords, p.metrics.Summarized
	// The record budgets' summaries are flushed until the services have stopped, then once
	// more (this closer runs after theirs).
	p.untilClose("flush the audit summaries", recorder.Run)
	claims := &issue.Claims{KV: p.stores.Auth}
	// An owner may claim its whole budget at once, and gets it back over the minted records'
	// retention: in any such window it holds at most twice its budget of new keys' records.
	// The callout's users each get a key the broker chose: as many a bearer's life as the
	// owner may hold connections, so each can connect again with every new bearer.
	bearerLife := bearer.MaxTTL + bearer.Skew
	// Every tenant budget but the per-principal rate is a row in the fence bucket, so it holds
	// per space (docs/OPERATIONS.md, "Budgets").
	stored := func(name string, perSecond float64, burst int) *issue.StoredBudget {
		return &issue.StoredBudget{KV: p.stores.Auth, Budget: name, PerSecond: perSecond, Burst: burst, Now: cfg.Now}
	}
	newKeys := &issue.KeyBudgets{
		PerOwner: stored(issue.NewKeysOwner, float64(cfg.NewKeysPerOwner)/store.MintedMaxAge.Seconds(), cfg.NewKeysPerOwner),
		Window:   store.MintedMaxAge, Limit: cfg.NewKeysPerOwner,
		PerOwnerConnections: stored(issue.ConnectionKeysOwner, float64(cfg.MaxConnectionsPerOwner)/bearerLife.Seconds(), int(cfg.MaxConnectionsPerOwner)),
		ConnectionsWindow:   bearerLife, ConnectionsLimit: int(cfg.MaxConnectionsPerOwner),
	}
	pipeline := &issue.Pipeline{Issuer: dataIssuer, Audit: counted{recorder, p.metrics}, Claims: claims, NewKeys: newKeys, Now: cfg.Now, Fenced: p.fenced.Load,
		Limits: issue.Limits{Subs: cfg.MaxSubscriptions, Payload: cfg.MaxPayload}}
	if cfg.Hooks != nil {
		pipeline.BeforeCommit = cfg.Hooks.BeforeCommit
	}
	if p.signers.Sign != nil {
		pipeline.Signers = p.signers // else every credential is signed with the data account's key
	}
	proofKey, err := manager.ProofKey(p.keys.Data.Signer)
	if err != nil {
		return nil, err
	}
	engine := &manager.Engine{
		Space:                cfg.Space,
		Account:              p.keys.Data.Public(),
		Gates:                fence.Group(p.stores.Auth), // mints that observed the same row commit together
		Ledger:               p.stores.Actors,
		Admissions:           p.stores.Admission,
		Statuses:             p.stores.RunStatus,
		Witness:              p.stores,
		Pipeline:             pipeline,
		ProofKey:             proofKey,
		Trust:                p.trust(),
		StandingTTL:          cfg.StandingTTL,
		MaxInstancesPerOwner: cfg.MaxInstancesPerOwner,
		// A tenth of an hour's budget at once.
		Reregistrations: &manager.Reregistrations{
			PerOwner:       stored(issue.ReregistrationsOwner, float64(cfg.ReregistrationsPerOwner)/3600, max(cfg.ReregistrationsPerOwner/10, 1)),
			InstanceHourly: cfg.ReregistrationsPerInstance, OwnerHourly: cfg.ReregistrationsPerOwner, Now: cfg.Now,
		},
		Records: recorder,
	}
	sup := &supervisor.Supervisor{
		Space:    cfg.Space,
		Account:  p.keys.Data.Public(),
		Platform: p.stores.Platform,
		Gates:    p.stores.Auth,
		Ledger:   p.stores.Actors,
		Issued:   p.stores.Issued,
		Accepted: p.stores.Accepted,
		Engine:   engine,
		Minted:   recorder,
		Claims:   claims,
		Signers:  p.signers,
		Audit:    recorder,
		MaxTTL:   cfg.MaxAssignmentTTL,
		Now:      cfg.Now,
	}
	if cfg.Hooks != nil {
		sup.AfterEndStep = cfg.Hooks.AfterEndStep
	}
	engine.Assignments = sup
	d := &doors{records: recorder, guard: &handlers.Guard{Limiter: issue.NewBuckets(cfg.Rate, cfg.Burst, cfg.Now), OwnerInFlight: cfg.OwnerInFlight, Audit: recorder, Fenced: p.fenced.Load,
		Draining: p.draining.Load, Unsynced: func() bool { return p.unsyncedRefused() != "" }, Metrics: p.metrics}}
	d.fns = map[string]handlers.Func{
		subjects.EndpointManagerAuthority:    handlers.ManagerAuthority(engine),
		subjects.EndpointRunRevoke:           handlers.RunRevoke(engine),
		subjects.EndpointSupervisorAssign:    handlers.SupervisorAssign(sup),
		subjects.EndpointSupervisorAuthority: handlers.SupervisorAuthority(sup),
		subjects.EndpointSupervisorEnd:       handlers.SupervisorEnd(sup),
	}
	if d.http, err = p.httpDoors(d); err != nil {
		return nil, err
	}
	// The callout signs an answer for every connection: its key is derived once.
	calloutSigner, err := issue.Derived(p.keys.Callout.Signer)
	if err != nil {
		return nil, err
	}
	d.callout = &handlers.Callout{
		Space: cfg.Space, Guard: d.guard, Keys: d.http.Keys, Ledger: p.stores.Actors, Pipeline: pipeline,
		Account: p.keys.Callout.Public(), Signer: calloutSigner, XKey: p.keys.CalloutXKey,
		Log:   p.log.With("face", "callout"),
		Conns: p.conns, Refused: func(budget string) { p.metrics.ConnectionRefused(budget, "callout") },
	}
	return d, nil
}

// serveBus serves the doors on a first generation of the serving side, replaced at two thirds
// of the plane users' lifetime: the new generation registers before the old one stops, so
// callers never meet a moment with no responders.
func (p *Plane) serveBus(dataIssuer *issue.Issuer, d *doors) error {
	cfg := p.cfg
	bus := &handlers.Bus{Space: cfg.Space, Timeout: cfg.RequestTimeout, Guard: d.guard, Log: p.log}
	fns := d.fns
	open := func() (*serving, error) {
		auth, err := p.servingAuth(dataIssuer)
		if err != nil {
			return nil, err
		}
		// The broker closes it when a rotation takes its signing key off: it connects again at
		// once, under the new one, however often the old one is refused first.
		nc, err := p.dialWith("serving", auth, nil, nats.IgnoreAuthErrorAbort(), nats.CustomReconnectDelay(func(round int) time.Duration {
			if round == 1 {
				return 0
			}
			return 250 * time.Millisecond
		}))
		if err != nil {
			return nil, err
		}
		served, err := bus.Register(nc, p.microConfig(), fns, cfg.Workers)
		if err == nil {
			// A round trip: the broker holds every subscription before anyone counts on them
			// (a caller right behind the start, the old generation about to stop).
			err = nc.FlushTimeout(cfg.RequestTimeout)
		}
		s := &serving{nc: nc, served: served}
		if err != nil {
			return nil, errors.Join(err, p.retire(s))
		}
		return s, nil
	}
	first, err := open()
	if err != nil {
		return err
	}
	p.serving.Store(first)
	// The closers run last pushed, first run: the services stop, then the connection drains.
	p.onClose("drain the serving connection", func() error { return drain(p.serving.Load().nc, p.drainTimeout()) })
	p.onClose("stop the micro services", p.stopServices)
	var renewing sync.Mutex
	renew := func() error {
		renewing.Lock()
		defer renewing.Unlock()
		if p.fenced.Load() {
			return nil
		}
		next, err := open()
		if err != nil {
			return p.renewal("serving", err)
		}
		p.renewal("serving", nil)
		old := p.serving.Swap(next)
		p.log.Debug("renewed the serving user", "conn", "serving")
		p.bg.Go(func() {
			if err := p.retire(old); err != nil {
				p.log.Warn("retiring the previous serving connection", "err", err)
			}
		})
		return nil
	}
	p.rot.renewServing.Store(&renew)
	p.renewEvery("serving user", renew)
	return nil
}

// retire stops a generation's service and drains its connection: requests in flight finish.
func (p *Plane) retire(s *serving) error {
	return errors.Join(s.served.Stop(time.Now().Add(p.drainTimeout())), drain(s.nc, p.drainTimeout()))
}

// microConfig is the micro service each generation registers: its name, version, queue group
// and metadata.
func (p *Plane) microConfig() micro.Config {
	cfg := p.cfg
	return micro.Config{
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
	}
}

// stopServices stops the current micro service instance: no more requests arrive (those in
// flight finish while the serving connection drains). On a connection that is down there is
// nothing to unsubscribe from: that is logged, not failed.
func (p *Plane) stopServices() error {
	s := p.serving.Load()
	if s == nil {
		return nil
	}
	err := s.served.Stop(time.Now().Add(p.drainTimeout()))
	if err != nil && !p.connected() {
		p.log.Warn("stopping the micro services while disconnected", "err", err)
		return nil
	}
	return err
}

// watchFence watches the plane's own gate from here on: the watch's first value is the gate as
// it is now, so an epoch that moved since the registration fences at once.
func (p *Plane) watchFence() {
	ctx, stop := context.WithCancel(context.Background())
	p.bg.Go(func() {
		if err := instance.Watch(ctx, p.stores.Auth, p.gate, p.rewatch); err != nil && ctx.Err() == nil {
			p.fence(err)
		}
	})
	p.onClose("stop watching the plane's gate", func() error { stop(); return nil })
}

// counted is the pipeline's recorder that also counts, for the metrics, the credentials whose
// mint committed and the mints discarded.
type counted struct {
	issue.Recorder
	m *metrics.Metrics
}

func (c counted) LogMinted(req audit.Request, creds []audit.Credential) {
	c.Recorder.LogMinted(req, creds)
	for _, cred := range creds {
		c.m.Issued(req.Endpoint, cred.Duty)
	}
}

func (c counted) Discarded(ctx context.Context, req audit.Request, creds []audit.Credential, refusal *fault.Error) {
	c.Recorder.Discarded(ctx, req, creds, refusal)
	c.m.Discarded(req.Endpoint, string(refusal.Code))
}
