package service

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/cotal-ai/authplane/internal/core/issue"
	"github.com/cotal-ai/authplane/internal/core/store"
	"github.com/cotal-ai/authplane/internal/platform/broker"
	"github.com/cotal-ai/authplane/subjects"
)

// SyncCheckEvery is how often the plane reads again how every server of its broker syncs its
// JetStream store: a server that joined since, or restarted with another setting, is seen
// within it.
const SyncCheckEvery = 30 * time.Second

// ErrUnsynced: a server of the broker acknowledges JetStream writes before they are on its
// disk, and --allow-unsynced does not accept that.
var ErrUnsynced = errors.New("a server does not sync every write")

// connectSystem opens the plane's system-account user's connection: it reads the servers'
// settings, pushes the account JWTs, and watches the data account's connections (a listing
// follows each of its reconnections).
func (p *Plane) connectSystem() error {
	sysIssuer, err := issue.NewIssuer(p.keys.System.Public(), p.keys.System.Signer, p.cfg.Now)
	if err != nil {
		return err
	}
	// Connection events missed while it was away are put right by a listing, and a server's
	// (re)join by a push of the newest account JWT.
	reconnected := func() {
		for _, c := range []chan struct{}{p.relist, p.repush} {
			select {
			case c <- struct{}{}:
			default: // one is pending already
			}
		}
	}
	// A push made while the connection is down fails rather than waits in nats.go's buffer: a
	// buffered one would reach the servers after the connection came back, older than what
	// was pushed since (a server stores what it is pushed, whatever its issue time).
	p.system, err = p.connectRenewed("system", sysIssuer, subjects.SystemPermissions(p.keys.Data.Public(), p.keys.Plane.Public()), reconnected,
		nats.ReconnectBufSize(-1))
	return err
}

// checkSync reads how every server syncs its store before the plane writes anything: a server
// that does not sync every write refuses the start (ErrUnsynced, naming it and its setting)
// unless --allow-unsynced accepts it, which the log, /health and authplane_unsynced_servers
// then say. From here on it is read again every SyncCheckEvery.
func (p *Plane) checkSync(ctx context.Context) error {
	// A cluster that has just formed may not route a request to every server yet: each reading
	// gets a few seconds, and the start tries again for as long as it opens its stores.
	by, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	var unsynced []string
	for attempt := 0; ; attempt++ {
		rctx, cancel := context.WithTimeout(by, 3*time.Second)
		var err error
		unsynced, err = p.readSync(rctx)
		cancel()
		if err == nil {
			break
		}
		if attempt == 0 {
			p.log.Info("not every server answered how it syncs yet (a new cluster routes its requests first); retrying", "err", err)
		}
		if perr := store.Pause(by, attempt); perr != nil {
			return fmt.Errorf("%w (gave up: %w)", err, perr)
		}
	}
	if len(unsynced) > 0 && !p.cfg.AllowUnsynced {
		return fmt.Errorf("%w: %s; an OS crash or a power cut there can take back writes the plane acknowledged "+
			"(fences, claims, revocations): set `sync_interval: always` in its jetstream block, or accept the risk with --allow-unsynced",
			ErrUnsynced, strings.Join(unsynced, "; "))
	}
	if len(unsynced) > 0 {
		p.log.Warn("serving on servers that do not sync every write (--allow-unsynced): an OS crash or a power cut there can take back writes the plane acknowledged",
			"unsynced", unsynced)
	}
	every := SyncCheckEvery
	if p.cfg.Hooks != nil && p.cfg.Hooks.SyncCheckEvery > 0 {
		every = p.cfg.Hooks.SyncCheckEvery
	}
	p.untilClose("stop reading the servers' sync settings", func(ctx context.Context) {
		onEveryTick(ctx, every, false, func() {
			rctx, cancel := context.WithTimeout(ctx, max(every, p.cfg.RequestTimeout))
			defer cancel()
			before := len(p.unsyncedServers())
			unsynced, err := p.readSync(rctx)
			switch {
			case ctx.Err() != nil:
			case err != nil:
				p.log.Warn("the servers' sync settings were not read; read again in "+every.String(), "err", err)
			case len(unsynced) > 0 && !p.cfg.AllowUnsynced:
				p.log.Error("a server does not sync every write: the plane answers every request unavailable until it does (or --allow-unsynced accepts it)",
					"unsynced", unsynced)
			case len(unsynced) > 0 && len(unsynced) != before:
				p.log.Warn("serving on servers that do not sync every write (--allow-unsynced)", "unsynced", unsynced)
			case len(unsynced) == 0 && before > 0:
				p.log.Info("every server syncs every write again")
			}
		})
	})
	return nil
}

// readSync reads every server's setting and keeps, for the guard, /health and the metrics,
// those that do not sync every write, each named with its setting.
func (p *Plane) readSync(ctx context.Context) ([]string, error) {
	syncs, err := broker.Syncs(ctx, p.system)
	if err != nil {
		return nil, err
	}
	unsynced := []string{}
	for _, s := range syncs {
		if !s.Synced() {
			unsynced = append(unsynced, s.String())
		}
	}
	p.unsynced.Store(&unsynced)
	return unsynced, nil
}

// unsyncedServers names the servers that did not sync every write at the last reading.
func (p *Plane) unsyncedServers() []string {
	if u := p.unsynced.Load(); u != nil {
		return *u
	}
	return nil
}

// unsyncedRefused says why the plane answers every request unavailable: a server that does not
// sync every write joined, and --allow-unsynced does not accept it; "" when it serves.
func (p *Plane) unsyncedRefused() string {
	if u := p.unsyncedServers(); len(u) > 0 && !p.cfg.AllowUnsynced {
		return "unsynced: " + strings.Join(u, "; ") + " (set sync_interval: always there, or accept the risk with --allow-unsynced)"
	}
	return ""
}
