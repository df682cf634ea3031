package testkit

// An identity provider for tests: an Ed25519 key served as a JWKS by an
// httptest server on loopback, and tokens signed with it (or forged in the ways a hostile caller
// forges them).

import (
	"crypto"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-jose/go-jose/v4"
)

// IdP is a running test identity provider.
type IdP struct {
	Server   *httptest.Server
	Issuer   string
	Audience string
	Key      ed25519.PrivateKey
	KID      string
	// Fetches counts the JWKS requests served.
	Fetches atomic.Int64
	// Stall, when it holds a channel, holds every JWKS answer until that channel closes (or the
	// request is cancelled): a slow IdP.
	Stall atomic.Pointer[chan struct{}]
}

// NewIdP starts an IdP whose JWKS is at Server.URL + "/jwks"; it stops when the test ends.
func NewIdP(t testing.TB) *IdP {
	t.Helper()
	_, key, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	p := &IdP{Key: key, Issuer: "https://idp.test", Audience: "cotal-test"}
	jwk := jose.JSONWebKey{Key: key.Public(), Algorithm: string(jose.EdDSA), Use: "sig"}
	tp, err := jwk.Thumbprint(crypto.SHA256)
	if err != nil {
		t.Fatal(err)
	}
	p.KID = base64.RawURLEncoding.EncodeToString(tp)
	jwk.KeyID = p.KID
	set, err := json.Marshal(jose.JSONWebKeySet{Keys: []jose.JSONWebKey{jwk}})
	if err != nil {
		t.Fatal(err)
	}
	p.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/jwks" {
			http.NotFound(w, r)
			return
		}
		p.Fetches.Add(1)
		if stall := p.Stall.Load(); stall != nil {
			select {
			case <-*stall:
			case <-r.Context().Done():
				return
			}
		}
		w.Header().Set("Content-Type", "application/json")
		if _, err := w.Write(set); err != nil {
			t.Errorf("jwks: %v", err)
		}
	}))
	t.Cleanup(p.Server.Close)
	return p
}

// JWKS is the key set's URL.
func (p *IdP) JWKS() string { return p.Server.URL + "/jwks" }

// Claims are the claims of a token for sub valid for ttl from now: iss, aud, sub, iat, exp.
func (p *IdP) Claims(sub string, ttl time.Duration) map[string]any {
	now := time.Now()
	return map[string]any{"iss": p.Issuer, "aud": p.Audience, "sub": sub, "iat": now.Unix(), "exp": now.Add(ttl).Unix()}
}

// Token signs claims with the IdP's key under its kid.
func (p *IdP) Token(t testing.TB, claims map[string]any) string {
	t.Helper()
	return p.Sign(t, claims, map[string]any{"kid": p.KID})
}

// Sign signs claims with the IdP's key, with header parameters extra beside alg.
func (p *IdP) Sign(t testing.TB, claims map[string]any, extra map[string]any) string {
	t.Helper()
	payload, err := json.Marshal(claims)
	if err != nil {
		t.Fatal(err)
	}
	return p.SignRaw(t, payload, extra)
}

// SignRaw signs payload as it is (a test may need bytes json.Marshal would not write).
func (p *IdP) SignRaw(t testing.TB, payload []byte, extra map[string]any) string {
	t.Helper()
	opts := &jose.SignerOptions{}
	for k, v := range extra {
		opts = opts.WithHeader(jose.HeaderKey(k), v)
	}
	signer, err := jose.NewSigner(jose.SigningKey{Algorithm: jose.EdDSA, Key: p.Key}, opts)
	if err != nil {
		t.Fatal(err)
	}
	jws, err := signer.Sign(payload)
	if err != nil {
		t.Fatal(err)
	}
	token, err := jws.CompactSerialize()
	if err != nil {
		t.Fatal(err)
	}
	return token
}

// Unsigned is a token with header and claims as given and signature sig, signed by nothing:
// what `alg: none` and other forgeries look like.
func Unsigned(t testing.TB, header, claims map[string]any, sig []byte) string {
	t.Helper()
	h, err := json.Marshal(header)
	if err != nil {
		t.Fatal(err)
	}
	c, err := json.Marshal(claims)
	if err != nil {
		t.Fatal(err)
	}
	enc := base64.RawURLEncoding
	return enc.EncodeToString(h) + "." + enc.EncodeToString(c) + "." + enc.EncodeToString(sig)
}

// Forgery is a token a hostile caller presents as an IdP token.
type Forgery struct {
	Name  string
	Token string
}

// Forgeries are the hostile tokens every door that takes an IdP token must refuse: no
// signature, the wrong algorithms, keys smuggled in headers, the wrong issuer or audience,
// stale or future times, an unknown kid, a bad signature, a lone surrogate, an oversized token.
func (p *IdP) Forgeries(t testing.TB) []Forgery {
	t.Helper()
	good := p.Claims("someone", time.Hour)
	with := func(k string, v any) map[string]any {
		c := map[string]any{}
		for kk, vv := range good {
			c[kk] = vv
		}
		if v == nil {
			delete(c, k)
		} else {
			c[k] = v
		}
		return c
	}
	hs := func() string {
		signer, err := jose.NewSigner(jose.SigningKey{Algorithm: jose.HS256, Key: []byte(p.Key.Public().(ed25519.PublicKey))}, (&jose.SignerOptions{}).WithHeader("kid", p.KID))
		if err != nil {
			t.Fatal(err)
		}
		payload, err := json.Marshal(good)
		if err != nil {
			t.Fatal(err)
		}
		jws, err := signer.Sign(payload)
		if err != nil {
			t.Fatal(err)
		}
		s, err := jws.CompactSerialize()
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	valid := p.Token(t, good)
	badSig := valid[:len(valid)-4] + map[bool]string{true: "AAAA", false: "BBBB"}[valid[len(valid)-4:] != "AAAA"]
	return []Forgery{
		{"alg none", Unsigned(t, map[string]any{"alg": "none", "kid": p.KID}, good, nil)},
		{"HS256 keyed with the public key", hs()},
		{"RS256", Unsigned(t, map[string]any{"alg": "RS256", "kid": p.KID}, good, make([]byte, 256))},
		{"a jku header", p.Sign(t, good, map[string]any{"kid": p.KID, "jku": p.JWKS()})},
		{"a jwk header", p.Sign(t, good, map[string]any{"kid": p.KID, "jwk": map[string]any{"kty": "OKP", "crv": "Ed25519", "x": "AA"}})},
		{"an x5u header", p.Sign(t, good, map[string]any{"kid": p.KID, "x5u": "https://evil.example/cert"})},
		{"the wrong issuer", p.Token(t, with("iss", "https://evil.example"))},
		{"the wrong audience", p.Token(t, with("aud", "someone-else"))},
		{"two audiences", p.Token(t, with("aud", []string{p.Audience, "x"}))},
		{"expired", p.Token(t, with("exp", time.Now().Add(-time.Minute).Unix()))},
		{"issued in the future", p.Token(t, with("iat", time.Now().Add(time.Minute).Unix()))},
		{"no exp", p.Token(t, with("exp", nil))},
		// A NumericDate is a JSON number; a string that spells one is not (RFC 7519 §2).
		{"exp as a string", p.Token(t, with("exp", itoa(time.Now().Add(time.Hour).Unix())))},
		{"iat as a string", p.Token(t, with("iat", itoa(time.Now().Unix())))},
		{"nbf as a string", p.Token(t, with("nbf", itoa(time.Now().Unix())))},
		{"no iat", p.Token(t, with("iat", nil))},
		{"no sub", p.Token(t, with("sub", nil))},
		{"an empty sub", p.Token(t, with("sub", ""))},
		{"an unknown kid", p.Sign(t, good, map[string]any{"kid": "not-a-kid"})},
		{"a bad signature", badSig},
		{"a lone surrogate in sub", p.SignRaw(t, []byte(`{"iss":"`+p.Issuer+`","aud":"`+p.Audience+`","sub":"a\ud800b","iat":`+itoa(time.Now().Unix())+`,"exp":`+itoa(time.Now().Add(time.Hour).Unix())+`}`), map[string]any{"kid": p.KID})},
		{"a lone low surrogate in sub", p.SignRaw(t, []byte(`{"iss":"`+p.Issuer+`","aud":"`+p.Audience+`","sub":"\udc00","iat":`+itoa(time.Now().Unix())+`,"exp":`+itoa(time.Now().Add(time.Hour).Unix())+`}`), map[string]any{"kid": p.KID})},
		// Over MaxToken (8 KiB) yet well inside an HTTP door's 64 KiB body, so that a door
		// reaches the verifier's bound rather than its own.
		{"an oversized token", p.Token(t, with("pad", strings.Repeat("a", 9000)))},
		{"not a JWT", "not.a.jwt"},
	}
}

func itoa(n int64) string {
	b, err := json.Marshal(n)
	if err != nil {
		panic(err)
	}
	return string(b)
}
