package supervisor

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"time"

	"github.com/nats-io/jwt/v2"

	"github.com/cotal-ai/authplane/internal/fault"
	"github.com/cotal-ai/authplane/internal/fence"
	"github.com/cotal-ai/authplane/internal/ids"
	"github.com/cotal-ai/authplane/internal/space"
	"github.com/cotal-ai/authplane/internal/store"
	"github.com/cotal-ai/authplane/subjects"
)

// The data account's revocation set: `revocations.<account>` in the fence bucket, every user
// nkey an end revoked and when, and the issue time of the last account JWT signed from it.
// Resolvers that exchange account JWTs (a cluster's, a restarted server's) keep the newer of
// two, and two signed in one second share an id, so each signing reserves a later issue time in
// the row, by CAS, before its JWT is pushed: the newest JWT any replica signs carries the whole
// set as it was when reserved.

// RevokeSkew is how far past the end's own clock a key is revoked: credentials a replica with
// a clock that far ahead signed before the freeze are revoked too.
const RevokeSkew = time.Minute

// Forget is how long a key stays in the set: past it every credential revoked by it has
// expired (none lives longer than a day), and the account JWT need not carry it.
const Forget = 48 * time.Hour

// Broker is the data account as the broker holds it, reached through the plane's system user:
// every server of a cluster answers.
type Broker interface {
	// Servers counts the cluster's servers.
	Servers(ctx context.Context) (int, error)
	// Push sends the account JWT token to every server's resolver.
	Push(ctx context.Context, token string) error
	// Lookup returns the account JWT each of the n servers' resolvers holds.
	Lookup(ctx context.Context, n int) ([]string, error)
	// Connections counts the account's connections authenticated as user nkey on the n servers.
	Connections(ctx context.Context, nkey string, n int) (int, error)
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
		if err := decodeSet(data, &s); err != nil {
			return revocationSet{}, err
		}
		if s.V != 1 || s.Account != r.Account || s.Revoked == nil {
			return revocationSet{}, errors.New("not a version 1 revocation set of this account")
		}
		return s, nil
	}, func(s *revocationSet) { s.Nonce = ids.Nonce() })
}

// decodeSet decodes a stored set: one JSON object of exactly its keys. It is a row the plane
// writes, not a request, and it holds every key revoked in the last Forget (about 900 keys fill
// a request's body.MaxBytes: 180 ended instances), so no request's size limit applies to it;
// were one to, every end and every start would fail until the oldest keys were forgotten.
func decodeSet(data []byte, s *revocationSet) error {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(s); err != nil {
		return err
	}
	if _, err := dec.Token(); err != io.EOF {
		return errors.New("data after the set")
	}
	return nil
}

// Applied is what applying the set found.
type Applied struct {
	// Done says every server's resolver holds an account JWT that revokes every key asked for.
	Done bool
	// Reason says why not.
	Reason string
}

// Apply puts keys on the set (each revoked at now plus RevokeSkew, once) and makes every server
// of the broker hold an account JWT that revokes them, then reads it back from each; with force
// (a start, whose limits may have changed) it signs and pushes the whole set whatever the
// broker holds. It checks its own state first: keys already in the set keep their time, and a
// broker that already revokes them is not pushed to again. The keys join the set on their own,
// before anything is signed: a signing reserved after that (by any replica's end) carries them,
// so ends that run together share a push instead of queueing a second each; this one pushes
// itself if that push does not come. Once confirmed it reads the account back again, and
// applies again if a later push took them away. An error means the keys may not be on the set;
// once they are, what the broker did not confirm (or, without the operator signing key, could
// not be told) is Applied's reason.
func (r *Revocations) Apply(ctx context.Context, keys []string, force bool) (*Applied, error) {
	added, err := r.set().Update(ctx, func(cur *fence.Observed[revocationSet]) (revocationSet, error) {
		next := r.withKeys(cur, keys)
		if !cur.Absent() && maps.Equal(next.Revoked, cur.Row.Revoked) {
			return revocationSet{}, fence.ErrKeep
		}
		return next, nil
	})
	if err != nil {
		return nil, fault.Store(err, "adding to the revocation set of the data account")
	}
	want := added.Row.Revoked // what the broker must revoke: the keys at their times
	if !force {
		want = map[string]int64{}
		for _, k := range keys {
			want[k] = added.Row.Revoked[k]
		}
	}
	after := added.Row.IssuedAt // a signing reserved later than this carries the keys
	b := &reach{Broker: r.Broker}
	for {
		held, err := r.view(ctx, b)
		if err != nil {
			held = view{} // unreadable: it covers nothing, so the set is pushed
		}
		var token string
		var issued int64
		var theirs bool
		o, err := r.set().Update(ctx, func(cur *fence.Observed[revocationSet]) (revocationSet, error) {
			token, issued, theirs = "", 0, false
			switch {
			case force:
			case held.covers(want):
				return revocationSet{}, fence.ErrKeep // the broker revokes them already
			case cur.Row.IssuedAt > after:
				issued, theirs = cur.Row.IssuedAt, true
				return revocationSet{}, fence.ErrKeep // its writer pushes the keys
			}
			// A JWT that revokes anything outranks every one before it: the resolvers keep the
			// newer of two they exchange, and two of one second share an id. One that revokes
			// nothing (a start's, with no end behind it) need not wait for the next second.
			last := max(cur.Row.IssuedAt, held.newest)
			if len(cur.Row.Revoked) == 0 {
				last = 0
			}
			next := cur.Row
			var err error
			if token, next.IssuedAt, err = r.signAfter(ctx, cur.Row.Revoked, last); err != nil {
				return revocationSet{}, err
			}
			issued = next.IssuedAt
			return next, nil
		})
		switch {
		case errors.Is(err, space.ErrNoOperatorSigner):
			return &Applied{Reason: err.Error() + "; the broker keeps its account JWT, and the credentials expire at their clamp"}, nil
		case err != nil:
			return nil, fault.Store(err, "signing the data account's JWT from its revocation set")
		}
		if token != "" {
			if err := r.Broker.Push(ctx, token); err != nil {
				return &Applied{Reason: "the broker did not take the account JWT: " + err.Error()}, nil
			}
		}
		if theirs {
			wait, cancel := context.WithTimeout(ctx, theirPush)
			err = r.confirm(wait, b, want, issued)
			cancel()
			if err != nil && ctx.Err() == nil {
				after = o.Row.IssuedAt // their push did not come: push the keys here
				continue
			}
		} else {
			err = r.confirm(ctx, b, want, issued)
		}
		if err != nil {
			return &Applied{Reason: err.Error()}, nil
		}
		if again, err := r.view(ctx, b); err == nil && again.covers(want) {
			return &Applied{Done: true}, nil
		}
		force = false // an older push landed last: apply again
	}
}

// theirPush is how long an end waits for the push of a signing another end reserved with its
// keys, before it pushes them itself.
const theirPush = 2 * time.Second

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
func (r *Revocations) view(ctx context.Context, b *reach) (view, error) {
	tokens, err := b.lookup(ctx)
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
func (r *Revocations) confirm(ctx context.Context, b *reach, want map[string]int64, issued int64) error {
	for attempt := 0; ; attempt++ {
		v, err := r.view(ctx, b)
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
	b := &reach{Broker: r.Broker}
	gone := 0
	for _, k := range keys {
		for attempt := 0; ; attempt++ {
			n, err := b.connections(ctx, k)
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

// reach is the broker as one Apply or Evict sees it: its servers counted once, and again after
// a read that not all of them answered (a server came or went). Each request gets a share of
// the time left, so a lost answer leaves time to ask again.
type reach struct {
	Broker
	n int
}

func (b *reach) count(ctx context.Context) error {
	if b.n > 0 {
		return nil
	}
	ctx, cancel := store.Attempt(ctx)
	defer cancel()
	n, err := b.Servers(ctx)
	b.n = n
	return err
}

func (b *reach) lookup(ctx context.Context) ([]string, error) {
	if err := b.count(ctx); err != nil {
		return nil, err
	}
	ctx, cancel := store.Attempt(ctx)
	defer cancel()
	tokens, err := b.Lookup(ctx, b.n)
	if err != nil {
		b.n = 0
	}
	return tokens, err
}

func (b *reach) connections(ctx context.Context, nkey string) (int, error) {
	if err := b.count(ctx); err != nil {
		return 0, err
	}
	ctx, cancel := store.Attempt(ctx)
	defer cancel()
	n, err := b.Connections(ctx, nkey, b.n)
	if err != nil {
		b.n = 0
	}
	return n, err
}
