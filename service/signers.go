package service

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats.go"

	"github.com/cotal-ai/authplane/internal/files"
	"github.com/cotal-ai/authplane/internal/signers"
	"github.com/cotal-ai/authplane/internal/space"
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
	own, err := p.keys.Data.Signer.PublicKey()
	if err != nil {
		return err
	}
	var b signers.Broker = p.dataAccount
	if p.cfg.Hooks != nil && p.cfg.Hooks.SignersBroker != nil {
		b = p.cfg.Hooks.SignersBroker(b)
	}
	// A key added for a first registration that never commits goes once the registration's
	// deadline has passed twice over, whatever the replicas' clocks say.
	p.signers = &signers.Set{Gates: p.stores.Auth, Account: p.keys.Data.Public(), Own: own, Keys: keys, Broker: b, Now: p.cfg.Now,
		Settle: 2 * (p.cfg.RequestTimeout + clockSkew)}
	if p.keys.OperatorSigner == nil {
		return nil // every credential is signed with the data account's own key
	}
	p.signers.Sign = func(keys []string) (string, int64, error) {
		return p.keys.DataAccountJWT(space.DataPolicy{MaxConnections: p.cfg.MaxConnections, Signers: keys})
	}
	if p.info.Embedded {
		p.signers.Keep = func(token string) error {
			return files.WriteAtomic(filepath.Join(p.cfg.Dir, accountJWTFile), []byte(token), files.Private)
		}
	}
	// The account JWT that lists the keys is pushed to, and read back from, every server in one
	// message: the broker's largest bounds how many instances the space holds.
	if p.signers.Capacity, err = signers.Capacity(p.signers.Sign, system.MaxPayload()); err != nil {
		return fmt.Errorf("data account policy: %w", err)
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
		}
	})
}

// watchServers asks for the newest data account JWT to be pushed again whenever a server of
// the broker (re)joins: a server that was down holds what it held before, and the resolvers
// sync only on their interval. A server's system account announces each start on its STATSZ
// subject, with a server id new at every start; the servers up now are learned first.
func (p *Plane) watchServers(system *nats.Conn) error {
	var mu sync.Mutex
	seen := map[string]time.Time{}
	note := func(data []byte) bool { // reports a server not seen before
		var m struct {
			Server struct {
				ID string `json:"id"`
			} `json:"server"`
		}
		if json.Unmarshal(data, &m) != nil || m.Server.ID == "" {
			return false
		}
		mu.Lock()
		defer mu.Unlock()
		_, ok := seen[m.Server.ID]
		seen[m.Server.ID] = time.Now()
		if len(seen) > 256 { // servers gone long ago
			for id, at := range seen {
				if time.Since(at) > 10*time.Minute {
					delete(seen, id)
				}
			}
		}
		return !ok
	}
	sub, err := system.Subscribe(subjects.ServerStats, func(m *nats.Msg) {
		if note(m.Data) {
			select {
			case p.repush <- struct{}{}:
			default: // one is pending already
			}
		}
	})
	if err != nil {
		return fmt.Errorf("watch the broker's servers: %w", err)
	}
	p.onClose("stop watching the broker's servers", sub.Unsubscribe)
	inbox := system.NewRespInbox()
	up, err := system.Subscribe(inbox, func(m *nats.Msg) { note(m.Data) })
	if err != nil {
		return fmt.Errorf("watch the broker's servers: %w", err)
	}
	p.onClose("stop listing the broker's servers", up.Unsubscribe)
	return system.PublishRequest(subjects.ServerPing, inbox, nil)
}
