package bearer

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/cotal-ai/authplane/internal/testkit"
)

func newVerifier(t *testing.T, p *testkit.IdP) *Verifier {
	t.Helper()
	v, err := NewVerifier(IdPConfig{URL: p.Server.URL, Issuer: p.Issuer, Audience: p.Audience, JWKS: p.JWKS()}, time.Now)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

func TestAValidTokenVerifiesWithItsSubjectAndExpiry(t *testing.T) {
	p := testkit.NewIdP(t)
	v := newVerifier(t, p)
	claims := p.Claims("alice", time.Hour)
	for name, token := range map[string]string{
		"with its kid":            p.Token(t, claims),
		"without a kid, one key":  p.Sign(t, claims, nil),
		"an audience in an array": p.Token(t, map[string]any{"iss": p.Issuer, "aud": []string{p.Audience}, "sub": "alice", "iat": claims["iat"], "exp": claims["exp"]}),
		"a surrogate pair in sub": p.SignRaw(t, []byte(`{"iss":"`+p.Issuer+`","aud":"`+p.Audience+`","sub":"alice","x":"\ud83d\ude00","iat":`+itoa(claims["iat"])+`,"exp":`+itoa(claims["exp"])+`}`), map[string]any{"kid": p.KID}),
	} {
		t.Run(name, func(t *testing.T) {
			got, err := v.Verify(context.Background(), token)
			if err != nil || got.Sub != "alice" || got.Exp.Unix() != claims["exp"] {
				t.Fatalf("got %+v, %v; want alice until %v", got, err, claims["exp"])
			}
		})
	}
}

// itoa is a claim's time in seconds as JSON writes it.
func itoa(v any) string { return strconv.FormatInt(v.(int64), 10) }

func TestEveryForgeryIsRefused(t *testing.T) {
	p := testkit.NewIdP(t)
	v := newVerifier(t, p)
	for _, f := range p.Forgeries(t) {
		t.Run(f.Name, func(t *testing.T) {
			if got, err := v.Verify(context.Background(), f.Token); err == nil {
				t.Fatalf("got %+v, want a refusal", got)
			}
		})
	}
}

func TestAFloodOfUnknownKidsFetchesTheKeySetAtMostOnceAnInterval(t *testing.T) {
	p := testkit.NewIdP(t)
	v := newVerifier(t, p)
	if _, err := v.Verify(context.Background(), p.Token(t, p.Claims("alice", time.Hour))); err != nil {
		t.Fatal(err)
	}
	before := p.Fetches.Load()
	for i := range 200 {
		token := p.Sign(t, p.Claims("alice", time.Hour), map[string]any{"kid": "random-" + strconv.Itoa(i)})
		if _, err := v.Verify(context.Background(), token); err == nil {
			t.Fatal("an unknown kid verified")
		}
	}
	if got := p.Fetches.Load() - before; got > 1 {
		t.Fatalf("200 unknown kids fetched the key set %d times, want at most once within %s", got, RefreshEvery)
	}
}

func TestOnlyHTTPSOrALoopbackLiteralServesTheKeySet(t *testing.T) {
	for url, ok := range map[string]bool{
		"https://idp.example/jwks": true,
		"http://127.0.0.1:9/jwks":  true,
		"http://[::1]:9/jwks":      true,
		"http://localhost:9/jwks":  false,
		"http://idp.example/jwks":  false,
		"ftp://idp.example/jwks":   false,
		"not a url":                false,
		"https:///no-host":         false,
	} {
		if err := CheckJWKSURL(url); (err == nil) != ok {
			t.Errorf("%s: got %v, want ok %v", url, err, ok)
		}
	}
}

func TestLoneSurrogates(t *testing.T) {
	for raw, lone := range map[string]bool{
		`"abc"`:                false,
		`"\ud83d\ude00"`:       false,
		`"a\ud800"`:            true,
		`"\ud800b"`:            true,
		`"\udc00"`:             true,
		`"\ud800\ud800"`:       true,
		`"\\ud800"`:            false, // an escaped backslash, then text
		`"\u0041\ud83d\ude00"`: false,
		`"\ud83d\"\ude00"`:     true,
	} {
		if got := loneSurrogate(raw); got != lone {
			t.Errorf("%s: got %v, want %v", raw, got, lone)
		}
	}
}
