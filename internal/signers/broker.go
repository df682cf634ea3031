package signers

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"

	"github.com/nats-io/jwt/v2"

	"github.com/cotal-ai/authplane/internal/store"
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

// shows reports whether every server holds w's change: an added key listed by every one, a
// removed key by none.
func (v view) shows(keys *Keys, w *waiter) bool {
	for _, iid := range w.iids {
		pub, err := keys.Public(iid)
		if err != nil {
			return false
		}
		if (w.op == opAdd && !v.all[pub]) || (w.op == opRemove && v.any[pub]) {
			return false
		}
	}
	return true
}

// holds reports whether every server lists exactly pubs and own.
func (v view) holds(pubs []string, own string) bool {
	if len(v.any) != len(pubs)+1 || !v.all[own] {
		return false
	}
	for _, k := range pubs {
		if !v.all[k] {
			return false
		}
	}
	return true
}

// Evict waits until the broker lists no connection authenticated with any of keys, or ctx ends,
// and returns how many of keys it found with none left. Each poll lists the account once for
// every key still held; once one finds none left, a second listing of every key must agree. (A
// listing is paged per server, and connections that close between two pages move later ones
// past the next page's start: one listing can miss a connection.)
func (s *Set) Evict(ctx context.Context, keys []string) int {
	b := &reach{Broker: s.Broker}
	if b.count(ctx) != nil {
		return 0
	}
	held, confirming := slices.Clone(keys), false
	for attempt := 0; ; attempt++ {
		ask := held
		if confirming {
			ask = keys
		}
		if n, err := b.connections(ctx, ask); err == nil {
			left := slices.DeleteFunc(slices.Clone(ask), func(k string) bool { return n[k] == 0 })
			switch {
			case len(left) > 0:
				held, confirming = left, false
			case confirming:
				return len(keys)
			default:
				held, confirming = nil, true
				continue // the second listing at once
			}
		}
		if store.Pause(ctx, attempt) != nil {
			return len(keys) - len(held)
		}
	}
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

func (b *reach) connections(ctx context.Context, nkeys []string) (map[string]int, error) {
	if err := b.count(ctx); err != nil {
		return nil, err
	}
	ctx, cancel := store.Attempt(ctx)
	defer cancel()
	n, err := b.Connections(ctx, nkeys, b.servers())
	if err != nil {
		b.forget()
	}
	return n, err
}
