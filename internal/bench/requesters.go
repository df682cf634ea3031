package bench

import (
	"context"
	"crypto/rand"
	"encoding/base32"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats.go"

	"github.com/cotal-ai/authplane/admin"
	"github.com/cotal-ai/authplane/client"
	"github.com/cotal-ai/authplane/internal/capability/manager"
)

// requester is one principal on its own connection, with `supervise`, and the manager
// instance it renews (its own, or the one all share).
type requester struct {
	cli *client.Client
	m   client.Manager
	r   client.Renewal
}

// do sends one request of op and returns how many credentials came back.
func (q *requester) do(ctx context.Context, op string) (int, error) {
	var m *client.Material
	var err error
	switch op {
	case client.OpRenew:
		m, err = q.cli.Renew(ctx, q.m, q.r)
	case client.OpRenewStandingBundle:
		m, err = q.cli.RenewStandingBundle(ctx, q.m, q.r)
	case client.OpPrepare:
		m, err = q.cli.Prepare(ctx, q.m)
	default:
		return 0, fmt.Errorf("operation %q is not benchmarked", op)
	}
	if err != nil {
		return 0, err
	}
	return len(m.Credentials), nil
}

// register makes cfg.Requesters requesters: each a principal `<owner>.bench_<i>` granted
// `supervise`, with a caller credential, on its own connection, with a registered and
// activated instance. Each has its own owner and instance, unless cfg.OneInstance: then all
// are principals of one owner and share one instance. It returns what it made even on error,
// for closing.
func register(ctx context.Context, t Target, cfg Config) ([]*requester, error) {
	shared := newOwner()
	reqs := make([]*requester, cfg.Requesters)
	errs := make([]error, cfg.Requesters)
	var wg sync.WaitGroup
	sem := make(chan struct{}, 8) // setup opens connections; keep it gentle
	for i := range reqs {
		wg.Go(func() {
			sem <- struct{}{}
			defer func() { <-sem }()
			owner := shared
			if !cfg.OneInstance {
				owner = newOwner()
			}
			reqs[i], errs[i] = connect(ctx, t, owner, fmt.Sprintf("bench_%d", i), manager.Supervise)
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return reqs, err
	}
	if cfg.OneInstance {
		if err := reqs[0].activate(ctx); err != nil {
			return reqs, err
		}
		for _, q := range reqs[1:] {
			q.m, q.r = reqs[0].m, reqs[0].r
		}
		return reqs, nil
	}
	for i, q := range reqs {
		wg.Go(func() {
			sem <- struct{}{}
			defer func() { <-sem }()
			errs[i] = q.activate(ctx)
		})
	}
	wg.Wait()
	return reqs, errors.Join(errs...)
}

// connect grants owner.actor scope and connects it with a fresh caller credential.
func connect(ctx context.Context, t Target, owner, actor string, scope ...string) (*requester, error) {
	gctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if _, err := admin.Grant(gctx, t.Keys, t.NATSURL, owner, actor, scope); err != nil {
		return nil, fmt.Errorf("grant %s.%s: %w", owner, actor, err)
	}
	token, seed, err := callerCreds(t, owner, actor)
	if err != nil {
		return nil, err
	}
	cli, err := client.Connect(t.NATSURL, t.Keys.Space, owner, actor, nats.UserJWTAndSeed(token, seed))
	if err != nil {
		return nil, err
	}
	return &requester{cli: cli}, nil
}

// activate registers and activates a fresh instance for q.
func (q *requester) activate(ctx context.Context) error {
	m, _, err := client.NewManager()
	if err != nil {
		return err
	}
	rctx, cancel := context.WithTimeout(ctx, requestTimeout)
	defer cancel()
	prep, err := q.cli.Prepare(rctx, m)
	if err != nil {
		return fmt.Errorf("prepare: %w", err)
	}
	act, err := q.cli.Activate(rctx, m, prep.RegistrationProof)
	if err != nil {
		return fmt.Errorf("activate: %w", err)
	}
	q.m, q.r = m, act.Renewal()
	return nil
}

func closeAll(reqs []*requester) {
	for _, q := range reqs {
		if q != nil {
			q.cli.Close()
		}
	}
}

// newOwner returns a fresh `u_` owner: 26 base32-lower characters of 16 random bytes.
func newOwner() string { return ownerWith("u_") }

// newPlatformOwner returns a fresh `p_` owner, a platform holder's.
func newPlatformOwner() string { return ownerWith("p_") }

func ownerWith(prefix string) string {
	b := make([]byte, 16)
	if _, err := rand.Read(b); err != nil {
		panic("bench: crypto/rand failed: " + err.Error())
	}
	return prefix + strings.ToLower(base32.StdEncoding.WithPadding(base32.NoPadding).EncodeToString(b))
}

// callerCreds is a caller credential of owner.actor for two hours, as `authplane creds` mints
// one: its user JWT and seed.
func callerCreds(t Target, owner, actor string) (token, seed string, err error) {
	o := admin.DefaultCreds()
	o.Owner, o.Actor, o.TTL = owner, actor, 2*time.Hour
	creds, err := admin.Creds(t.Keys, o, time.Now())
	if err != nil {
		return "", "", err
	}
	return decodeCreds(creds)
}

// decodeCreds reads the user JWT and the seed of a `.creds` file.
func decodeCreds(creds []byte) (token, seed string, err error) {
	if token, err = jwt.ParseDecoratedJWT(creds); err != nil {
		return "", "", err
	}
	kp, err := jwt.ParseDecoratedUserNKey(creds)
	if err != nil {
		return "", "", err
	}
	s, err := kp.Seed()
	return token, string(s), err
}
