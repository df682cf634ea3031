package broker

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/cotal-ai/authplane/admin"
	"github.com/cotal-ai/authplane/integration/internal/harness"
	"github.com/cotal-ai/authplane/internal/testkit"
	"github.com/cotal-ai/authplane/service"
	"github.com/cotal-ai/authplane/subjects"
)

// One unscoped credential once opened 292 connections of 50 subscriptions each: every user
// the plane mints or `creds` writes carries subscription and payload limits, and the data
// account a connection limit, all enforced by the broker.
func TestTheBrokerEnforcesUserAndAccountLimits(t *testing.T) {
	t.Parallel()
	p := harness.StartPlane(t, func(c *service.Config) {
		c.MaxSubscriptions, c.MaxPayload, c.MaxConnections, c.ReservedConnections, c.MaxConnectionsPerPrincipal = 4, 2048, 6, 2, 4
	})
	harness.Grant(t, p, harness.OwnerA, "cli", "supervise")
	cli := harness.CallerConn(t, p, harness.OwnerA, "cli")
	m := harness.NewManagerKeys(t)
	prep, _ := harness.Registered(t, cli, harness.OwnerA, "cli", m)

	t.Run("a minted user past its subscriptions", func(t *testing.T) {
		errs := &harness.AsyncErrors{}
		nc := harness.DutyConn(t, p, m, harness.OwnerA, subjects.DutySupervisor, prep.Credentials["supervisor"].JWT, errs.Option())
		inbox := subjects.InboxPrefix(harness.OwnerA, subjects.SupervisorActor(m.Iid)) + ".x"
		for range 5 {
			if _, err := nc.SubscribeSync(inbox); err != nil {
				t.Fatal(err)
			}
		}
		if err := nc.Flush(); err != nil {
			t.Fatal(err)
		}
		testkit.CheckFor(t, 3*time.Second, 10*time.Millisecond, func() error {
			for _, err := range errs.All() {
				if strings.Contains(strings.ToLower(err.Error()), "maximum subscriptions") {
					return nil
				}
			}
			return fmt.Errorf("got %v, want a maximum subscriptions violation on the fifth", errs.All())
		})
	})

	t.Run("a minted user past its payload", func(t *testing.T) {
		nc := harness.DutyConn(t, p, m, harness.OwnerA, subjects.DutyExecutor, prep.Credentials["executor"].JWT)
		subject := subjects.EndpointSubject(harness.TestSpace, subjects.EndpointManagerAuthority, harness.OwnerA, subjects.ExecutorActor(m.Iid))
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
		o.Owner, o.Actor, o.TTL, o.MaxSubscriptions = harness.OwnerB, "few", time.Hour, 2
		path := t.TempDir() + "/few.creds"
		creds, err := admin.Creds(p.Keys(), o, time.Now())
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, creds, 0o600); err != nil {
			t.Fatal(err)
		}
		errs := &harness.AsyncErrors{}
		nc := harness.ConnectCreds(t, p.NATSURL(), path, harness.OwnerB, "few", errs.Option())
		for range 3 {
			if _, err := nc.SubscribeSync(subjects.InboxPrefix(harness.OwnerB, "few") + ".x"); err != nil {
				t.Fatal(err)
			}
		}
		if err := nc.Flush(); err != nil {
			t.Fatal(err)
		}
		testkit.CheckFor(t, 3*time.Second, 10*time.Millisecond, func() error {
			for _, err := range errs.All() {
				if strings.Contains(strings.ToLower(err.Error()), "maximum subscriptions") {
					return nil
				}
			}
			return fmt.Errorf("got %v, want a maximum subscriptions violation on the third", errs.All())
		})
	})

	t.Run("the data account past its connections", func(t *testing.T) {
		// The tenants' share is the account's 6 less the plane's reserve of 2; cli holds one of
		// it. Three connections of another credential fit; each one after is refused by the
		// broker (the account's limit) or kicked by the plane, during its handshake or after.
		// The three stay.
		path := harness.WriteCallerCreds(t, p.Keys(), harness.OwnerB, "many")
		var held []*nats.Conn
		for i := range 10 {
			closed := make(chan struct{})
			nc, err := nats.Connect(p.NATSURL(), nats.UserCredentials(path), nats.NoReconnect(),
				nats.ClosedHandler(func(*nats.Conn) { close(closed) }))
			switch {
			case i < 3 && err != nil:
				t.Fatalf("connection %d within the tenants' share: %v", i, err)
			case i < 3:
				t.Cleanup(nc.Close)
				held = append(held, nc)
				continue
			case err != nil:
				continue // the account's limit, or a kick that landed before the handshake ended
			}
			select {
			case <-closed:
			case <-time.After(10 * time.Second):
				nc.Close()
				t.Fatalf("connection %d past the tenants' share is still up after 10 s, want it kicked", i)
			}
		}
		for i, nc := range held {
			if !nc.IsConnected() {
				t.Errorf("connection %d within the tenants' share: got %s, want it up", i, nc.Status())
			}
		}
	})
}
