package faces

import (
	"net/http"
	"strings"
	"testing"

	"github.com/cotal-ai/authplane/integration/internal/harness"
	"github.com/cotal-ai/authplane/internal/testkit"
)

// An exchange body that misses a field is refused bad-request naming what is missing, for the
// arm the body is closest to: an agent's (it names an owner) or a person's (an IdP token): an
// agent told to send an idpToken has none to send.
func TestAnExchangeMissingAFieldIsToldWhichOne(t *testing.T) {
	t.Parallel()
	ip := testkit.NewIdP(t)
	p := harness.StartFacesPlane(t, ip, nil)
	token := ip.Token(t, ip.Claims("alice", 0))
	for _, c := range []struct {
		name string
		body map[string]any
		want string
	}{
		{"an agent's without its secret", map[string]any{"owner": harness.OwnerA, "actor": "worker"}, "agent exchange is missing actorToken"},
		{"an agent's without its owner", map[string]any{"actor": "worker", "actorToken": "s"}, "agent exchange is missing owner:"},
		{"an agent's with its secret alone", map[string]any{"actorToken": "s"}, "agent exchange is missing owner and actor:"},
		{"a person's without its actor", map[string]any{"idpToken": token}, "human exchange is missing actor:"},
		{"a person's naming an owner", map[string]any{"idpToken": token, "actor": "cli", "owner": harness.OwnerA}, "human exchange takes no owner"},
		{"neither", map[string]any{"actor": "cli"}, "exchange is missing idpToken (a person's"},
	} {
		r := harness.Post(t, p.PublicURL()+"/exchange", c.body)
		if r.Status != http.StatusBadRequest || r.Code() != "bad-request" || !strings.HasPrefix(r.Field("error"), c.want) {
			t.Errorf("%s: got %d %s, want 400 bad-request beginning %q", c.name, r.Status, r.Body, c.want)
		}
	}
}
