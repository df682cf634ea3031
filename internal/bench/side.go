package bench

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats.go"

	"github.com/cotal-ai/authplane/internal/core/issue"
	"github.com/cotal-ai/authplane/internal/core/store"
	"github.com/cotal-ai/authplane/internal/platform/broker"
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
	planeIss, err := issue.NewIssuer(t.Keys.Plane.Public(), t.Keys.Plane.Signer, time.Now)
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
	sysIss, err := issue.NewIssuer(t.Keys.System.Public(), t.Keys.System.Signer, time.Now)
	if err != nil {
		return nil, err
	}
	// Every system request: the bench pushes and reads the accounts, its ceiling callout's too.
	perms := subjects.Permissions{Pub: []string{"$SYS.REQ.>"}, Sub: []string{"_INBOX.>"}}
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
// (every server should hold the same), its size in bytes and how many signing keys it lists.
func (s *side) dataAccount(ctx context.Context) (size, signing int, err error) {
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
			size, signing = len(token), len(ac.SigningKeys)
		}
	}
	if size == 0 {
		return 0, 0, errors.New("no server holds the data account")
	}
	return size, signing, nil
}

// connections sums the client connections every server counts.
func (s *side) connections(ctx context.Context) (int, error) {
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	inbox := s.system.NewRespInbox()
	sub, err := s.system.SubscribeSync(inbox)
	if err != nil {
		return 0, err
	}
	defer sub.Unsubscribe()
	if err := s.system.PublishRequest(subjects.ServerPing, inbox, nil); err != nil {
		return 0, err
	}
	total := 0
	for range s.servers {
		msg, err := sub.NextMsgWithContext(cctx)
		if err != nil {
			return 0, fmt.Errorf("count the connections: %w", err)
		}
		var stats struct {
			Statsz struct {
				Connections int `json:"connections"`
			} `json:"statsz"`
		}
		if err := json.Unmarshal(msg.Data, &stats); err != nil {
			return 0, fmt.Errorf("count the connections: %w", err)
		}
		total += stats.Statsz.Connections
	}
	return total, nil
}

// settle waits until the servers count no more than baseline connections and a few (the
// closed ones of a storm gone), or 30 s.
func (s *side) settle(ctx context.Context, baseline int) error {
	deadline := time.Now().Add(30 * time.Second)
	for {
		n, err := s.connections(ctx)
		if err != nil {
			return err
		}
		if n <= baseline+16 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%d connections are still open 30 s after a storm closed its own (%d before it)", n, baseline)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}
