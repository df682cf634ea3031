package supervisor

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"time"

	"github.com/nats-io/jwt/v2"

	"github.com/cotal-ai/authplane/internal/body"
	"github.com/cotal-ai/authplane/internal/fault"
	"github.com/cotal-ai/authplane/internal/fence"
	"github.com/cotal-ai/authplane/internal/ids"
	"github.com/cotal-ai/authplane/internal/space"
	"github.com/cotal-ai/authplane/internal/store"
	"github.com/cotal-ai/authplane/subjects"
)

// The data account's revocation set: `revocations.<account>` in the fence bucket, every user
// nkey an end revoked and when, and the issue time of the last account JWT signed from it. The
// broker's resolver ignores an account JWT that is not newer than the one it holds (and two
// signed in one second share an id), so each signing reserves a later issue time in the row, by
// CAS, before its JWT is pushed: the newest JWT any replica pushes carries the whole set.

// RevokeSkew is how far past the end's own clock a key is revoked: credentials a replica with
// a clock that far ahead signed before the freeze are revoked too.
const RevokeSkew = time.Minute

// Forget is how long a key stays in the set: past it every credential revoked by it has
// expired (none lives longer than a day), and the account JWT need not carry it.
const Forget = 48 * time.Hour

// Broker is the data account as the broker holds it, reached through the plane's system user:
// every server of a cluster answers.
type Broker interface {
	// Push sends the account JWT token to every server's resolver.
	Push(ctx context.Context, token string) error
	// Lookup returns the account JWT each server's resolver holds, one per server.
	Lookup(ctx context.Context) ([]string, error)
	// Connections counts the account's connections authenticated as user nkey, on every server.
	Connections(ctx context.Context, nkey string) (int, error)
}

// Revocations is the data account's revocation set and the broker it is applied to.
type Revocations struct {
	// Gates is the fence bucket the set lives in; Account the data account's public key.
	Gates   fence.KV
	Account string
	// Sign signs the data account's JWT (its limits, and revoked: nkey → unix seconds) with the
	// operator signing key; space.ErrNoOperatorSigner when the operator keeps it elsewhere.
	Sign   func(revoked map[string]int64) (string, error)
	Broker Broker
	Now    func() time.Time
}

// revocationSet is the row.
type revocationSet struct {
	V        int              `json:"v"`
	Account  string           `json:"account"`
	Revoked  map[string]int64 `json:"revoked"`
	IssuedAt int64            `json:"issuedAt"`
	Nonce    string           `json:"nonce"`
}

func (r *Revocations) set() *fence.Fence[revocationSet] {
	return fence.New(r.Gates, subjects.RevocationsKey(r.Account), func(data []byte) (revocationSet, error) {
		var s revocationSet
		if err := body.Decode(data, &s); err != nil {
			return revocationSet{}, err
		}
		if s.V != 1 || s.Account != r.Account || s.Revoked == nil {
			return revocationSet{}, errors.New("not a version 1 revocation set of this account")
		}
		return s, nil
	}, func(s *revocationSet) { s.Nonce = ids.Nonce() })
}

// Applied is what applying the set found.
type Applied struct {
	// Done says every server's resolver holds an account JWT that revokes every key asked for.
	Done bool
	// Reason says why not.
	Reason string
}

// Apply puts keys on the set (each revoked at now plus RevokeSkew, once) and makes every server
// of the broker hold an account JWT that revokes the whole set, then reads it back from each.
// It checks its own state first: keys already in the set stay as they are, and a broker that
// already holds them all is not pushed to again, unless force (a start, whose limits may have
// changed). A re-read that finds the set grew meanwhile applies it again. An error means the
// keys may not be on the set; once they are, what the broker did not confirm (or, without the
// operator signing key, could not be told) is Applied's reason.
func (r *Revocations) Apply(ctx context.Context, keys []string, force bool) (*Applied, error) {
	for {
		held, err := r.view(ctx)
		if err != nil {
			held = view{} // unreadable: it covers nothing, so the set is pushed
		}
		var token string
		var issued int64
		var signErr error
		o, err := r.set().Update(ctx, func(cur *fence.Observed[revocationSet]) (revocationSet, error) {
			token, issued, signErr = "", 0, nil
			next := r.withKeys(cur, keys)
			changed := cur.Absent() || !maps.Equal(next.Revoked, cur.Row.Revoked)
			if !force && !changed && held.covers(next.Revoked) {
				return revocationSet{}, fence.ErrKeep
			}
			// A JWT that revokes anything outranks every one before it: the resolvers keep the
			// newer of two they exchange, and two of one second share an id. One that revokes
			// nothing (a start's, with no end behind it) need not wait for the next second.
			last := max(cur.Row.IssuedAt, held.newest)
			if len(next.Revoked) == 0 {
				last = 0
			}
			token, issued, signErr = r.signAfter(ctx, next.Revoked, last)
			switch {
			case signErr != nil && !changed:
				return revocationSet{}, fence.ErrKeep
			case signErr == nil:
				next.IssuedAt = issued
			}
			return next, nil
		})
		if err != nil {
			return nil, fault.Store(err, "writing the revocation set of the data account")
		}
		if errors.Is(signErr, space.ErrNoOperatorSigner) {
			return &Applied{Reason: signErr.Error() + "; the broker keeps its account JWT, and the credentials expire at their clamp"}, nil
		}
		if signErr != nil {
			return nil, fault.Wrap(fault.Internal, signErr, "signing the data account's JWT failed")
		}
		if token != "" {
			if err := r.Broker.Push(ctx, token); err != nil {
				return &Applied{Reason: "the broker did not take the account JWT: " + err.Error()}, nil
			}
		}
		if err := r.confirm(ctx, o.Row.Revoked, issued); err != nil {
			return &Applied{Reason: err.Error()}, nil
		}
		// The set as it is now: one that grew meanwhile is applied again (by whoever grew it,
		// and by this call too, should that writer have stopped before its push).
		now, err := r.set().Observe(ctx)
		if err != nil {
			return nil, fault.Store(err, "reading the revocation set of the data account")
		}
		if again, err := r.view(ctx); err == nil && again.covers(now.Row.Revoked) {
			return &Applied{Done: true}, nil
		}
		keys, force = nil, false
	}
}

// withKeys is the set observed with keys added (each revoked at now plus RevokeSkew; a key
// already there keeps its time) and entries older than Forget dropped.
func (r *Revocations) withKeys(cur *fence.Observed[revocationSet], keys []string) revocationSet {
	now := r.Now()
	next := revocationSet{V: 1, Account: r.Account, Revoked: map[string]int64{}, IssuedAt: cur.Row.IssuedAt}
	for k, at := range cur.Row.Revoked {
		if time.Unix(at, 0).Add(Forget).After(now) {
			next.Revoked[k] = at
		}
	}
	for _, k := range keys {
		if _, ok := next.Revoked[k]; !ok {
			next.Revoked[k] = now.Add(RevokeSkew).Unix()
		}
	}
	return next
}

// signAfter signs the account JWT revoking revoked with an issue time later than last: the
// resolver keeps only a newer JWT, and issue times are whole seconds, so it waits out the
// second of the last one signed (by any replica) if it must.
func (r *Revocations) signAfter(ctx context.Context, revoked map[string]int64, last int64) (string, int64, error) {
	for {
		token, err := r.Sign(revoked)
		if err != nil {
			return "", 0, err
		}
		claims, err := jwt.DecodeAccountClaims(token)
		if err != nil {
			return "", 0, fmt.Errorf("the signed account JWT does not decode: %w", err)
		}
		if claims.IssuedAt > last {
			return token, claims.IssuedAt, nil
		}
		t := time.NewTimer(time.Until(time.Unix(last+1, 0)))
		select {
		case <-ctx.Done():
			t.Stop()
			return "", 0, fmt.Errorf("waiting to sign after the last account JWT (issued %d): %w", last, ctx.Err())
		case <-t.C:
		}
	}
}

// view is the data account as every server's resolver holds it: what all of them revoke (each
// key at the earliest time any server revokes it; a key some server does not revoke is not in
// it), and the oldest and newest issue times of their JWTs.
type view struct {
	revoked        map[string]int64
	oldest, newest int64
}

// view reads the data account back from every server.
func (r *Revocations) view(ctx context.Context) (view, error) {
	tokens, err := r.Broker.Lookup(ctx)
	if err != nil {
		return view{}, err
	}
	var v view
	for i, token := range tokens {
		claims, err := jwt.DecodeAccountClaims(token)
		if err != nil || claims.Subject != r.Account {
			return view{}, fmt.Errorf("a server holds an account JWT that does not decode as the data account's: %v", err)
		}
		if i == 0 {
			v = view{revoked: maps.Clone(map[string]int64(claims.Revocations)), oldest: claims.IssuedAt, newest: claims.IssuedAt}
			continue
		}
		v.oldest, v.newest = min(v.oldest, claims.IssuedAt), max(v.newest, claims.IssuedAt)
		for k, at := range v.revoked {
			if got, ok := claims.Revocations[k]; !ok {
				delete(v.revoked, k)
			} else if got < at {
				v.revoked[k] = got
			}
		}
	}
	return v, nil
}

// covers reports whether every server revokes every key of want at its time or later.
func (v view) covers(want map[string]int64) bool {
	for k, at := range want {
		if got, ok := v.revoked[k]; !ok || got < at {
			return false
		}
	}
	return true
}

// confirm reads the account back from every server until each holds a JWT issued at issued or
// later that revokes want, or ctx ends.
func (r *Revocations) confirm(ctx context.Context, want map[string]int64, issued int64) error {
	for attempt := 0; ; attempt++ {
		v, err := r.view(ctx)
		if err == nil && v.oldest >= issued && v.covers(want) {
			return nil
		}
		if err == nil {
			err = errors.New("a server's resolver does not hold the revocations yet")
		}
		if perr := store.Pause(ctx, attempt); perr != nil {
			return fmt.Errorf("the broker did not confirm the revocation before the deadline: %w", err)
		}
	}
}

// Evict waits until the broker lists no connection authenticated with any of keys, or ctx
// ends, and returns how many of keys it found with none left.
func (r *Revocations) Evict(ctx context.Context, keys []string) int {
	gone := 0
	for _, k := range keys {
		for attempt := 0; ; attempt++ {
			n, err := r.Broker.Connections(ctx, k)
			if err == nil && n == 0 {
				gone++
				break
			}
			if store.Pause(ctx, attempt) != nil {
				break
			}
		}
	}
	return gone
}
