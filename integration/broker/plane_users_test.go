package broker

import (
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/cotal-ai/authplane/integration/internal/harness"
	"github.com/cotal-ai/authplane/internal/testkit"
	"github.com/cotal-ai/authplane/service"
	"github.com/cotal-ai/authplane/subjects"
)

// TestPlaneRenewsItsOwnUsersBeforeTheyExpire: the plane's serving and store users live
// --plane-user-ttl and are renewed at two thirds of it, so the broker never has to cut them
// off, and the plane keeps serving past their first expiry. The serving side is renewed by a
// new connection whose services register before the old ones stop: callers renewing all the
// while never meet "no responders".
func TestPlaneRenewsItsOwnUsersBeforeTheyExpire(t *testing.T) {
	harness.Long(t, "waits out the plane's own users' life")
	t.Parallel()
	const ttl = 10 * time.Second
	logs := &harness.SyncBuffer{}
	start := time.Now()
	p := harness.StartPlane(t, func(c *service.Config) {
		c.PlaneUserTTL = ttl
		c.RequestTimeout = 2 * time.Second // a request in flight ends before a renewed user expires
		c.Rate = 0
		c.Logger = slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	})
	harness.Grant(t, p, harness.OwnerA, "cli", "supervise")
	cli := harness.CallerConn(t, p, harness.OwnerA, "cli")
	account := p.Keys().Data.Public()
	type manager struct {
		m   *harness.ManagerKeys
		act harness.Material
	}
	var managers []manager
	for range 16 {
		m := harness.NewManagerKeys(t)
		_, act := harness.Registered(t, cli, harness.OwnerA, "cli", m)
		managers = append(managers, manager{m, act})
	}
	m, act := managers[0].m, managers[0].act

	// Sixteen managers renew back to back from a little before the serving user's renewal (at
	// two thirds of its life) until after it: a moment with no responders would be met.
	stop, done := make(chan struct{}), make(chan []string, 16)
	time.Sleep(time.Until(start.Add(ttl * 2 / 3).Add(-time.Second)))
	for _, mg := range managers {
		m, act := mg.m, mg.act
		go func() {
			var failures []string
			for {
				select {
				case <-stop:
					done <- failures
					return
				default:
				}
				o := harness.AskAsync(cli, harness.OwnerA, "cli", subjects.EndpointManagerAuthority, harness.Renewal(m.Body(t, "renew", "cli"), act.NextRegistrationProof, account, 0))
				if o.Code != "" {
					failures = append(failures, o.Code+": "+o.Message)
				}
			}
		}()
	}

	// Both users renewed, and the first ones' expiry is behind us.
	testkit.CheckFor(t, ttl+10*time.Second, 200*time.Millisecond, func() error {
		out := logs.String()
		for _, renewed := range []string{`msg="renewed the serving user" conn=serving`, `msg="reconnected with a renewed user" conn=store`} {
			if !strings.Contains(out, renewed) {
				return fmt.Errorf("not yet in the log: %s", renewed)
			}
		}
		if time.Since(start) < ttl+time.Second {
			return fmt.Errorf("the first users expire at %s", start.Add(ttl).Format(time.TimeOnly))
		}
		return nil
	})
	close(stop)
	var failures []string
	for range 16 {
		failures = append(failures, <-done...)
	}
	if len(failures) > 0 {
		for _, line := range strings.Split(logs.String(), "\n") {
			if strings.Contains(line, "level=WARN") || strings.Contains(line, "level=ERROR") {
				t.Log(line)
			}
		}
		t.Fatalf("renewals during the plane's own renewals: got %d failures, want none: %v", len(failures), failures[:min(len(failures), 5)])
	}
	if out := logs.String(); strings.Contains(strings.ToLower(out), "expired") {
		t.Fatalf("the broker cut off an expired plane user:\n%s", out)
	}
	families := harness.Scrape(t, p.HTTPURL())
	for _, conn := range []string{"serving", "store"} {
		if n := harness.Sample(families, "authplane_nats_reconnects_total", map[string]string{"conn": conn}); n != 0 {
			t.Errorf("/metrics reconnects of the %s connection: got %v, want 0 (a renewal is not a lost connection)", conn, n)
		}
	}
	o := harness.Ask(t, cli, harness.OwnerA, "cli", subjects.EndpointManagerAuthority, harness.Renewal(m.Body(t, "renew", "cli"), act.NextRegistrationProof, account, 0))
	if o.Code != "" {
		t.Fatalf("renew after the first users expired: got %s %q", o.Code, o.Message)
	}
}
