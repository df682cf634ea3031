package service

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats.go"

	"github.com/cotal-ai/authplane/internal/capability/signers"
	"github.com/cotal-ai/authplane/internal/core/issue"
	"github.com/cotal-ai/authplane/internal/platform/broker"
	"github.com/cotal-ai/authplane/internal/platform/space"
	"github.com/cotal-ai/authplane/subjects"
)

// SignersRecheckEvery is how often the plane sweeps the data account's live signing keys and
// checks that every server of the broker lists exactly them, signing and pushing them again
// when one does not: a push of an older account JWT (by anything else that pushes the data
// account, or one of a replica's that reached a server late) is undone at the next recheck
// after the set's last signing is signers.RecheckGrace old.
const SignersRecheckEvery = 30 * time.Second

// clockSkew is how far apart the clocks of two replicas may be.
const clockSkew = time.Minute

// accountJWTFile, in the state directory, is the plane's own synced copy of the newest data
// account JWT it signed, for the embedded broker's resolver at the next start.
const accountJWTFile = "data-account.jwt"

// newSigners builds the data account's signer set, pushed and read back through system.
func (p *Plane) newSigners(system *nats.Conn) error {
	keys, err := signers.NewKeys(p.cfg.Space, p.keys.Data.Public(), p.keys.Data.Signer, p.cfg.Now)
	if err != nil {
		return err
	}
	var b signers.Broker = p.dataAccount
	if p.cfg.Hooks != nil && p.cfg.Hooks.SignersBroker != nil {
		b = p.cfg.Hooks.SignersBroker(b)
	}
	// A key added for a first registration that never commits goes once the registration's
	// deadline has passed twice over, whatever the replicas' clocks say.
	p.signers = &signers.Set{Gates: p.stores.Auth, Account: p.keys.Data.Public(), Keys: keys, Broker: b, Now: p.cfg.Now,
		Settle: 2 * (p.cfg.RequestTimeout + clockSkew)}
	p.untilClose("stop the evictions' listings", p.signers.ServeEvictions)
	p.untilClose("stop the signing keys' rounds", p.signers.Serve)
	if p.keys.OperatorSigner == nil {
		return nil // every credential is signed with the data account's own key
	}
	p.signers.Sign = func(keys []string, held map[string]int64) (string, int64, error) {
		return p.keys.DataAccountJWT(space.DataPolicy{MaxConnections: p.cfg.MaxConnections, Signers: keys, Revoked: held})
	}
	if p.info.Embedded {
		p.signers.Keep = func(token string) error {
			return space.WriteAtomic(filepath.Join(p.cfg.Dir, accountJWTFile), []byte(token), space.Private)
		}
	}
	// The account JWT that lists the keys is pushed to, and read back from, every server in one
	// message: the broker's largest bounds how many instances the space holds.
	if p.signers.Capacity, err = signers.Capacity(p.signers.Sign, system.MaxPayload()); err != nil {
		return fmt.Errorf("data account policy: %w", err)
	}
	if p.cfg.Hooks != nil && p.cfg.Hooks.SignersCapacity > 0 {
		p.signers.Capacity = min(p.signers.Capacity, p.cfg.Hooks.SignersCapacity)
	}
	p.info.InstanceCapacity = p.signers.Capacity
	return nil
}

// keptAccountJWT is the newest data account JWT a past run of the plane signed, kept in the
// state directory; "" if none (or not the data account's).
func (p *Plane) keptAccountJWT() (string, error) {
	data, err := os.ReadFile(filepath.Join(p.cfg.Dir, accountJWTFile))
	if errors.Is(err, os.ErrNotExist) {
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("read the kept data account JWT: %w", err)
	}
	claims, err := jwt.DecodeAccountClaims(string(data))
	if err != nil || claims.Subject != p.keys.Data.Public() {
		return "", fmt.Errorf("%s in %s is not the data account's JWT: %v", accountJWTFile, p.cfg.Dir, err)
	}
	return string(data), nil
}

// recheckSigners runs the signer set's Recheck every SignersRecheckEvery, and a push of the
// newest account JWT whenever one is asked for (a server (re)joined), until the plane closes.
func (p *Plane) recheckSigners() {
	every := SignersRecheckEvery
	if p.cfg.Hooks != nil && p.cfg.Hooks.SignersRecheckEvery > 0 {
		every = p.cfg.Hooks.SignersRecheckEvery
	}
	p.untilClose("stop rechecking the broker's signing keys", func(ctx context.Context) {
		onEveryTick(ctx, every, false, func() {
			// A recheck that signs again waits for a round (the next second, a push, the
			// set read back from every server): it gets at least the time of a request.
			rctx, cancel := context.WithTimeout(ctx, max(every, p.cfg.RequestTimeout))
			repushed, err := p.signers.Recheck(rctx)
			cancel()
			switch {
			case ctx.Err() != nil:
			case repushed && err != nil:
				p.log.Warn("a server of the broker did not list the data account's live signing keys (an older account JWT was pushed); signed and pushed them again, but the broker did not confirm it; checked again in "+every.String(), "err", err)
			case repushed:
				p.log.Warn("a server of the broker did not list the data account's live signing keys (an older account JWT was pushed); signed and pushed them again")
			case err != nil:
				p.log.Warn("the broker's signing keys were not checked against the set; checked again in "+every.String(), "err", err)
			}
		})
	})
	// A key held out (Hold) is let in again within a second of its time.
	p.untilClose("stop releasing held keys", func(ctx context.Context) {
		onEveryTick(ctx, time.Second, false, func() {
			rctx, cancel := context.WithTimeout(ctx, p.cfg.RequestTimeout)
			err := p.signers.ReleaseHolds(rctx)
			cancel()
			if err != nil && ctx.Err() == nil {
				p.log.Warn("a key held out at the broker is past its time and the account was not signed without it; tried again in a second", "err", err)
			}
		})
	})
	// A server that joined gets the newest JWT at once; a second later, the connections of keys
	// off the set that it admitted meanwhile are kicked, on a goroutine of their own (a listing
	// of every server waits for each, and must not hold up the next push).
	kick := make(chan struct{}, 1)
	p.untilClose("stop pushing the data account to joining servers", func(ctx context.Context) {
		for {
			select {
			case <-ctx.Done():
				return
			case <-p.repush:
			}
			rctx, cancel := context.WithTimeout(ctx, p.cfg.RequestTimeout)
			err := p.signers.Repush(rctx, false)
			cancel()
			if err != nil && ctx.Err() == nil {
				p.log.Warn("a server joined and the newest data account JWT was not confirmed at every server; the recheck tries again", "err", err)
			}
			select {
			case kick <- struct{}{}:
			default: // one is pending already
			}
		}
	})
	p.untilClose("stop kicking what joining servers admitted", func(ctx context.Context) {
		for {
			select {
			case <-ctx.Done():
				return
			case <-kick:
			}
			// The push closed what the server admitted with keys off the set, but one whose
			// authentication was under way as it landed got in after: a listing a moment later
			// finds it.
			select {
			case <-ctx.Done():
				return
			case <-time.After(time.Second):
			}
			rctx, cancel := context.WithTimeout(ctx, p.cfg.RequestTimeout)
			n, err := p.signers.KickStale(rctx)
			cancel()
			switch {
			case err != nil && ctx.Err() == nil:
				p.log.Warn("a server joined; the connections of keys off the data account were not all kicked; the next join or end does", "err", err, "kicked", n)
			case n > 0:
				p.log.Warn("a server joined holding an older data account JWT and admitted credentials of keys off it before the plane pushed the newest; kicked them", "connections", n)
			}
		}
	})
}

// maxPinned bounds the servers of --nats-url the plane keeps a connection of its own to.
const maxPinned = 16

// pinServers keeps a system-user connection of its own to each server --nats-url names (up to
// maxPinned), and pushes the newest data account JWT over it whenever it (re)connects: a server
// that restarts admits clients as soon as it listens, before its routes are up, holding what it
// held when it went down; this connection is back within a reconnect wait of its listening,
// routes or not. It tries again every 50 ms.
func (p *Plane) pinServers() error {
	urls := strings.Split(p.info.NATSURL, ",")
	if p.info.Embedded || len(urls) < 2 {
		return nil // one server: no other serves while it is down
	}
	iss, err := issue.NewIssuer(p.keys.System.Public(), p.keys.System.Signer, p.cfg.Now)
	if err != nil {
		return err
	}
	for i, url := range urls[:min(len(urls), maxPinned)] {
		url = strings.TrimSpace(url)
		push := make(chan struct{}, 1)
		signal := func() {
			select {
			case push <- struct{}{}:
			default: // one is pending already
			}
		}
		nc, err := p.connectRenewed(fmt.Sprintf("system%d", i+1), iss, subjects.SystemPermissions(p.keys.Data.Public(), p.keys.Plane.Public()), signal,
			func(o *nats.Options) error { o.Servers = []string{url}; return nil },
			nats.IgnoreDiscoveredServers(), nats.RetryOnFailedConnect(true), nats.ReconnectBufSize(-1),
			nats.ReconnectWait(50*time.Millisecond), nats.ReconnectJitter(0, 0),
			nats.ConnectHandler(func(*nats.Conn) { signal() }))
		if err != nil {
			return fmt.Errorf("connect to %s of its own: %w", broker.RedactURL(url), err)
		}
		via := broker.Account{NC: nc, Public: p.keys.Data.Public()}
		p.untilClose("stop pushing to "+broker.RedactURL(url), func(ctx context.Context) {
			for {
				select {
				case <-ctx.Done():
					return
				case <-push:
				}
				rctx, cancel := context.WithTimeout(ctx, p.cfg.RequestTimeout)
				err := p.signers.PushVia(rctx, via)
				cancel()
				if err != nil && ctx.Err() == nil {
					p.log.Warn("a server came back and the newest data account JWT could not be pushed to it over its own connection; the push to every server follows", "server", broker.RedactURL(url), "err", err)
				}
				p.askRepush()
			}
		})
	}
	return nil
}

// askRepush asks for the newest data account JWT to be pushed to every server again, and for
// the connections of keys off it to be kicked.
func (p *Plane) askRepush() {
	select {
	case p.repush <- struct{}{}:
	default: // one is pending already
	}
}

// ServersPollEvery is how often the plane asks every server for its id: a server that
// (re)joined answers with one it has not seen, and gets the newest data account JWT at once.
const ServersPollEvery = 100 * time.Millisecond

// watchServers asks for the newest data account JWT to be pushed again whenever a server of
// the broker (re)joins: a server that was down holds what it held before, admits clients before
// its routes are up, and the resolvers sync only on their interval. Every ServersPollEvery it
// asks every server for its id (new at each start); a new one is a server that joined.
func (p *Plane) watchServers() {
	p.untilClose("stop watching the broker's servers", func(ctx context.Context) {
		seen := map[string]time.Time{} // every id answered in the last minute
		first := true
		onEveryTick(ctx, ServersPollEvery, true, func() {
			pctx, cancel := context.WithTimeout(ctx, ServersPollEvery*4/5)
			ids := p.dataAccount.ServerIDs(pctx)
			cancel()
			now, joined := time.Now(), false
			for id := range ids {
				if _, ok := seen[id]; !ok && !first {
					joined = true
				}
				seen[id] = now
			}
			first = first && len(ids) == 0 // the connection is down: its reconnection asks for a push
			maps.DeleteFunc(seen, func(_ string, at time.Time) bool { return now.Sub(at) > time.Minute })
			if joined {
				p.askRepush()
			}
		})
	})
}
