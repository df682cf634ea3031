package flows

import (
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/cotal-ai/authplane/admin"
	"github.com/cotal-ai/authplane/integration/internal/harness"
	"github.com/cotal-ai/authplane/internal/core/fault"
	"github.com/cotal-ai/authplane/internal/testkit"
	"github.com/cotal-ai/authplane/subjects"
)

// After `authplane agent --revoke`, a connection opened with the old bearer must not stay up
// until the bearer's exp (up to 300 s). The revoke kicks every live
// connection of the agent (a kick: its users are the callout's) and the callout refuses
// it again; another agent of the same owner keeps its connection.
func TestAgentRevokeClosesItsLiveConnections(t *testing.T) {
	t.Parallel()
	ip := testkit.NewIdP(t)
	p := harness.StartFacesPlane(t, ip, nil)
	b := harness.FetchBundle(t, p.PublicURL())

	secret, _, err := admin.SetAgent(harness.GrantCtx(t), p.Keys(), p.NATSURL(), harness.OwnerA, "worker")
	if err != nil {
		t.Fatal(err)
	}
	var conns []*nats.Conn
	// Two bearers of the same secret (it is reusable: an agent exchanges it for each bearer),
	// one connection on the first and two on the second.
	for _, n := range []int{1, 2} {
		token := harness.Exchange(t, p.PublicURL(), map[string]any{"owner": harness.OwnerA, "actor": "worker", "actorToken": secret}).Token
		for range n {
			nc, err := harness.BearerConnect(t, b, token, harness.OwnerA, "worker")
			if err != nil {
				t.Fatalf("the agent's bearer: %v", err)
			}
			conns = append(conns, nc)
		}
	}
	// One that reconnects on its own: the callout refuses it again.
	token := harness.Exchange(t, p.PublicURL(), map[string]any{"owner": harness.OwnerA, "actor": "worker", "actorToken": secret}).Token
	var reconnected atomic.Int64
	again, err := harness.BearerConnect(t, b, token, harness.OwnerA, "worker", nats.MaxReconnects(-1), nats.ReconnectWait(20*time.Millisecond),
		nats.ReconnectHandler(func(*nats.Conn) { reconnected.Add(1) }))
	if err != nil {
		t.Fatalf("the agent's bearer: %v", err)
	}
	other, err := harness.BearerConnect(t, b, harness.AgentBearer(t, p, harness.OwnerA, "other"), harness.OwnerA, "other")
	if err != nil {
		t.Fatal(err)
	}

	revoked, err := admin.RevokeAgent(harness.GrantCtx(t), p.Keys(), p.NATSURL(), harness.OwnerA, "worker")
	if err != nil {
		t.Fatal(err)
	}
	if revoked.Closed != 4 {
		t.Errorf("the revoke closed %d connections, want the agent's 4", revoked.Closed)
	}
	// The revoke returns once the broker lists none of the agent's connections.
	for i, nc := range conns {
		if !nc.IsClosed() {
			testkit.CheckFor(t, time.Second, 10*time.Millisecond, func() error {
				if !nc.IsClosed() {
					return fmt.Errorf("the agent's connection %d is %s after its revoke, want it closed", i, nc.Status())
				}
				return nil
			})
		}
	}
	if again.IsConnected() {
		t.Errorf("the agent's reconnecting connection: got %s after the revoke, want it cut off", again.Status())
	}
	if n := reconnected.Load(); n != 0 {
		t.Errorf("the agent's connection reconnected %d times after its revoke, want the callout to refuse it", n)
	}
	if !other.IsConnected() {
		t.Errorf("another agent of the same owner: got %s, want it still connected", other.Status())
	}
	if nc, err := harness.BearerConnect(t, b, token, harness.OwnerA, "worker"); err == nil {
		nc.Close()
		t.Error("a revoked agent's bearer connected again, want the callout to refuse it")
	}
}

// A revoke that revokes nothing must not look like success: a revoke of a principal that holds
// no agent secret (no row; a row that was never an agent's; an agent revoked already) with no
// live connection is not-found, exits non-zero, and writes nothing.
func TestRevokingNoAgentIsNotFoundAndWritesNothing(t *testing.T) {
	t.Parallel()
	harness.Long(t, "waits out a revoke's window")
	p := harness.StartPlane(t, nil)
	harness.Grant(t, p, harness.OwnerA, "scoped", "supervise")
	secret, _, err := admin.SetAgent(harness.GrantCtx(t), p.Keys(), p.NATSURL(), harness.OwnerA, "worker")
	if err != nil || secret == "" {
		t.Fatal(err)
	}
	if r, err := admin.RevokeAgent(harness.GrantCtx(t), p.Keys(), p.NATSURL(), harness.OwnerA, "worker"); err != nil || r.Already {
		t.Fatalf("the first revoke of an agent: got %+v, %v; want it revoked", r, err)
	}
	kv, err := p.JS(t).KeyValue(harness.GrantCtx(t), subjects.ActorsBucket(harness.TestSpace))
	if err != nil {
		t.Fatal(err)
	}
	revision := func(actor string) uint64 {
		e, err := kv.Get(harness.GrantCtx(t), subjects.ActorKey(harness.OwnerA, actor))
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			return 0
		}
		if err != nil {
			t.Fatal(err)
		}
		return e.Revision()
	}
	for _, actor := range []string{"nosuch", "scoped", "worker"} {
		before := revision(actor)
		_, err := admin.RevokeAgent(harness.GrantCtx(t), p.Keys(), p.NATSURL(), harness.OwnerA, actor)
		if !errors.Is(err, admin.ErrNoAgent) || fault.CodeOf(err) != fault.NotFound {
			t.Errorf("revoke %s: got %v, want not-found (%v)", actor, err, admin.ErrNoAgent)
		}
		code, stdout, stderr := harness.RunAuthplane(t, 30*time.Second, "agent", "--revoke", "--owner", harness.OwnerA, "--actor", actor,
			"--space-dir", p.Info.SpaceDir, "--nats-url", p.NATSURL())
		if code != 1 || stdout != "" || !strings.Contains(stderr, "not-found") || !strings.Contains(stderr, "nothing was revoked") {
			t.Errorf("authplane agent --revoke of %s: got exit %d, stdout %q, stderr %q; want 1, nothing on stdout, not-found", actor, code, stdout, stderr)
		}
		if after := revision(actor); after != before {
			t.Errorf("revoke %s: its ledger row went from revision %d to %d, want nothing written", actor, before, after)
		}
	}
}
