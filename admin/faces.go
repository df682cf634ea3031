package admin

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"time"
	"unicode/utf8"

	"github.com/nats-io/nats.go"

	"github.com/cotal-ai/authplane/internal/capability/bearer"
	"github.com/cotal-ai/authplane/internal/capability/manager"
	"github.com/cotal-ai/authplane/internal/core/fault"
	"github.com/cotal-ai/authplane/internal/core/issue"
	"github.com/cotal-ai/authplane/internal/platform/broker"
	"github.com/cotal-ai/authplane/internal/platform/space"
	"github.com/cotal-ai/authplane/subjects"
)

// What the HTTP face's principals need from an operator: the owner an IdP subject derives,
// an agent's secret, and the rotation of the bearer keys.

// Owner is the `u_` owner the space derives for the IdP subject sub of issuer (what a human's
// ledger row is granted under, `authplane owner`).
func Owner(m *space.Keys, issuer, sub string) (string, error) {
	if issuer == "" || sub == "" {
		return "", fmt.Errorf("an owner derives from an IdP issuer and subject, both non-empty")
	}
	if !utf8.ValidString(sub) {
		return "", fmt.Errorf("the subject is not valid UTF-8 (the plane refuses such a subject from any IdP)")
	}
	return bearer.DeriveOwner(m.OwnerSecret, issuer, sub), nil
}

// SetAgent makes owner.actor a managed agent with a fresh secret, which it returns: the agent
// presents it to `POST /exchange` for each bearer (at most 300 s), so the secret is reusable,
// not one-time, until it is revoked or replaced; the ledger keeps only its SHA-256. A previous
// secret stops working.
func SetAgent(ctx context.Context, m *space.Keys, natsURL, owner, actor string) (secret string, row manager.ActorRow, err error) {
	kv, done, err := openBucket(ctx, m, natsURL, "agent", subjects.ActorsBucket(m.Space))
	if err != nil {
		return "", manager.ActorRow{}, err
	}
	defer done()
	secret = subjects.NewSecret(32)
	sum := sha256.Sum256([]byte(secret))
	row, err = manager.SetAgentSecret(ctx, kv, owner, actor, hex.EncodeToString(sum[:]), time.Now())
	return secret, row, err
}

// AgentRevoked is what RevokeAgent did: the agent's ledger row as written, how many live
// connections of the agent it closed, and whether its secret had been revoked already.
type AgentRevoked struct {
	Row     manager.ActorRow
	Closed  int
	Already bool
}

// RevokeWindow is how long after the revoke's ledger write a connection the auth callout let
// in on the row as it was can still reach the broker: the callout reads the row after the
// broker's request arrived, and answers within its decision deadline from that arrival
// (handlers.CalloutDeadline, 1.8 s, whatever the broker's `authorization { timeout }`); the rest
// is slack for sending the answer and the broker registering the connection. RevokeAgent lists
// and kicks the agent's connections until the window has passed.
const RevokeWindow = 2500 * time.Millisecond

// ErrNoAgent is the cause of a revoke's not-found: the principal holds no agent secret (never
// given one, or revoked already) and the broker lists no connection of it.
var ErrNoAgent = errors.New("no agent to revoke")

// RevokeAgent clears owner.actor's agent secret, so its next exchange and its next connection
// are refused, and then closes its live connections: it kicks every connection the auth
// callout let in as owner.actor, on every server, until RevokeWindow has passed and the broker
// lists none. A kick, not the data account's revocation set: the callout's users are each a
// fresh nkey, and the set's ceiling is kept for ended assignments. A principal that holds no
// secret (never an agent, or revoked already) has its live connections kicked still (a revoke
// whose kicks failed is sent again), and is ErrNoAgent when there were none.
func RevokeAgent(ctx context.Context, m *space.Keys, natsURL, owner, actor string) (AgentRevoked, error) {
	kv, done, err := openBucket(ctx, m, natsURL, "agent", subjects.ActorsBucket(m.Space))
	if err != nil {
		return AgentRevoked{}, err
	}
	defer done()
	principal := subjects.Principal(owner, actor)
	until := time.Now().Add(RevokeWindow)
	row, err := manager.SetAgentSecret(ctx, kv, owner, actor, "", time.Now())
	held := !errors.Is(err, manager.ErrNoAgentSecret)
	if err != nil && held {
		return AgentRevoked{}, err
	}
	if !held {
		until = time.Now() // no write now: nothing the callout read before it to wait for
	}
	closed, err := closeCalloutConnections(ctx, m, natsURL, principal, until)
	if err == nil && !held && closed == 0 {
		return AgentRevoked{}, fault.Wrap(fault.NotFound, ErrNoAgent, "agent %s not found: it holds no agent secret (never given one, or revoked already) and no live connection; nothing was revoked", principal)
	}
	if err != nil {
		return AgentRevoked{Row: row, Closed: closed}, fmt.Errorf("the agent is revoked, but its live connections (revoke again to close them): %w", err)
	}
	return AgentRevoked{Row: row, Closed: closed, Already: !held}, nil
}

// closeCalloutConnections kicks the connections the auth callout let in as principal, as a
// short-lived system-account user, until the broker lists none (kickUntil) and until has
// passed; it returns how many it closed.
func closeCalloutConnections(ctx context.Context, m *space.Keys, natsURL, principal string, until time.Time) (int, error) {
	iss, err := issue.NewIssuer(m.System.Public(), m.System.Signer, time.Now)
	if err != nil {
		return 0, err
	}
	auth, err := iss.Connect("authplane.kick", subjects.KickPermissions(m.Data.Public()), 5*time.Minute)
	if err != nil {
		return 0, err
	}
	nc, err := nats.Connect(natsURL, auth, nats.Name("authplane kick"))
	if err != nil {
		return 0, fmt.Errorf("connect to %s: %w", broker.RedactURL(natsURL), err)
	}
	defer nc.Close()
	acct := broker.Account{NC: nc, Public: m.Data.Public()}
	n, err := acct.Servers(ctx)
	if err != nil {
		return 0, err
	}
	return kickUntil(ctx, acct, principal, n, until)
}

// kicker lists the connections the callout let in as a principal, and kicks one
// (broker.Account).
type kicker interface {
	CalloutConnections(ctx context.Context, principal string, n int) ([]broker.Connection, error)
	Kick(ctx context.Context, server string, cid uint64) error
}

// kickUntil kicks principal's callout connections on the cluster's n servers until two
// listings in a row after until show none: connections closing while the servers page through
// a listing shift later ones past the next page's start, so one listing may miss a connection
// that is still open. It returns how many it closed.
func kickUntil(ctx context.Context, k kicker, principal string, n int, until time.Time) (int, error) {
	closed := map[broker.Connection]bool{}
	quiet := false // the last listing was after until and showed none
	for {
		live, err := k.CalloutConnections(ctx, principal, n)
		if err != nil {
			return len(closed), err
		}
		settled := len(live) == 0 && !time.Now().Before(until)
		if settled && quiet {
			return len(closed), nil
		}
		quiet = settled
		for _, c := range live {
			if err := k.Kick(ctx, c.Server, c.CID); err != nil {
				return len(closed), err
			}
			closed[broker.Connection{Server: c.Server, CID: c.CID}] = true
		}
		select {
		case <-ctx.Done():
			return len(closed), fmt.Errorf("%d still listed: %w", len(live), ctx.Err())
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// BearerKeys opens the space's bearer key set (`authplane keys`); done closes its connection.
func BearerKeys(ctx context.Context, m *space.Keys, natsURL string) (keys *bearer.Keys, done func(), err error) {
	kv, done, err := openBucket(ctx, m, natsURL, "keys", subjects.KeysBucket(m.Space))
	if err != nil {
		return nil, nil, err
	}
	return bearer.New(kv, time.Now), done, nil
}
