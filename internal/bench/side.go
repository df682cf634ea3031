package bench

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats.go"

	"github.com/cotal-ai/authplane/internal/broker"
	"github.com/cotal-ai/authplane/internal/mint"
	"github.com/cotal-ai/authplane/internal/store"
	"github.com/cotal-ai/authplane/subjects"
)

// side is what the bench reaches beside the plane, with the space material it holds: the
// plane's buckets (as a plane-account user with the store grant) and the accounts as every
// server holds them (as a system-account user).
type side struct {
	store   *nats.Conn
	system  *nats.Conn
	data    broker.Account
	servers int
}

// sideTTL is the life of the bench's own users: longer than any run.
const sideTTL = 12 * time.Hour

// openSide connects the bench's two users to t's broker and counts its servers.
func openSide(ctx context.Context, t Target) (_ *side, err error) {
	s := &side{}
	defer func() {
		if err != nil {
			s.close()
		}
	}()
	planeIss, err := mint.NewIssuer(t.Keys.Plane.Public(), t.Keys.Plane.Signer, time.Now)
	if err != nil {
		return nil, err
	}
	auth, err := planeIss.Connect("plane.bench", subjects.StorePermissions(t.Keys.Space), sideTTL)
	if err != nil {
		return nil, err
	}
	if s.store, err = nats.Connect(t.NATSURL, auth, nats.Name("authplane bench store")); err != nil {
		return nil, fmt.Errorf("connect the bench's store user: %w", err)
	}
	sysIss, err := mint.NewIssuer(t.Keys.System.Public(), t.Keys.System.Signer, time.Now)
	if err != nil {
		return nil, err
	}
	// The plane's own system grant, and the generic claims update a new account is pushed with.
	perms := subjects.SystemPermissions(t.Keys.Data.Public(), t.Keys.Plane.Public())
	perms.Pub = append(perms.Pub, claimsUpdate)
	if auth, err = sysIss.Connect("system.bench", perms, sideTTL); err != nil {
		return nil, err
	}
	if s.system, err = nats.Connect(t.NATSURL, auth, nats.Name("authplane bench system")); err != nil {
		return nil, fmt.Errorf("connect the bench's system user: %w", err)
	}
	s.data = broker.Account{NC: s.system, Public: t.Keys.Data.Public()}
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if s.servers, err = s.data.Servers(cctx); err != nil {
		return nil, err
	}
	return s, nil
}

// claimsUpdate is where a full resolver takes an account JWT for any account, a new one too.
const claimsUpdate = "$SYS.REQ.CLAIMS.UPDATE"

func (s *side) close() {
	for _, nc := range []*nats.Conn{s.store, s.system} {
		if nc != nil {
			nc.Close()
		}
	}
}

// bucket opens one of the plane's buckets.
func (s *side) bucket(ctx context.Context, name string) (*store.KV, error) {
	return store.OpenBucket(ctx, s.store, name)
}

// dataAccount reads the data account's JWT back from every server and returns the largest
// (every server should hold the same), its size in bytes and how many keys it revokes.
func (s *side) dataAccount(ctx context.Context) (size, revoked int, err error) {
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	tokens, err := s.data.Lookup(cctx, s.servers)
	if err != nil {
		return 0, 0, err
	}
	for _, token := range tokens {
		ac, err := jwt.DecodeAccountClaims(token)
		if err != nil {
			return 0, 0, fmt.Errorf("the data account's JWT: %w", err)
		}
		if len(token) > size {
			size, revoked = len(token), len(ac.Revocations)
		}
	}
	if size == 0 {
		return 0, 0, errors.New("no server holds the data account")
	}
	return size, revoked, nil
}
