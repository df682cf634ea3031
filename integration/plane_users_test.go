package integration

import (
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/cotal-ai/authplane/service"
	"github.com/cotal-ai/authplane/subjects"
)

// TestPlaneRenewsItsOwnUsersBeforeTheyExpire: the plane's serving and store users live
// --plane-user-ttl and are renewed at two thirds of it, so the broker never has to cut them
// off, and the plane keeps serving past their first expiry.
func TestPlaneRenewsItsOwnUsersBeforeTheyExpire(t *testing.T) {
	t.Parallel()
	const ttl = 10 * time.Second
	logs := &syncBuffer{}
	start := time.Now()
	p := startPlane(t, func(c *service.Config) {
		c.PlaneUserTTL = ttl
		c.Logger = slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	})
	grant(t, p, ownerA, "cli", "supervise")
	cli := callerConn(t, p, ownerA, "cli")
	account := p.Keys().Data.Public()
	m := newManagerKeys(t)
	_, act := registered(t, cli, ownerA, "cli", m)

	// Both users renewed, and the first ones' expiry is behind us.
	checkFor(t, ttl+10*time.Second, 200*time.Millisecond, func() error {
		out := logs.String()
		for _, conn := range []string{"conn=serving", "conn=store"} {
			if !strings.Contains(out, `msg="reconnected to NATS" `+conn) {
				return fmt.Errorf("the %s user has not been renewed yet", conn)
			}
		}
		if time.Since(start) < ttl+time.Second {
			return fmt.Errorf("the first users expire at %s", start.Add(ttl).Format(time.TimeOnly))
		}
		return nil
	})
	if out := logs.String(); strings.Contains(strings.ToLower(out), "expired") {
		t.Fatalf("the broker cut off an expired plane user:\n%s", out)
	}
	o := ask(t, cli, ownerA, "cli", subjects.EndpointManagerAuthority, renewal(m.body(t, "renew", "cli"), act.NextRegistrationProof, account, 0))
	if o.code != "" {
		t.Fatalf("renew after the first users expired: got %s %q", o.code, o.message)
	}
}
