package subjects

import (
	"testing"

	"github.com/nats-io/nkeys"
)

// One key pair spelled five ways passed "every nkey distinct" and was minted five times: only
// the 56-character canonical spelling is a key.
func TestOnlyTheCanonicalSpellingOfAnNKeyIsValid(t *testing.T) {
	for _, c := range []struct {
		name   string
		create func() (nkeys.KeyPair, error)
		valid  func(string) bool
		other  func(string) bool
	}{
		{"user", nkeys.CreateUser, ValidUserNKey, ValidAccountNKey},
		{"account", nkeys.CreateAccount, ValidAccountNKey, ValidUserNKey},
	} {
		t.Run(c.name, func(t *testing.T) {
			kp, err := c.create()
			if err != nil {
				t.Fatal(err)
			}
			pub, err := kp.PublicKey()
			if err != nil {
				t.Fatal(err)
			}
			if !c.valid(pub) {
				t.Fatalf("%s: got invalid, want the canonical key accepted", pub)
			}
			if c.other(pub) {
				t.Fatalf("%s: valid as the other kind of key too", pub)
			}
			for _, suffix := range []string{"A", "7", "Q", "AAA", "QQQ", "AA", "="} {
				if c.valid(pub + suffix) {
					t.Errorf("%s+%q (%d characters): got valid, want only the 56-character spelling", pub, suffix, len(pub)+len(suffix))
				}
			}
			for _, bad := range []string{"", pub[:55], pub[:55] + "!", "X" + pub[1:]} {
				if c.valid(bad) {
					t.Errorf("%q: got valid", bad)
				}
			}
		})
	}
}

func TestNewIdentifiersKeepTheirGrammarAndDoNotRepeat(t *testing.T) {
	seen := map[string]bool{}
	for range 2000 {
		uid, rid, nonce, secret := NewUID(), NewRequestID(), NewNonce(), NewSecret(12)
		if !ValidUID(uid) {
			t.Fatalf("NewUID %q: want [a-z0-9]{26,32}", uid)
		}
		if !ValidRequestID(rid) {
			t.Fatalf("NewRequestID %q: want [A-Za-z0-9_-]{22,64}", rid)
		}
		if len(nonce) != 32 || len(secret) != 24 {
			t.Fatalf("NewNonce %q, NewSecret(12) %q: want 32 and 24 hex characters", nonce, secret)
		}
		for _, s := range []string{uid, rid, nonce, secret} {
			if seen[s] {
				t.Fatalf("%q came twice", s)
			}
			seen[s] = true
		}
	}
}
