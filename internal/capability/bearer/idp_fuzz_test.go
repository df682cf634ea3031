package bearer

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/cotal-ai/authplane/internal/core/fault"
	"github.com/cotal-ai/authplane/internal/testkit"
	"github.com/cotal-ai/authplane/subjects"
)

// fuzzVerifier is a verifier of a test IdP on a clock stopped at its start, shared by every input
// of a fuzz target: it fetches the key set once, here, and a stopped clock never lets an unknown
// kid refetch it (RefreshEvery never passes), so no input makes a fetch. It returns the IdP, the
// verifier, the clock's time and the number of fetches made.
func fuzzVerifier(f *testing.F) (*testkit.IdP, *Verifier, time.Time, int64) {
	p := testkit.NewIdP(f)
	start := time.Now()
	v, err := NewVerifier(IdPConfig{URL: p.Server.URL, Issuer: p.Issuer, Audience: p.Audience, JWKS: p.JWKS()}, func() time.Time { return start })
	if err != nil {
		f.Fatal(err)
	}
	if _, err := v.Verify(context.Background(), p.Token(f, p.Claims("alice", time.Hour))); err != nil {
		f.Fatal(err)
	}
	return p, v, start, p.Fetches.Load()
}

// ownerSecret keys DeriveOwner in the fuzz targets, as the vectors do.
var ownerSecret = []byte(strings.Repeat("k", 32))

// checkIdPVerdict checks Verify's answer for token: no key set fetched; a refusal short and
// repeating little of the token; a subject that verifies is one an owner derives from.
func checkIdPVerdict(t *testing.T, p *testkit.IdP, now time.Time, fetches int64, token string, s Subject, err error) {
	t.Helper()
	if got := p.Fetches.Load(); got != fetches {
		t.Fatalf("an input fetched the key set (%d fetches, want %d)", got, fetches)
	}
	if err != nil {
		if len(err.Error()) > fault.MaxMessage {
			t.Fatalf("a %d-byte refusal, want at most %d: %.300q", len(err.Error()), fault.MaxMessage, err)
		}
		testkit.Bounded(t, err.Error(), []byte(token))
		return
	}
	if s.Sub == "" || !utf8.ValidString(s.Sub) || !s.Exp.Add(skew).After(now) {
		t.Fatalf("verified subject %q until %s at %s", s.Sub, s.Exp, now)
	}
	if owner := DeriveOwner(ownerSecret, p.Issuer, s.Sub); !subjects.ValidUserOwner(owner) {
		t.Fatalf("subject %q derives owner %q", s.Sub, owner)
	}
}

// FuzzVerifyToken checks CheckHeader and Verify on any token: CheckHeader passes only a header
// of EdDSA that brings no key of its own, and returns its kid; a token it refuses, Verify
// refuses the same; see checkIdPVerdict for the rest.
func FuzzVerifyToken(f *testing.F) {
	p, v, now, fetches := fuzzVerifier(f)
	// The tokens of this package's tests: valid ones, and every forgery.
	claims := p.Claims("alice", time.Hour)
	f.Add(p.Token(f, claims))
	f.Add(p.Sign(f, claims, nil))
	f.Add(p.Token(f, map[string]any{"iss": p.Issuer, "aud": []string{p.Audience}, "sub": "alice", "iat": claims["iat"], "exp": claims["exp"]}))
	f.Add(p.Sign(f, claims, map[string]any{"kid": "random-1"}))
	for _, forgery := range p.Forgeries(f) {
		f.Add(forgery.Token)
	}
	f.Fuzz(func(t *testing.T, token string) {
		kid, herr := CheckHeader(token)
		s, err := v.Verify(context.Background(), token)
		if herr != nil {
			if err == nil || err.Error() != herr.Error() {
				t.Fatalf("CheckHeader refused %v, Verify answered %v", herr, err)
			}
		} else {
			head, _, _ := strings.Cut(token, ".")
			raw, derr := base64.RawURLEncoding.DecodeString(head)
			var header map[string]any
			if len(token) > MaxToken || derr != nil || json.Unmarshal(raw, &header) != nil || header["alg"] != "EdDSA" {
				t.Fatalf("CheckHeader passed a header of %q (%v)", fault.Clip(string(raw), 200), derr)
			}
			for _, k := range []string{"jku", "jwk", "x5u", "x5c", "crit"} {
				if _, ok := header[k]; ok {
					t.Fatalf("CheckHeader passed a header carrying %s", k)
				}
			}
			if want, _ := header["kid"].(string); kid != want {
				t.Fatalf("CheckHeader: got kid %q, want %q", kid, want)
			}
		}
		checkIdPVerdict(t, p, now, fetches, token, s, err)
	})
}

// FuzzVerifyClaims checks Verify on any claims the IdP signs: what the signature cannot judge,
// the claims' checks must (see checkIdPVerdict); a subject that verifies is the sub encoding/json
// reads, from the configured issuer and audience.
func FuzzVerifyClaims(f *testing.F) {
	p, v, now, fetches := fuzzVerifier(f)
	iat, exp := now.Unix(), now.Add(time.Hour).Unix()
	with := func(k string, val any) []byte {
		c := p.Claims("someone", time.Hour)
		if val == nil {
			delete(c, k)
		} else {
			c[k] = val
		}
		data, err := json.Marshal(c)
		if err != nil {
			f.Fatal(err)
		}
		return data
	}
	// The claims of this package's tests and of testkit's forged tokens.
	f.Add(with("sub", "alice"))
	f.Add(with("aud", []string{p.Audience}))
	f.Add([]byte(`{"iss":"` + p.Issuer + `","aud":"` + p.Audience + `","sub":"alice","x":"\ud83d\ude00","iat":` + itoa(iat) + `,"exp":` + itoa(exp) + `}`))
	f.Add(with("iss", "https://evil.example"))
	f.Add(with("aud", "someone-else"))
	f.Add(with("aud", []string{p.Audience, "x"}))
	f.Add(with("exp", now.Add(-time.Minute).Unix()))
	f.Add(with("iat", now.Add(time.Minute).Unix()))
	f.Add(with("nbf", now.Add(time.Minute).Unix()))
	f.Add(with("exp", nil))
	f.Add(with("iat", nil))
	f.Add(with("sub", nil))
	f.Add(with("sub", ""))
	f.Add([]byte(`{"iss":"` + p.Issuer + `","aud":"` + p.Audience + `","sub":"a\ud800b","iat":` + itoa(iat) + `,"exp":` + itoa(exp) + `}`))
	f.Add([]byte(`{"iss":"` + p.Issuer + `","aud":"` + p.Audience + `","sub":"\udc00","iat":` + itoa(iat) + `,"exp":` + itoa(exp) + `}`))
	f.Add([]byte(`not json`))
	f.Fuzz(func(t *testing.T, payload []byte) {
		token := p.SignRaw(t, payload, map[string]any{"kid": p.KID})
		s, err := v.Verify(context.Background(), token)
		checkIdPVerdict(t, p, now, fetches, token, s, err)
		if err != nil {
			return
		}
		var c struct {
			Iss string          `json:"iss"`
			Aud json.RawMessage `json:"aud"`
			Sub string          `json:"sub"`
		}
		if err := json.NewDecoder(bytes.NewReader(payload)).Decode(&c); err != nil || c.Iss != p.Issuer || c.Sub != s.Sub || !audienceIs(c.Aud, p.Audience) {
			t.Fatalf("verified subject %q, but encoding/json reads the claims as %+v (%v)", s.Sub, c, err)
		}
	})
}
