package bearer

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"encoding/json"
	"errors"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/go-jose/go-jose/v4"

	"github.com/cotal-ai/authplane/internal/core/fault"
	"github.com/cotal-ai/authplane/internal/testkit"
	"github.com/cotal-ai/authplane/subjects"
)

// fuzzKeys is a key set of one fixed key on a fixed clock: seeds and verdicts stay the same from
// run to run, and the store, in memory, never fails.
func fuzzKeys(tb testing.TB, seed byte) (*Keys, ed25519.PrivateKey, *clock) {
	tb.Helper()
	c := &clock{t: time.Unix(1_800_000_000, 0)}
	k := New(testkit.NewKV(), c.now)
	priv := ed25519.NewKeyFromSeed(bytes.Repeat([]byte{seed}, ed25519.SeedSize))
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if err := k.Ensure(ctx, jose.JSONWebKey{Key: priv}); err != nil {
		tb.Fatal(err)
	}
	return k, priv, c
}

func fuzzCtx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	t.Cleanup(cancel)
	return c
}

// FuzzParseSet checks the key set's decoder (the parse New gives the fence) on any stored bytes:
// a set that does not parse is an error and the zero set; a set that parses is version 1, its
// active key published and signing, every key an Ed25519 private key under its thumbprint; and
// written back as the fence writes it (marshalled) it parses again to the same bytes.
func FuzzParseSet(f *testing.F) {
	now := time.Unix(1_800_000_000, 0)
	one, err := entry(ed25519.NewKeyFromSeed(bytes.Repeat([]byte{1}, ed25519.SeedSize)), now)
	if err != nil {
		f.Fatal(err)
	}
	two, err := entry(ed25519.NewKeyFromSeed(bytes.Repeat([]byte{2}, ed25519.SeedSize)), now)
	if err != nil {
		f.Fatal(err)
	}
	stopped := one
	stopped.Stopped = now.Unix()
	public, err := (&jose.JSONWebKey{Key: ed25519.NewKeyFromSeed(bytes.Repeat([]byte{1}, ed25519.SeedSize)).Public(), KeyID: one.KID}).MarshalJSON()
	if err != nil {
		f.Fatal(err)
	}
	// The sets Ensure and Rotate write, and the ways a set breaks.
	for _, s := range []keySet{
		{V: 1, Active: one.KID, Keys: []stored{one}, Nonce: "n"},
		{V: 1, Active: two.KID, Keys: []stored{stopped, two}, Nonce: "n"},
		{V: 2, Active: one.KID, Keys: []stored{one}},
		{V: 1, Active: two.KID, Keys: []stored{one}},
		{V: 1, Active: one.KID, Keys: []stored{stopped}},
		{V: 1, Active: one.KID, Keys: []stored{{KID: two.KID, JWK: one.JWK}, one}},
		{V: 1, Active: one.KID, Keys: []stored{{KID: one.KID, JWK: public}}},
	} {
		data, err := json.Marshal(s)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(data)
	}
	f.Add([]byte(`{"v":1,"active":"x","keys":[{"kid":"x","jwk":{"kty":"OKP","crv":"Ed25519","x":"AA","d":"AA"},"addedAt":1}],"nonce":"n"}`))
	f.Add([]byte(`not json`))
	f.Fuzz(func(t *testing.T, data []byte) {
		s, err := parseSet(data)
		if err != nil {
			if !reflect.DeepEqual(s, keySet{}) {
				t.Fatalf("a set that does not parse came back as %+v with %v", s, err)
			}
			return
		}
		active := 0
		for _, k := range s.Keys {
			if _, err := privateKey(k); err != nil {
				t.Fatalf("accepted key %q that does not decode: %v", k.KID, err)
			}
			if k.KID == s.Active && k.Stopped == 0 {
				active++
			}
		}
		if s.V != 1 || active == 0 {
			t.Fatalf("accepted a set of version %d with %d signing active keys", s.V, active)
		}
		written, err := json.Marshal(s)
		if err != nil {
			t.Fatal(err)
		}
		back, err := parseSet(written)
		if err != nil {
			t.Fatalf("the set %q, written back as %q, does not parse: %v", fault.Clip(string(data), 200), fault.Clip(string(written), 200), err)
		}
		if again, err := json.Marshal(back); err != nil || !bytes.Equal(again, written) {
			t.Fatalf("round trip: got %q, %v; want %q", fault.Clip(string(again), 200), err, fault.Clip(string(written), 200))
		}
	})
}

// checkVerdict checks Validate's answer for token: a refusal judges the bearer (ErrRefused: this
// store never fails) and repeats little of it; a bearer that validates carries what a bearer
// may, for this space, within its life.
func checkVerdict(t *testing.T, k *Keys, now time.Time, token string, c Claims, err error) {
	t.Helper()
	if err != nil {
		if !errors.Is(err, ErrRefused) {
			t.Fatalf("got %v, want a refusal of the bearer (ErrRefused)", err)
		}
		testkit.Bounded(t, err.Error(), []byte(token))
		return
	}
	if cerr := check(c); cerr != nil || !subjects.ValidUserOwner(c.Owner) {
		t.Fatalf("validated claims a bearer never carries: %+v (%v)", c, cerr)
	}
	if c.Expires.Sub(c.IssuedAt) > MaxTTL || !c.Expires.Add(Skew).After(now) || c.Expires.After(now.Add(MaxTTL+Skew)) || c.IssuedAt.After(now.Add(Skew)) {
		t.Fatalf("validated a bearer issued %s, expiring %s, at %s", c.IssuedAt, c.Expires, now)
	}
	if _, err := k.Validate(fuzzCtx(t), "other", token); err == nil {
		t.Fatal("a bearer of space default validated for space other")
	}
}

// FuzzValidate checks Validate on any token, against a key set of one key.
func FuzzValidate(f *testing.F) {
	k, _, c := fuzzKeys(f, 1)
	other, _, _ := fuzzKeys(f, 2)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	// The tokens of this package's tests: issued for every view and life, foreign, tampered,
	// junk.
	var tokens []string
	for _, issue := range []struct {
		keys *Keys
		c    Claims
		ttl  time.Duration
	}{
		{k, caller(), 10 * time.Minute}, {k, caller(), MaxTTL}, {k, caller(), time.Second},
		{k, Claims{Owner: owner, Actor: "ops", Scope: []string{"admin"}, View: ViewOps}, time.Minute},
		{k, Claims{Owner: owner, Actor: "worker", View: ViewCaller, Agent: true}, time.Minute},
		{other, caller(), time.Minute},
	} {
		token, _, err := issue.keys.Issue(ctx, "default", issue.c, issue.ttl)
		if err != nil {
			f.Fatal(err)
		}
		tokens = append(tokens, token)
	}
	parts := strings.Split(tokens[0], ".")
	tokens = append(tokens, parts[0]+"."+parts[1]+"x."+parts[2], "", "a.b.c", parts[0], parts[0]+"."+parts[1])
	for _, token := range tokens {
		f.Add(token)
	}
	f.Fuzz(func(t *testing.T, token string) {
		claims, err := k.Validate(fuzzCtx(t), "default", token)
		checkVerdict(t, k, c.t, token, claims, err)
	})
}

// FuzzValidateClaims checks Validate on any claims signed with the published key, as a bearer
// is: what the signature cannot judge, the claims' checks must.
func FuzzValidateClaims(f *testing.F) {
	k, priv, c := fuzzKeys(f, 1)
	now := c.t.Unix()
	good := wire{Iss: subjects.Issuer("default"), Aud: "default", Sub: owner, Iat: now, Nbf: now, Exp: now + 600, Ver: 1,
		Scope: []string{"supervise"}, Act: act{Owner: owner, Actor: "cli", View: ViewCaller}}
	// The bearer Issue writes, and one for each of judge's refusals.
	for _, mutate := range []func(w *wire){
		func(w *wire) {},
		func(w *wire) { w.Act.View, w.Scope = ViewOps, []string{"admin"} },
		func(w *wire) { w.Act.Agent = true },
		func(w *wire) { w.Iss, w.Aud = subjects.Issuer("other"), "other" },
		func(w *wire) { w.Ver = 2 },
		func(w *wire) { w.Iat = 0 },
		func(w *wire) { w.Nbf = now + 60 },
		func(w *wire) { w.Exp = now - 60 },
		func(w *wire) { w.Exp = now + 3600 },
		func(w *wire) { w.Sub = "u_bbbbbbbbbbbbbbbbbbbbbbbbbb" },
		func(w *wire) { w.Sub, w.Act.Owner = "p_aaaaaaaaaaaaaaaaaaaaaaaaaa", "p_aaaaaaaaaaaaaaaaaaaaaaaaaa" },
		func(w *wire) { w.Act.View = "root" },
		func(w *wire) { w.Act.Actor = "a.b" },
	} {
		w := good
		mutate(&w)
		data, err := json.Marshal(w)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(data)
	}
	f.Add([]byte(`{"iss":"urn:cotal:auth:default","extra":1}`))
	kid, err := thumbprint(priv.Public().(ed25519.PublicKey))
	if err != nil {
		f.Fatal(err)
	}
	signer, err := jose.NewSigner(jose.SigningKey{Algorithm: jose.EdDSA, Key: priv}, (&jose.SignerOptions{}).WithType("JWT").WithHeader("kid", kid))
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, payload []byte) {
		jws, err := signer.Sign(payload)
		if err != nil {
			t.Fatal(err)
		}
		token, err := jws.CompactSerialize()
		if err != nil {
			t.Fatal(err)
		}
		claims, err := k.Validate(fuzzCtx(t), "default", token)
		checkVerdict(t, k, c.t, token, claims, err)
		if err != nil {
			return
		}
		var w wire
		if err := json.Unmarshal(payload, &w); err != nil || w.Act.Owner != claims.Owner || w.Act.Actor != claims.Actor ||
			w.Sub != claims.Owner || w.Act.View != claims.View || w.Exp != claims.Expires.Unix() {
			t.Fatalf("validated claims %+v, but encoding/json reads the payload as %+v (%v)", claims, w, err)
		}
	})
}
