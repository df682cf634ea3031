package bearer

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-jose/go-jose/v4"

	"github.com/cotal-ai/authplane/internal/core/fence"
	"github.com/cotal-ai/authplane/internal/core/store"
	"github.com/cotal-ai/authplane/internal/testkit"
)

const owner = "u_aaaaaaaaaaaaaaaaaaaaaaaaaa"

type clock struct{ t time.Time }

func (c *clock) now() time.Time { return c.t }

func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	t.Cleanup(cancel)
	return c
}

// newKeys is a key set made from a fresh first key, on a clock the test moves.
func newKeys(t *testing.T) (*Keys, *clock) {
	t.Helper()
	c := &clock{t: time.Unix(1_800_000_000, 0)}
	return ensured(t, testkit.NewKV(), c.now), c
}

// ensured is the key set in kv on clock now, given a fresh first key.
func ensured(t *testing.T, kv fence.KV, now func() time.Time) *Keys {
	t.Helper()
	k := New(kv, now)
	_, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	if err := k.Ensure(ctx(t), jose.JSONWebKey{Key: priv}); err != nil {
		t.Fatal(err)
	}
	return k
}

func caller() Claims {
	return Claims{Owner: owner, Actor: "cli", Scope: []string{"supervise"}, View: ViewCaller}
}

func TestABearerValidatesWithWhatItWasIssuedFor(t *testing.T) {
	k, _ := newKeys(t)
	token, exp, err := k.Issue(ctx(t), "default", caller(), 10*time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	got, err := k.Validate(ctx(t), "default", token)
	if err != nil {
		t.Fatal(err)
	}
	if got.Owner != owner || got.Actor != "cli" || got.View != ViewCaller || got.Scope[0] != "supervise" || !got.Expires.Equal(exp) {
		t.Fatalf("got %+v, want what was issued, until %s", got, exp)
	}
	if _, err := k.Validate(ctx(t), "other", token); err == nil {
		t.Fatal("a bearer of space default validated for space other")
	}
}

func TestABearerNeverLivesLongerThanFifteenMinutes(t *testing.T) {
	k, c := newKeys(t)
	if _, _, err := k.Issue(ctx(t), "default", caller(), MaxTTL+time.Second); err == nil {
		t.Fatal("a bearer of 15 minutes and a second was issued")
	}
	token, _, err := k.Issue(ctx(t), "default", caller(), MaxTTL)
	if err != nil {
		t.Fatal(err)
	}
	c.t = c.t.Add(MaxTTL + Skew)
	if _, err := k.Validate(ctx(t), "default", token); err == nil || !strings.Contains(err.Error(), "expired") {
		t.Fatalf("past its life: got %v, want expired", err)
	}
}

func TestRotationKeepsOldBearersValidUntilTheRetireFloor(t *testing.T) {
	k, c := newKeys(t)
	old, _, err := k.Issue(ctx(t), "default", caller(), MaxTTL)
	if err != nil {
		t.Fatal(err)
	}
	_, etag1, err := k.JWKS(ctx(t))
	if err != nil {
		t.Fatal(err)
	}
	oldKid, err := CheckKid(old)
	if err != nil {
		t.Fatal(err)
	}
	newKid, err := k.Rotate(ctx(t))
	if err != nil {
		t.Fatal(err)
	}
	doc2, etag2, err := k.JWKS(ctx(t))
	if err != nil {
		t.Fatal(err)
	}
	if etag1 == etag2 || !strings.Contains(string(doc2), oldKid) || !strings.Contains(string(doc2), newKid) || strings.Contains(string(doc2), `"d"`) {
		t.Fatalf("after a rotation: got %s (etag %s then %s), want both kids, a new etag and no private part", doc2, etag1, etag2)
	}
	fresh, _, err := k.Issue(ctx(t), "default", caller(), MaxTTL)
	if err != nil {
		t.Fatal(err)
	}
	if kid, _ := CheckKid(fresh); kid != newKid {
		t.Fatalf("after a rotation: a bearer signed by %s, want the new key %s", kid, newKid)
	}
	if _, err := k.Validate(ctx(t), "default", old); err != nil {
		t.Fatalf("a bearer of the previous key: got %v, want it valid while published", err)
	}
	if err := k.Retire(ctx(t), newKid); err == nil {
		t.Fatal("the active key was retired")
	}
	c.t = c.t.Add(RetireFloor - time.Second)
	if err := k.Retire(ctx(t), oldKid); !errors.Is(err, ErrTooSoon) {
		t.Fatalf("retire a second before the floor: got %v, want ErrTooSoon", err)
	}
	c.t = c.t.Add(time.Second)
	if err := k.Retire(ctx(t), oldKid); err != nil {
		t.Fatalf("retire at the floor: %v", err)
	}
	doc3, _, err := k.JWKS(ctx(t))
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(doc3), oldKid) {
		t.Fatalf("a retired key is still published: %s", doc3)
	}
}

// CheckKid returns a token's kid, for tests.
func CheckKid(token string) (string, error) {
	jws, err := jose.ParseSignedCompact(token, []jose.SignatureAlgorithm{jose.EdDSA})
	if err != nil {
		return "", err
	}
	return jws.Signatures[0].Header.KeyID, nil
}

func TestATamperedOrForeignBearerIsRefused(t *testing.T) {
	k, _ := newKeys(t)
	other, _ := newKeys(t)
	token, _, err := k.Issue(ctx(t), "default", caller(), time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	foreign, _, err := other.Issue(ctx(t), "default", caller(), time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	parts := strings.Split(token, ".")
	tampered := parts[0] + "." + strings.TrimRight(parts[1], "=") + "x." + parts[2]
	for name, tok := range map[string]string{"another space's key": foreign, "tampered": tampered, "empty": "", "junk": "a.b.c"} {
		if _, err := k.Validate(ctx(t), "default", tok); err == nil {
			t.Errorf("%s: validated", name)
		}
	}
	if _, _, err := k.Issue(ctx(t), "default", Claims{Owner: "p_aaaaaaaaaaaaaaaaaaaaaaaaaa", Actor: "cli", View: ViewCaller}, time.Minute); err == nil {
		t.Error("a bearer for a p_ owner was issued")
	}
	if _, _, err := k.Issue(ctx(t), "default", Claims{Owner: owner, Actor: "cli", View: "root"}, time.Minute); err == nil {
		t.Error("a bearer of an unknown view was issued")
	}
}

// countingKV counts the reads of the key set's row.
type countingKV struct {
	*testkit.KV
	gets atomic.Int64
}

func (c *countingKV) Get(ctx context.Context, key string) (store.Entry, error) {
	c.gets.Add(1)
	return c.KV.Get(ctx, key)
}

// Validate reads the key set for every bearer, but decodes its keys only when the set's bytes
// changed: the auth callout validates a bearer on every connection.
func TestValidateReadsTheKeySetEachTimeAndDecodesItOnce(t *testing.T) {
	kv := &countingKV{KV: testkit.NewKV()}
	c := &clock{t: time.Unix(1_800_000_000, 0)}
	k := ensured(t, kv, c.now)
	token, _, err := k.Issue(ctx(t), "default", caller(), MaxTTL)
	if err != nil {
		t.Fatal(err)
	}
	before, decoded := kv.gets.Load(), setsDecoded.Load()
	for range 50 {
		if _, err := k.Validate(ctx(t), "default", token); err != nil {
			t.Fatal(err)
		}
	}
	if got := kv.gets.Load() - before; got != 50 {
		t.Fatalf("50 validations read the key set %d times, want 50", got)
	}
	if got := setsDecoded.Load() - decoded; got != 0 {
		t.Fatalf("50 validations of an unchanged set decoded it %d times, want none (Issue decoded it)", got)
	}
	decoded = setsDecoded.Load()
	if _, err := k.Rotate(ctx(t)); err != nil {
		t.Fatal(err)
	}
	for range 10 {
		if _, err := k.Validate(ctx(t), "default", token); err != nil {
			t.Fatalf("the previous key's bearer after a rotation: %v", err)
		}
	}
	if got := setsDecoded.Load() - decoded; got != 1 {
		t.Fatalf("a rotation and 10 validations after it decoded the set %d times, want once (its bytes changed once)", got)
	}
}

// A key retired by another process validates nothing from the moment the retirement is
// stored, though this process validated a bearer of it a moment before.
func TestARetiredKeyValidatesNothingAtOnceElsewhere(t *testing.T) {
	kv := testkit.NewKV()
	c := &clock{t: time.Unix(1_800_000_000, 0)}
	here, there := ensured(t, kv, c.now), New(kv, c.now)
	token, _, err := here.Issue(ctx(t), "default", caller(), MaxTTL)
	if err != nil {
		t.Fatal(err)
	}
	oldKid, err := CheckKid(token)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := there.Rotate(ctx(t)); err != nil {
		t.Fatal(err)
	}
	if _, err := here.Validate(ctx(t), "default", token); err != nil {
		t.Fatalf("a bearer of the previous key before its retirement: %v", err)
	}
	later := New(kv, func() time.Time { return c.now().Add(RetireFloor + time.Second) })
	if err := later.Retire(ctx(t), oldKid); err != nil {
		t.Fatal(err)
	}
	if _, err := here.Validate(ctx(t), "default", token); !errors.Is(err, ErrRefused) {
		t.Fatalf("a bearer of a key retired elsewhere: got %v, want refused at once", err)
	}
}

// A bearer signed by a key another replica rotated in a moment ago validates at once: the set
// is read for every bearer. One no set publishes is refused.
func TestABearerOfAKeyRotatedInElsewhereValidatesAtOnce(t *testing.T) {
	kv := testkit.NewKV()
	c := &clock{t: time.Unix(1_800_000_000, 0)}
	here, there := ensured(t, kv, c.now), New(kv, c.now)
	old, _, err := here.Issue(ctx(t), "default", caller(), MaxTTL)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := here.Validate(ctx(t), "default", old); err != nil {
		t.Fatal(err)
	}
	if _, err := there.Rotate(ctx(t)); err != nil {
		t.Fatal(err)
	}
	fresh, _, err := there.Issue(ctx(t), "default", caller(), MaxTTL)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := here.Validate(ctx(t), "default", fresh); err != nil {
		t.Fatalf("a bearer of a key rotated in elsewhere, validated here at once: got %v, want it valid", err)
	}
	other, _ := newKeys(t)
	foreign, _, err := other.Issue(ctx(t), "default", caller(), MaxTTL)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := here.Validate(ctx(t), "default", foreign); !errors.Is(err, ErrRefused) {
		t.Fatalf("a bearer of a key no set here publishes: got %v, want it refused", err)
	}
}

// A JWT's times are whole seconds: a bearer asked for ttl lives at least ttl from the moment it
// is issued, whatever the fraction of that second (truncated, `ttlSec: 1` at x.999 s left a
// millisecond), and never more than MaxTTL past its iat.
func TestABearerLivesAtLeastItsTTLAndAtMostFifteenMinutes(t *testing.T) {
	for _, tt := range []struct {
		name string
		frac time.Duration
		ttl  time.Duration
	}{
		{"one second, late in the second", 999 * time.Millisecond, time.Second},
		{"one second, on the second", 0, time.Second},
		{"a fraction past a second", 400 * time.Millisecond, 1500 * time.Millisecond},
		{"the longest, late in the second", 999 * time.Millisecond, MaxTTL},
		{"the longest, on the second", 0, MaxTTL},
	} {
		t.Run(tt.name, func(t *testing.T) {
			k, c := newKeys(t)
			c.t = c.t.Add(tt.frac)
			issued := c.t
			token, exp, err := k.Issue(ctx(t), "default", caller(), tt.ttl)
			if err != nil {
				t.Fatal(err)
			}
			got, err := k.Validate(ctx(t), "default", token)
			if err != nil {
				t.Fatal(err)
			}
			if !got.Expires.Equal(exp) {
				t.Errorf("the bearer's exp: got %s, want the %s Issue returned", got.Expires, exp)
			}
			if life := exp.Sub(issued); life < tt.ttl && (tt.ttl < MaxTTL || life < MaxTTL-time.Second) {
				t.Errorf("issued at %s for %s: got exp %s, %s of life, want at least %s", issued.Format(time.StampMilli), tt.ttl, exp, life, tt.ttl)
			}
			if life := exp.Sub(got.IssuedAt); life > MaxTTL {
				t.Errorf("got %s from iat to exp, want at most %s", life, MaxTTL)
			}
		})
	}
}

// A ceiling (the IdP token's exp) bounds the bearer although its ttl was taken a moment before;
// a ceiling already passed issues nothing.
func TestABearerNeverOutlivesItsCeiling(t *testing.T) {
	k, c := newKeys(t)
	c.t = c.t.Add(700 * time.Millisecond)
	ceiling := c.t.Add(10 * time.Second).Truncate(time.Second)
	cl := caller()
	cl.Expires = ceiling
	// The ttl reached the ceiling at an earlier instant; rounded up from now it would pass it.
	_, exp, err := k.Issue(ctx(t), "default", cl, ceiling.Sub(c.t.Add(-300*time.Millisecond)))
	if err != nil || !exp.Equal(ceiling) {
		t.Fatalf("got exp %s (%v), want the ceiling %s", exp, err, ceiling)
	}
	cl.Expires = c.t.Add(-time.Second)
	if token, _, err := k.Issue(ctx(t), "default", cl, time.Second); err == nil {
		t.Fatalf("a ceiling passed: got a bearer %q, want none", token[:16])
	}
}
