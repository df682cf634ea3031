package ids

import (
	"testing"

	"github.com/cotal-ai/authplane/subjects"
)

func TestIdentifiersKeepTheirGrammarAndDoNotRepeat(t *testing.T) {
	seen := map[string]bool{}
	for range 2000 {
		uid, rid, nonce := UID(), RequestID(), Nonce()
		if !subjects.ValidUID(uid) {
			t.Fatalf("UID %q: want [a-z0-9]{26,32}", uid)
		}
		if !subjects.ValidRequestID(rid) {
			t.Fatalf("RequestID %q: want [A-Za-z0-9_-]{22,64}", rid)
		}
		if len(nonce) != 32 {
			t.Fatalf("Nonce %q: want 32 hex characters", nonce)
		}
		for _, s := range []string{uid, rid, nonce} {
			if seen[s] {
				t.Fatalf("%q came twice", s)
			}
			seen[s] = true
		}
	}
}
