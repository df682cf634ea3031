package integration

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/cotal-ai/authplane/admin"
	"github.com/cotal-ai/authplane/service"
	"github.com/cotal-ai/authplane/subjects"
)

// One unscoped credential once opened 292 connections of 50 subscriptions each: every user
// the plane mints or `creds` writes carries subscription and payload limits, and the data
// account a connection limit, all enforced by the broker.
func TestTheBrokerEnforcesUserAndAccountLimits(t *testing.T) {
	t.Parallel()
	p := startPlane(t, func(c *service.Config) {
		c.MaxSubscriptions, c.MaxPayload, c.MaxConnections = 4, 2048, 6
	})
	grant(t, p, ownerA, "cli", "supervise")
	cli := callerConn(t, p, ownerA, "cli")
	m := newManagerKeys(t)
	prep, _ := registered(t, cli, ownerA, "cli", m)

	t.Run("a minted user past its subscriptions", func(t *testing.T) {
		errs := &asyncErrors{}
		nc := dutyConn(t, p, m, ownerA, subjects.DutySupervisor, prep.Credentials["supervisor"].JWT, errs.option())
		inbox := subjects.InboxPrefix(ownerA, subjects.SupervisorActor(m.iid)) + ".x"
		for range 5 {
			if _, err := nc.SubscribeSync(inbox); err != nil {
				t.Fatal(err)
			}
		}
		if err := nc.Flush(); err != nil {
			t.Fatal(err)
		}
		checkFor(t, 3*time.Second, 10*time.Millisecond, func() error {
			for _, err := range errs.all() {
				if strings.Contains(strings.ToLower(err.Error()), "maximum subscriptions") {
					return nil
				}
			}
			return fmt.Errorf("got %v, want a maximum subscriptions violation on the fifth", errs.all())
		})
	})

	t.Run("a minted user past its payload", func(t *testing.T) {
		nc := dutyConn(t, p, m, ownerA, subjects.DutyExecutor, prep.Credentials["executor"].JWT)
		subject := subjects.EndpointSubject(testSpace, subjects.EndpointManagerAuthority, ownerA, subjects.ExecutorActor(m.iid))
		if err := nc.Publish(subject, make([]byte, 2048)); err != nil {
			t.Fatalf("a payload at the limit: %v", err)
		}
		if err := nc.Flush(); err != nil {
			t.Fatalf("a payload at the limit: %v", err)
		}
		// The broker tells the connection the user's limit (and closes one that ignores it).
		if got := nc.MaxPayload(); got != 2048 {
			t.Fatalf("the broker's max_payload for the user: got %d, want 2048", got)
		}
		if err := nc.Publish(subject, make([]byte, 4096)); !errors.Is(err, nats.ErrMaxPayload) {
			t.Fatalf("a 4 KiB publish against a 2 KiB limit: got %v, want nats.ErrMaxPayload", err)
		}
	})

	t.Run("a creds user past its subscriptions", func(t *testing.T) {
		o := admin.DefaultCreds()
		o.Owner, o.Actor, o.TTL, o.MaxSubscriptions = ownerB, "few", time.Hour, 2
		path := t.TempDir() + "/few.creds"
		if err := admin.WriteCreds(path, p.Keys(), o, time.Now()); err != nil {
			t.Fatal(err)
		}
		errs := &asyncErrors{}
		nc := connectCreds(t, p.NATSURL(), path, ownerB, "few", errs.option())
		for range 3 {
			if _, err := nc.SubscribeSync(subjects.InboxPrefix(ownerB, "few") + ".x"); err != nil {
				t.Fatal(err)
			}
		}
		if err := nc.Flush(); err != nil {
			t.Fatal(err)
		}
		checkFor(t, 3*time.Second, 10*time.Millisecond, func() error {
			for _, err := range errs.all() {
				if strings.Contains(strings.ToLower(err.Error()), "maximum subscriptions") {
					return nil
				}
			}
			return fmt.Errorf("got %v, want a maximum subscriptions violation on the third", errs.all())
		})
	})

	t.Run("the data account past its connections", func(t *testing.T) {
		path := writeCallerCreds(t, p.Keys(), ownerB, "many")
		var refused error
		opened := 0
		for range 10 {
			nc, err := nats.Connect(p.NATSURL(), nats.UserCredentials(path), nats.MaxReconnects(0))
			if err != nil {
				refused = err
				break
			}
			t.Cleanup(nc.Close)
			opened++
		}
		if refused == nil || !strings.Contains(strings.ToLower(refused.Error()), "maximum account active connections") {
			t.Fatalf("after %d more connections: got %v, want the account's limit of 6 to refuse one", opened, refused)
		}
		if opened >= 6 {
			t.Fatalf("opened %d more connections beside the plane's and the test's, want fewer than the limit of 6", opened)
		}
	})
}
