// Package bearer is the plane's bearer issuer (docs/PROTOCOL.md, "The HTTP face"): Ed25519 keys (kid = the RFC 7638
// thumbprint) kept in one row of the keys bucket that every replica shares, the EdDSA bearers
// /exchange hands out and the auth callout accepts, the public key set /jwks serves, and key
// rotation with its retire floor; and the verifier of the identity provider's tokens the
// exchange takes (idp.go).
package bearer

import (
	"bytes"
	"context"
	"crypto"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-jose/go-jose/v4"

	"github.com/cotal-ai/authplane/internal/core/fault"
	"github.com/cotal-ai/authplane/internal/core/fence"
	"github.com/cotal-ai/authplane/subjects"
)

// Bounds of bearers and keys.
const (
	// MaxTTL is the longest a bearer lives.
	MaxTTL = 900 * time.Second
	// jwksMaxAge is how long a client may cache /jwks.
	jwksMaxAge = 300 * time.Second
	// RetireFloor is how long a key stays published after it stopped signing: a client's cached
	// key set and the last bearer it signed both outlive it no longer.
	RetireFloor = jwksMaxAge + MaxTTL
	// Skew is the clock skew allowed on a bearer's times.
	Skew = 5 * time.Second
)

// setKey is the one row of the keys bucket.
const setKey = "keyset.v1"

// keySet is the stored key set: every published key and which one signs.
type keySet struct {
	V      int      `json:"v"`
	Active string   `json:"active"`
	Keys   []stored `json:"keys"`
	Nonce  string   `json:"nonce"`
	// private is each key by kid, decoded with the set; never changed after.
	private map[string]ed25519.PrivateKey
}

// stored is one key: its private JWK, when it was added, and when it stopped signing.
type stored struct {
	KID     string          `json:"kid"`
	JWK     json.RawMessage `json:"jwk"`
	AddedAt int64           `json:"addedAt"` // seconds
	// Stopped is when a rotation stopped it signing (seconds); 0 while it signs.
	Stopped int64 `json:"stopped,omitempty"`
}

// Keys is the key set of one space.
type Keys struct {
	set *fence.Fence[keySet]
	now func() time.Time
}

// New returns the key set kept in the keys bucket kv. Validate reads the set for every bearer
// (a retired key validates nothing from the moment its retirement is stored); reads that come
// together share a get sent after each of them came (fence.Shared: a reconnect storm's
// decisions all read this one row), and the set's keys are decoded again only when its bytes
// changed (see parsed).
func New(kv fence.KV, now func() time.Time) *Keys {
	p := &parsed{}
	return &Keys{now: now, set: fence.New(fence.Share(kv), setKey, p.parse, func(s *keySet) { s.Nonce = subjects.NewNonce() })}
}

// parsed is parseSet with its last result kept: decoding a set is a JSON decode, an Ed25519
// key derivation and a thumbprint per key, a tenth of an auth callout decision's CPU, and the
// set changes a few times a year. A set read again with the same bytes is the same set.
type parsed struct {
	mu   sync.Mutex
	data []byte
	set  keySet
}

// setsDecoded counts the sets parsed decoded (for the tests: one atomic add per change).
var setsDecoded atomic.Int64

func (p *parsed) parse(data []byte) (keySet, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.data == nil || !bytes.Equal(p.data, data) {
		setsDecoded.Add(1)
		s, err := parseSet(data)
		if err != nil {
			return keySet{}, err
		}
		p.data, p.set = bytes.Clone(data), s
	}
	// The set is shared: a caller that changes its keys clones them first (Rotate, Retire).
	return p.set, nil
}

// maxKeySetRow bounds the stored key set: the active key and those retired within the
// publication period, a few KiB each.
const maxKeySetRow = 256 << 10

func parseSet(data []byte) (keySet, error) {
	var s keySet
	if err := fault.DecodeRow(data, &s, maxKeySetRow); err != nil {
		return keySet{}, err
	}
	if s.V != 1 || !slices.ContainsFunc(s.Keys, func(k stored) bool { return k.KID == s.Active && k.Stopped == 0 }) {
		return keySet{}, errors.New("not a version 1 key set with its active key")
	}
	s.private = make(map[string]ed25519.PrivateKey, len(s.Keys))
	for _, k := range s.Keys {
		priv, err := privateKey(k)
		if err != nil {
			return keySet{}, fmt.Errorf("key %s: %w", k.KID, err)
		}
		s.private[k.KID] = priv
	}
	return s, nil
}

// privateKey decodes a stored key, and checks its kid is its thumbprint.
func privateKey(k stored) (ed25519.PrivateKey, error) {
	var jwk jose.JSONWebKey
	if err := jwk.UnmarshalJSON(k.JWK); err != nil {
		return nil, err
	}
	priv, ok := jwk.Key.(ed25519.PrivateKey)
	if !ok {
		return nil, errors.New("not an Ed25519 private key")
	}
	if kid, err := thumbprint(priv.Public().(ed25519.PublicKey)); err != nil || kid != k.KID {
		return nil, errors.New("its kid is not its thumbprint")
	}
	return priv, nil
}

// thumbprint is the RFC 7638 thumbprint of pub, base64url: its kid.
func thumbprint(pub ed25519.PublicKey) (string, error) {
	tp, err := (&jose.JSONWebKey{Key: pub}).Thumbprint(crypto.SHA256)
	if err != nil {
		return "", err
	}
	return base64.RawURLEncoding.EncodeToString(tp), nil
}

// entry makes the stored form of priv, added at now.
func entry(priv ed25519.PrivateKey, now time.Time) (stored, error) {
	kid, err := thumbprint(priv.Public().(ed25519.PublicKey))
	if err != nil {
		return stored{}, err
	}
	raw, err := (&jose.JSONWebKey{Key: priv, KeyID: kid, Algorithm: string(jose.EdDSA), Use: "sig"}).MarshalJSON()
	if err != nil {
		return stored{}, err
	}
	return stored{KID: kid, JWK: raw, AddedAt: now.Unix()}, nil
}

// Ensure creates the key set with first as its active key if the space has none yet (the
// material's first bearer key); a set that exists is left as it is.
func (k *Keys) Ensure(ctx context.Context, first jose.JSONWebKey) error {
	priv, ok := first.Key.(ed25519.PrivateKey)
	if !ok {
		return errors.New("the first bearer key is not an Ed25519 private key")
	}
	o, err := k.set.Observe(ctx)
	if err != nil || !o.Absent() {
		return err
	}
	e, err := entry(priv, k.now())
	if err != nil {
		return err
	}
	_, err = o.Write(ctx, keySet{V: 1, Active: e.KID, Keys: []stored{e}})
	if errors.Is(err, fence.ErrMoved) {
		return nil // another replica made it first
	}
	return err
}

// read is the key set, read now from the leader.
func (k *Keys) read(ctx context.Context) (keySet, error) {
	o, err := k.set.Observe(ctx)
	if err != nil {
		return keySet{}, err
	}
	if o.Absent() {
		return keySet{}, errors.New("the space has no bearer keys yet")
	}
	return o.Row, nil
}

// JWKS returns the public key set every face serves, and its ETag: every published key, never
// a private part.
func (k *Keys) JWKS(ctx context.Context) ([]byte, string, error) {
	s, err := k.read(ctx)
	if err != nil {
		return nil, "", err
	}
	set := jose.JSONWebKeySet{}
	for _, e := range s.Keys {
		set.Keys = append(set.Keys, jose.JSONWebKey{Key: s.private[e.KID].Public(), KeyID: e.KID, Algorithm: string(jose.EdDSA), Use: "sig"})
	}
	doc, err := json.Marshal(set)
	if err != nil {
		return nil, "", err
	}
	sum := sha256.Sum256(doc)
	return doc, `"` + hex.EncodeToString(sum[:16]) + `"`, nil
}

// Rotate adds a fresh key and makes it the one that signs; the one before stays published.
// It returns the new kid.
func (k *Keys) Rotate(ctx context.Context) (string, error) {
	_, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return "", err
	}
	now := k.now()
	e, err := entry(priv, now)
	if err != nil {
		return "", err
	}
	_, err = k.set.Update(ctx, func(cur *fence.Observed[keySet]) (keySet, error) {
		if cur.Absent() {
			return keySet{}, errors.New("the space has no bearer keys yet: start the plane once")
		}
		next := cur.Row
		next.Keys = slices.Clone(next.Keys)
		for i := range next.Keys {
			if next.Keys[i].KID == next.Active {
				next.Keys[i].Stopped = now.Unix()
			}
		}
		next.Keys = append(next.Keys, e)
		next.Active = e.KID
		return next, nil
	})
	if err != nil {
		return "", fmt.Errorf("rotate the bearer keys: %w", err)
	}
	return e.KID, nil
}

// ErrTooSoon refuses to retire a key that signed less than RetireFloor ago.
var ErrTooSoon = errors.New("the key stopped signing less than the retire floor ago")

// Retire stops publishing kid: the bearers it signed fail from then on. The active key is
// refused, and so is one that stopped signing less than RetireFloor ago.
func (k *Keys) Retire(ctx context.Context, kid string) error {
	now := k.now()
	_, err := k.set.Update(ctx, func(cur *fence.Observed[keySet]) (keySet, error) {
		i := slices.IndexFunc(cur.Row.Keys, func(e stored) bool { return e.KID == kid })
		switch {
		case cur.Absent() || i < 0:
			return keySet{}, fmt.Errorf("no published key %q", kid)
		case kid == cur.Row.Active:
			return keySet{}, errors.New("the active key signs: rotate first")
		case now.Sub(time.Unix(cur.Row.Keys[i].Stopped, 0)) < RetireFloor:
			left := RetireFloor - now.Sub(time.Unix(cur.Row.Keys[i].Stopped, 0))
			return keySet{}, fmt.Errorf("%w (%s): retire it in %s", ErrTooSoon, RetireFloor, left.Round(time.Second))
		}
		next := cur.Row
		next.Keys = slices.Delete(slices.Clone(next.Keys), i, i+1)
		return next, nil
	})
	if err != nil {
		return fmt.Errorf("retire bearer key %s: %w", kid, err)
	}
	return nil
}

// Replace is the bearer side of an emergency rotation: a key added after since signs (a fresh
// one is added unless the one that signs is such a key), and every other key is retired at
// once, without the retire floor: every bearer they signed is refused from the moment it is
// stored. Times are whole seconds, so a key added in since's second is replaced: a plane that
// started in the second the rotation began made its key then, and it must go. Made twice with
// the same since, it changes nothing the second time unless the first was in since's second.
// It returns the kid of the key that signs.
func (k *Keys) Replace(ctx context.Context, since time.Time) (string, error) {
	_, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return "", err
	}
	fresh, err := entry(priv, k.now())
	if err != nil {
		return "", err
	}
	o, err := k.set.Update(ctx, func(cur *fence.Observed[keySet]) (keySet, error) {
		if cur.Absent() {
			return keySet{}, errors.New("the space has no bearer keys yet: start the plane once")
		}
		next := cur.Row
		i := slices.IndexFunc(next.Keys, func(e stored) bool { return e.KID == next.Active })
		active := next.Keys[i]
		if active.AddedAt <= since.Unix() {
			active, next.Active = fresh, fresh.KID
		}
		if len(next.Keys) == 1 && next.Keys[0].KID == active.KID {
			return keySet{}, fence.ErrKeep
		}
		next.Keys = []stored{active}
		return next, nil
	})
	if err != nil {
		return "", fmt.Errorf("replace the bearer keys: %w", err)
	}
	return o.Row.Active, nil
}

// Key describes one published key: its kid, whether it signs, when it was added and when it
// stopped signing (zero while it signs), and when it may be retired.
type Key struct {
	KID     string
	Active  bool
	Added   time.Time
	Stopped time.Time
	Retire  time.Time
}

// List describes every published key, oldest first.
func (k *Keys) List(ctx context.Context) ([]Key, error) {
	s, err := k.read(ctx)
	if err != nil {
		return nil, err
	}
	out := make([]Key, 0, len(s.Keys))
	for _, e := range s.Keys {
		key := Key{KID: e.KID, Active: e.KID == s.Active, Added: time.Unix(e.AddedAt, 0)}
		if e.Stopped != 0 {
			key.Stopped = time.Unix(e.Stopped, 0)
			key.Retire = key.Stopped.Add(RetireFloor)
		}
		out = append(out, key)
	}
	return out, nil
}
