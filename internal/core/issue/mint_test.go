package issue

import (
	"encoding/base64"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nkeys"

	"github.com/cotal-ai/authplane/subjects"
)

func newIssuer(t testing.TB) (*Issuer, string, nkeys.KeyPair) {
	t.Helper()
	acct, err := nkeys.CreateAccount()
	if err != nil {
		t.Fatal(err)
	}
	signer, err := nkeys.CreateAccount()
	if err != nil {
		t.Fatal(err)
	}
	pub, err := acct.PublicKey()
	if err != nil {
		t.Fatal(err)
	}
	iss, err := NewIssuer(pub, signer, time.Now)
	if err != nil {
		t.Fatal(err)
	}
	return iss, pub, signer
}

func userPub(t testing.TB) string {
	t.Helper()
	kp, err := nkeys.CreateUser()
	if err != nil {
		t.Fatal(err)
	}
	pub, err := kp.PublicKey()
	if err != nil {
		t.Fatal(err)
	}
	return pub
}

var grant = subjects.Permissions{Pub: []string{"a.b"}, Sub: []string{"_INBOX.o.a.>"}}

func TestSignIssuesWhatWasAskedSignedByTheSigningKey(t *testing.T) {
	iss, account, signer := newIssuer(t)
	key := userPub(t)
	exp := time.Now().Add(time.Hour).Truncate(time.Second)
	token, err := iss.Sign(User{Name: "o.a", Key: key, Permissions: grant, Expires: exp})
	if err != nil {
		t.Fatal(err)
	}
	c, err := jwt.DecodeUserClaims(token)
	if err != nil {
		t.Fatal(err)
	}
	signerPub, err := signer.PublicKey()
	if err != nil {
		t.Fatal(err)
	}
	if c.Issuer != signerPub || c.IssuerAccount != account || c.Subject != key || c.Name != "o.a" || c.Expires != exp.Unix() {
		t.Fatalf("got iss %s account %s sub %s name %s exp %d", c.Issuer, c.IssuerAccount, c.Subject, c.Name, c.Expires)
	}
	if !slices.Equal(c.Pub.Allow, grant.Pub) || !slices.Equal(c.Sub.Allow, grant.Sub) || len(c.Pub.Deny) != 0 || c.Resp != nil {
		t.Fatalf("got permissions %+v, want exactly the grant", c.Permissions)
	}
}

func TestSignSetsTheUsersLimits(t *testing.T) {
	iss, _, _ := newIssuer(t)
	token, err := iss.Sign(User{Name: "o.a", Key: userPub(t), Permissions: grant, Expires: time.Now().Add(time.Hour), Limits: Limits{Subs: 7, Payload: 4096}})
	if err != nil {
		t.Fatal(err)
	}
	c, err := jwt.DecodeUserClaims(token)
	if err != nil {
		t.Fatal(err)
	}
	if c.Limits.Subs != 7 || c.Limits.Payload != 4096 || c.Limits.Data != -1 {
		t.Fatalf("got limits %+v, want 7 subscriptions, 4096-byte payloads, data unbounded", c.Limits)
	}
}

func TestSignRefusesWhatWouldBeUnsafe(t *testing.T) {
	iss, account, _ := newIssuer(t)
	future := time.Now().Add(time.Hour)
	cases := map[string]User{
		"an empty publish list (allow all)":   {Name: "o.a", Key: userPub(t), Permissions: subjects.Permissions{Sub: grant.Sub}, Expires: future},
		"an empty subscribe list (allow all)": {Name: "o.a", Key: userPub(t), Permissions: subjects.Permissions{Pub: grant.Pub}, Expires: future},
		"an account key as subject":           {Name: "o.a", Key: account, Permissions: grant, Expires: future},
		"an expiry in the past":               {Name: "o.a", Key: userPub(t), Permissions: grant, Expires: time.Now().Add(-time.Second)},
	}
	// Subjects the broker would refuse: the claims are validated before anything is signed.
	for name, bad := range map[string]string{
		"an empty subject":          "",
		"a trailing dot":            "cotal.a.",
		"a leading dot":             ".cotal.a",
		"consecutive dots":          "cotal..a",
		"a space in a subject":      "cotal.a b",
		"a queue on a publish":      "cotal.a q",
		"too many spaces in a sub":  "cotal.a q r",
		"a queue name with a space": "cotal.a  q",
	} {
		pub := append(append([]string(nil), grant.Pub...), bad)
		sub := append(append([]string(nil), grant.Sub...), bad)
		cases["publish: "+name] = User{Name: "o.a", Key: userPub(t), Permissions: subjects.Permissions{Pub: pub, Sub: grant.Sub}, Expires: future}
		if name != "a queue on a publish" && name != "a space in a subject" { // a queue group on a subscription is allowed
			cases["subscribe: "+name] = User{Name: "o.a", Key: userPub(t), Permissions: subjects.Permissions{Pub: grant.Pub, Sub: sub}, Expires: future}
		}
	}
	for name, u := range cases {
		t.Run(name, func(t *testing.T) {
			if token, err := iss.Sign(u); err == nil {
				t.Fatalf("got a token (%d bytes), want a refusal", len(token))
			}
		})
	}
}

// The re-check after signing compares what the token says with what was asked, list by list.
func TestVerifyRefusesATokenThatSaysOtherThanWasAsked(t *testing.T) {
	iss, _, _ := newIssuer(t)
	u := User{Name: "o.a", Key: userPub(t), Permissions: grant, Expires: time.Now().Add(time.Hour).Truncate(time.Second)}
	token, err := iss.Sign(u)
	if err != nil {
		t.Fatal(err)
	}
	if err := iss.verify(token, u); err != nil {
		t.Fatalf("the token as asked: got %v, want it to verify", err)
	}
	asks := map[string]func(*User){
		"another name":               func(u *User) { u.Name = "o.b" },
		"another expiry":             func(u *User) { u.Expires = u.Expires.Add(time.Second) },
		"one more publish subject":   func(u *User) { u.Permissions.Pub = append([]string{"x"}, grant.Pub...) },
		"another subscribe subject":  func(u *User) { u.Permissions.Sub = []string{"_INBOX.o.b.>"} },
		"no publish subjects":        func(u *User) { u.Permissions.Pub = nil },
		"another key as the subject": func(u *User) { u.Key = userPub(t) },
	}
	for name, change := range asks {
		t.Run(name, func(t *testing.T) {
			other := u
			change(&other)
			if err := iss.verify(token, other); err == nil {
				t.Fatal("got nil, want the difference found")
			}
		})
	}
}

// BenchmarkSign compares encoding a user JWT with the cached key against a plain nkeys key
// pair (which re-derives the private key from the seed on every signature), side by side in
// one run, and measures the whole Sign (encode, then decode the token once and compare it
// with what was asked):
// go test -run - -bench Sign ./internal/core/issue/
func BenchmarkSign(b *testing.B) {
	iss, _, signer := newIssuer(b)
	key := userPub(b)
	u := User{Name: "o.a", Key: key, Permissions: grant, Expires: time.Now().Add(time.Hour)}
	claims := func() *jwt.UserClaims {
		uc := jwt.NewUserClaims(key)
		uc.Name, uc.Expires = u.Name, u.Expires.Unix()
		uc.Pub.Allow, uc.Sub.Allow = grant.Pub, grant.Sub
		return uc
	}
	for _, bc := range []struct {
		name string
		kp   nkeys.KeyPair
	}{{"encode/cached-key", iss.signer}, {"encode/plain-nkeys", signer}} {
		b.Run(bc.name, func(b *testing.B) {
			for b.Loop() {
				if _, err := claims().Encode(bc.kp); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
	b.Run("sign-and-verify", func(b *testing.B) {
		for b.Loop() {
			if _, err := iss.Sign(u); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// The re-check decodes the token once instead of verifying the issuer's own fresh signature
// again: whatever a token says other than what was asked, or a token that is not one this
// issuer makes, is still refused.
func TestVerifyRefusesATokenThatIsNotWhatThisIssuerMakes(t *testing.T) {
	iss, _, _ := newIssuer(t)
	other, _, _ := newIssuer(t)
	u := User{Name: "o.a", Key: userPub(t), Permissions: grant, Expires: time.Now().Add(time.Hour).Truncate(time.Second)}
	token, err := iss.Sign(u)
	if err != nil {
		t.Fatal(err)
	}
	foreign, err := other.Sign(u)
	if err != nil {
		t.Fatal(err)
	}
	// resign re-encodes what the token says, changed by change, signed by this issuer's key.
	resign := func(change func(*jwt.UserClaims)) string {
		c, err := jwt.DecodeUserClaims(token)
		if err != nil {
			t.Fatal(err)
		}
		change(c)
		out, err := c.Encode(iss.signer)
		if err != nil {
			t.Fatal(err)
		}
		return out
	}
	head, rest, _ := strings.Cut(token, ".")
	payload, sig, _ := strings.Cut(rest, ".")
	tokens := map[string]string{
		"another issuer's":           foreign,
		"a deny list added":          resign(func(c *jwt.UserClaims) { c.Pub.Deny.Add("x") }),
		"a response permission":      resign(func(c *jwt.UserClaims) { c.Resp = &jwt.ResponsePermission{MaxMsgs: 1} }),
		"a bearer token":             resign(func(c *jwt.UserClaims) { c.BearerToken = true }),
		"other limits":               resign(func(c *jwt.UserClaims) { c.Limits.Data = 10 }),
		"a source network limit":     resign(func(c *jwt.UserClaims) { c.Src.Add("10.0.0.0/8") }),
		"two segments":               head + "." + payload,
		"four segments":              token + "." + sig,
		"a short signature":          head + "." + payload + "." + sig[:20],
		"another header":             "eyJ0eXAiOiJKV1QiLCJhbGciOiJlZDI1NTE5In0." + payload + "." + sig,
		"a payload that is not JSON": head + "." + base64.RawURLEncoding.EncodeToString([]byte("{")) + "." + sig,
	}
	for name, tok := range tokens {
		t.Run(name, func(t *testing.T) {
			if err := iss.verify(tok, u); err == nil {
				t.Fatal("got nil, want the token refused")
			}
		})
	}
}
