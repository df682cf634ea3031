package signers

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"

	"github.com/nats-io/jwt/v2"

	"github.com/cotal-ai/authplane/internal/core/store"
	"github.com/cotal-ai/authplane/internal/platform/broker"
)

// view is the data account as every server's resolver holds it: the signing keys every one
// lists and those some one lists, and the oldest and newest issue times of their JWTs.
type view struct {
	all, any       map[string]bool
	oldest, newest int64
}

// view reads the data account back from every server. A JWT it read before is not decoded
// again (most reads find the one just pushed, on every server).
func (r *rounds) view(ctx context.Context) (view, error) {
	tokens, err := r.reach.lookup(ctx)
	if err != nil {
		return view{}, err
	}
	var v view
	for i, token := range tokens {
		claims, err := r.decode(token)
		if err != nil {
			return view{}, err
		}
		if i == 0 {
			v = view{all: map[string]bool{}, any: map[string]bool{}, oldest: claims.IssuedAt, newest: claims.IssuedAt}
			for k := range claims.SigningKeys {
				v.all[k], v.any[k] = true, true
			}
			continue
		}
		v.oldest, v.newest = min(v.oldest, claims.IssuedAt), max(v.newest, claims.IssuedAt)
		for k := range claims.SigningKeys {
			v.any[k] = true
		}
		for k := range v.all {
			if _, ok := claims.SigningKeys[k]; !ok {
				delete(v.all, k)
			}
		}
	}
	return v, nil
}

// decode decodes and verifies an account JWT a server holds, remembering the last few.
func (r *rounds) decode(token string) (*jwt.AccountClaims, error) {
	for _, d := range r.decoded {
		if d.token == token {
			return d.claims, nil
		}
	}
	claims, err := jwt.DecodeAccountClaims(token)
	if err != nil || claims.Subject != r.s.Account {
		return nil, fmt.Errorf("a server holds an account JWT that does not decode as the data account's: %v", err)
	}
	r.decoded = append(r.decoded, decoded{token, claims})
	if len(r.decoded) > 4 {
		r.decoded = r.decoded[1:]
	}
	return claims, nil
}

// decoded is an account JWT and its claims.
type decoded struct {
	token  string
	claims *jwt.AccountClaims
}

// shows reports whether every server holds w's change: an added instance's key of every
// generation every server lists listed by every one, a removed one's of any generation by
// none; the generations an opGens lists listed by every server, and every other by none. A
// generation is listed when its own key is: the JWT is made from the row alone, so a JWT that
// lists a generation's own key lists the key of each of its live instances too.
func (v view) shows(keys *Keys, w *waiter) bool {
	listed := func(g uint64, in map[string]bool) bool {
		main, err := keys.Main(g)
		return err == nil && in[main.Signer()]
	}
	if w.op == opHold {
		return true // every server holds a JWT issued at the round's or later: each signs from the row
	}
	if w.op == opGens {
		for _, g := range keys.Gens() {
			if slices.Contains(w.gens, g) != listed(g, v.all) || (!slices.Contains(w.gens, g) && listed(g, v.any)) {
				return false
			}
		}
		return true
	}
	for _, iid := range w.iids {
		some := false
		for _, g := range keys.Gens() {
			pub, err := keys.PublicOf(g, iid)
			if err != nil {
				return false
			}
			if w.op == opAdd && listed(g, v.all) {
				some = true
				if !v.all[pub] {
					return false
				}
			}
			if (w.op == opRemove || w.op == opWithdraw) && v.any[pub] {
				return false
			}
		}
		if w.op == opAdd && !some {
			return false
		}
	}
	return true
}

// holds reports whether every server lists exactly pubs.
func (v view) holds(pubs []string) bool {
	if len(v.any) != len(pubs) {
		return false
	}
	for _, k := range pubs {
		if !v.all[k] {
			return false
		}
	}
	return true
}

// KickStale closes every connection of the account whose credential a key off the set signed:
// one a server admitted while it held an older account JWT (a server that rejoined before the
// plane pushed to it), or whose authentication was under way when the key left. It returns how
// many it found.
func (s *Set) KickStale(ctx context.Context) (int, error) {
	if s.Sign == nil {
		return 0, nil
	}
	cur, err := s.fence().Observe(ctx)
	if err != nil {
		return 0, fmt.Errorf("read the data account's signing keys: %w", err)
	}
	pubs, err := s.pubs(ctx, cur.Row)
	if err != nil {
		return 0, err
	}
	live := map[string]bool{}
	for _, p := range pubs {
		live[p] = true
	}
	n := 0
	_, failed, err := s.kick(ctx, &reach{Broker: s.Broker}, func(c broker.Connection) bool {
		stale := c.Signer != "" && !live[c.Signer]
		if stale {
			n++
		}
		return stale
	})
	if err == nil && failed > 0 {
		err = fmt.Errorf("%d of %d kicks failed", failed, n)
	}
	return n, err
}

// kick lists the account's connections on every server b counts and kicks those stale says,
// returning the keys of those it found and how many kicks failed (each leaves its connection for
// the next listing to find); an error means the listing did not answer from every server.
func (s *Set) kick(ctx context.Context, b *reach, stale func(broker.Connection) bool) (map[string]bool, int, error) {
	conns, err := b.connections(ctx)
	if err != nil {
		return nil, 0, err
	}
	found, failed := map[string]bool{}, 0
	for _, c := range conns {
		if stale(c) {
			found[c.User] = true
			kctx, cancel := store.Attempt(ctx)
			if err := s.Broker.Kick(kctx, c.Server, c.CID); err != nil {
				failed++
			}
			cancel()
		}
	}
	return found, failed, nil
}

// reach is the broker as one run of rounds or one Evict sees it: its servers counted once, and
// again after a read that not all of them answered (a server came or went). Each request gets a
// share of the time left, so a lost answer leaves time to ask again.
type reach struct {
	Broker
	mu sync.Mutex
	n  int
}

func (b *reach) count(ctx context.Context) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.n > 0 {
		return nil
	}
	ctx, cancel := store.Attempt(ctx)
	defer cancel()
	n, err := b.Servers(ctx)
	if err == nil && n < 1 {
		err = errors.New("no server answered")
	}
	if err == nil {
		b.n = n
	}
	return err
}

func (b *reach) servers() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.n
}

func (b *reach) forget() {
	b.mu.Lock()
	b.n = 0
	b.mu.Unlock()
}

func (b *reach) lookup(ctx context.Context) ([]string, error) {
	if err := b.count(ctx); err != nil {
		return nil, err
	}
	ctx, cancel := store.Attempt(ctx)
	defer cancel()
	tokens, err := b.Lookup(ctx, b.servers())
	if err != nil {
		b.forget()
	}
	return tokens, err
}

func (b *reach) connections(ctx context.Context) ([]broker.Connection, error) {
	if err := b.count(ctx); err != nil {
		return nil, err
	}
	ctx, cancel := store.Attempt(ctx)
	defer cancel()
	n := b.servers()
	conns, answered, err := b.ListConnections(ctx, n)
	if err == nil && len(answered) < n {
		err = fmt.Errorf("list the data account's connections: %d of %d servers answered", len(answered), n)
	}
	if err != nil {
		b.forget()
	}
	return conns, err
}

// pushVia pushes the newest JWT this plane signed through the server connection of each waiter
// of ws that names one, and closes it once that server took it. It returns the waiters that
// name none (a push to every server, read back from each), and whether a push failed.
func (r *rounds) pushVia(ctx context.Context, ws []*waiter) (all []*waiter, failed bool) {
	s := r.s
	for _, w := range ws {
		if w.via == nil {
			all = append(all, w)
			continue
		}
		if err := w.via.Push(ctx, r.token); err != nil {
			r.note(fmt.Errorf("the server did not take the account JWT: %w", err))
			failed = true
			continue
		}
		s.mu.Lock()
		w.confirmed = true
		s.close(w)
		s.mu.Unlock()
	}
	return all, failed
}
