package service

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/cotal-ai/authplane/internal/core/fault"
	"github.com/cotal-ai/authplane/internal/platform/broker"
	"github.com/cotal-ai/authplane/internal/platform/conns"
)

// ReconcileEvery is how often the plane lists the data account's connections to put its count
// right: a connect or disconnect event lost (the system connection reconnecting, a server
// gone with its connections) is corrected within it. A listing also follows every
// reconnection of the system connection.
const ReconcileEvery = time.Minute

// kickQueue bounds the kicks waiting to be sent; past it a kick waits for the next listing.
// kickSenders send them, each one kick at a time (a round trip to the connection's server): a
// connection past its budget lives until its kick lands, and a client that reconnects as soon
// as it is kicked keeps as many alive as kicks wait, so one sender fell behind such churn.
const (
	kickQueue   = 4096
	kickSenders = 8
)

// watchConnections keeps the data account's connections to their budgets (internal/platform/conns) as
// the plane's system user: it counts them from every server's connect and disconnect events,
// lists them once before the plane serves (kicking what is past a budget before the serving
// user needs its slot) and every ReconcileEvery after, and kicks what the ledger says.
func (p *Plane) watchConnections(ctx context.Context) error {
	cfg := p.cfg
	hold := conns.DefaultHold
	if cfg.Hooks != nil && cfg.Hooks.ConnectionHold > 0 {
		hold = cfg.Hooks.ConnectionHold
	}
	p.conns = conns.New(conns.Budgets{
		PerPrincipal: int(cfg.MaxConnectionsPerPrincipal),
		PerOwner:     int(cfg.MaxConnectionsPerOwner),
		Tenants:      int(cfg.MaxConnections - cfg.ReservedConnections),
		Reserved:     int(cfg.ReservedConnections),
		Backoff:      conns.DefaultBackoff,
		Hold:         hold,
		Grace:        conns.DefaultGrace,
	}, cfg.Now)
	p.metrics.Connections(func() (int, int) { c := p.conns.Counts(); return c.Tenants, c.Plane })
	acct := p.dataAccount
	queue := make(chan conns.Kick, kickQueue)
	enqueue := func(kicks []conns.Kick) {
		for _, k := range kicks {
			if !k.HoldUntil.IsZero() {
				p.hold(k)
			}
			select {
			case queue <- k:
			default:
				p.conns.KickFailed(k.Connection) // counted again; the next listing kicks it
			}
		}
	}
	stopWatch, err := acct.WatchConnections(func(c broker.Connection) { enqueue(p.conns.Connected(c)) }, p.conns.Disconnected)
	if err != nil {
		return fmt.Errorf("watch the data account's connections: %w", err)
	}
	p.onClose("stop watching the data account's connections", stopWatch)
	// Before the plane serves, its count is the broker's, and what it finds past a cap is closed
	// once the ledger's grace has passed.
	kicks := p.reconcile(ctx, acct)
	due, next := p.conns.Due()
	kicks = append(kicks, due...)
	if !next.IsZero() {
		select {
		case <-ctx.Done():
		case <-time.After(next.Sub(cfg.Now())):
		}
		due, _ = p.conns.Due()
		kicks = append(kicks, due...)
	}
	for _, k := range kicks {
		if !k.HoldUntil.IsZero() {
			p.hold(k)
		}
		p.kick(ctx, acct, k)
	}

	stop := make(chan struct{})
	var kickers sync.WaitGroup
	for range kickSenders {
		kickers.Go(func() {
			for {
				select {
				case <-stop:
					return
				case k := <-queue:
					kctx, cancel := context.WithTimeout(context.Background(), cfg.RequestTimeout)
					p.kick(kctx, acct, k)
					cancel()
				}
			}
		})
	}
	// A cap read past is judged when the ledger's grace has passed; its kicks go the same way.
	p.bg.Go(func() {
		t := time.NewTimer(0)
		t.Stop() // armed while a cap waits out its grace
		defer t.Stop()
		for {
			select {
			case <-stop:
				return
			case <-p.conns.Judging():
			case <-t.C:
			}
			kicks, next := p.conns.Due()
			enqueue(kicks)
			if !next.IsZero() {
				t.Reset(next.Sub(cfg.Now()))
			}
		}
	})
	p.bg.Go(func() {
		t := time.NewTicker(ReconcileEvery)
		defer t.Stop()
		for {
			select {
			case <-stop:
				return
			case <-t.C:
			case <-p.relist:
			}
			lctx, cancel := context.WithTimeout(context.Background(), cfg.RequestTimeout)
			enqueue(p.reconcile(lctx, acct))
			cancel()
		}
	})
	p.onClose("stop keeping the connection budgets", func() error { close(stop); kickers.Wait(); return nil })
	return nil
}

// hold holds k's user key out at the broker until k.HoldUntil: it keeps connecting in its
// back-off, and each of its connections takes one of the account's slots until its kick lands.
func (p *Plane) hold(k conns.Kick) {
	if !p.signers.Hold(k.User, conns.OwnerOf(k.Principal), k.HoldUntil) {
		return // no operator signing key: the kicks alone keep it to its cap
	}
	p.metrics.ConnectionRefused(conns.BudgetBackoff, "hold")
	p.log.Warn("a JWT user kept connecting past its connection cap in its back-off; its key is being held out at the broker, every connection of it closed",
		"principal", k.Principal, "user", k.User, "until", k.HoldUntil.UTC().Format(time.RFC3339))
}

// reconcile lists the data account's connections and puts the ledger right with them; it
// returns what to kick. A listing that fails leaves the ledger as it was.
func (p *Plane) reconcile(ctx context.Context, acct broker.Account) []conns.Kick {
	n, err := acct.Servers(ctx)
	if err != nil {
		p.log.Warn("listing the data account's connections: the servers did not all answer", "err", err)
		return nil
	}
	asked := p.cfg.Now()
	listed, _, err := acct.ListConnections(ctx, n)
	if err != nil {
		p.log.Warn("listing the data account's connections failed", "err", err)
		return nil
	}
	kicks := p.conns.Reconcile(asked, listed)
	if c := p.conns.Counts(); c.OverReserve && p.overReserve.CompareAndSwap(false, true) {
		p.log.Warn("the plane's own connections to the data account outgrew --reserved-connections: raise it to two per replica",
			"plane", c.Plane, "reserved", p.cfg.ReservedConnections)
	}
	return kicks
}

// kick closes a connection past its budget, and counts it; one that could not be closed
// counts as live again.
func (p *Plane) kick(ctx context.Context, acct broker.Account, k conns.Kick) {
	if err := acct.Kick(ctx, k.Server, k.CID); err != nil {
		p.conns.KickFailed(k.Connection)
		p.log.Warn("a connection past its budget could not be kicked", "principal", k.Principal, "budget", k.Budget, "err", err)
		return
	}
	p.metrics.ConnectionRefused(k.Budget, "kick")
	if n := p.kicked.Add(1); fault.Sparse(n) {
		p.log.Warn("kicked a connection past its budget", "principal", k.Principal, "budget", k.Budget, "kicked", n)
	}
}
