package broker

import (
	"testing"
	"time"

	"github.com/cotal-ai/authplane/admin"
	"github.com/cotal-ai/authplane/integration/internal/harness"
)

// A bearer asked for `ttlSec: 1` lives a second from when it is issued, on either face and
// either arm: a JWT's exp is whole seconds, and truncated it left the bearer a fraction of a
// second, often nothing by the time the reply arrived.
func TestAOneSecondBearerLivesASecond(t *testing.T) {
	t.Parallel()
	f := harness.StartFaces(t, nil)
	owner := harness.HumanOwner(t, f.TestPlane, f.Ip, "pia")
	harness.Grant(t, f.TestPlane, owner, "cli")
	for _, fc := range f.Faces() {
		t.Run(fc.Name, func(t *testing.T) {
			secret, _, err := admin.SetAgent(harness.GrantCtx(t), f.Keys(), f.NATSURL(), harness.OwnerA, "worker_"+fc.Name)
			if err != nil {
				t.Fatal(err)
			}
			for arm, body := range map[string]map[string]any{
				"human": {"idpToken": f.Token(t, "pia", time.Hour), "actor": "cli", "ttlSec": 1},
				"agent": {"owner": harness.OwnerA, "actor": "worker_" + fc.Name, "actorToken": secret, "ttlSec": 1},
			} {
				before := f.Clock.Now()
				e := harness.Exchange(t, fc.Url, body, fc.Auth...)
				if exp := time.Unix(e.Exp, 0); exp.Before(before.Add(time.Second)) {
					t.Errorf("%s ttlSec 1 asked at %s: got exp %s, want at least a second later", arm, before.Format(time.StampMilli), exp.Format(time.StampMilli))
				}
				_, c := harness.JwtParts(t, e.Token)
				if iat, exp := int64(c["iat"].(float64)), int64(c["exp"].(float64)); exp != e.Exp || exp-iat > 2 {
					t.Errorf("%s ttlSec 1: the bearer's iat %d exp %d, want the reply's exp %d, at most 2 s after iat", arm, iat, exp, e.Exp)
				}
			}
		})
	}
}
