package flows

import (
	"testing"

	"github.com/nats-io/jwt/v2"

	"github.com/cotal-ai/authplane/client"
)

// endedText is the reference's text for everything an ended assignment once allowed.
func endedText(owner string) string {
	return "platform supervisor assignment for owner " + owner + " has ended; its lifecycle has ended and material issued under it authorizes nothing"
}

// claimsOf decodes every credential of materials, failing the test on one that does not.
func claimsOf(t testing.TB, materials ...*client.Material) map[string][]*jwt.UserClaims {
	t.Helper()
	out := map[string][]*jwt.UserClaims{}
	for _, m := range materials {
		for duty, c := range m.Credentials {
			uc, err := jwt.DecodeUserClaims(c.JWT)
			if err != nil {
				t.Fatalf("%s %s: %v", m.Operation, duty, err)
			}
			out[duty] = append(out[duty], uc)
		}
	}
	return out
}
