package broker

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nkeys"

	"github.com/cotal-ai/authplane/admin"
	"github.com/cotal-ai/authplane/client"
	"github.com/cotal-ai/authplane/handlers"
	"github.com/cotal-ai/authplane/integration/internal/harness"
	"github.com/cotal-ai/authplane/internal/capability/manager"
	"github.com/cotal-ai/authplane/internal/core/audit"
	"github.com/cotal-ai/authplane/internal/platform/broker"
	"github.com/cotal-ai/authplane/internal/testkit"
	"github.com/cotal-ai/authplane/service"
	"github.com/cotal-ai/authplane/subjects"
)

// A client that knows only the bundle's URL and holds an IdP token fetches the bundle,
// exchanges the token for a bearer, connects through the auth callout, and may do what a caller
// may: call the plane and publish its own run-starts; nothing else. When its bearer expires
// the broker cuts it off, and the bearer no longer connects.
func TestBundleExchangeConnectExpire(t *testing.T) {
	t.Parallel()
	ip := testkit.NewIdP(t)
	p := harness.StartFacesPlane(t, ip, nil)
	owner := harness.HumanOwner(t, p, ip, "alice@example.com")
	harness.Grant(t, p, owner, "cli")

	b := harness.FetchBundle(t, p.PublicURL())
	if b.Space != harness.TestSpace || b.Server != p.NATSURL() || b.UserAuth.Provider != "cotal" ||
		b.UserAuth.Endpoints.URL != p.PublicURL() || b.UserAuth.Endpoints.ManagerAuthorityURL != p.PublicURL()+"/manager-service-authority" ||
		b.UserAuth.IdP.Issuer != ip.Issuer || b.UserAuth.IdP.Audience != ip.Audience || b.UserAuth.IdP.URL != ip.Server.URL {
		t.Fatalf("bundle: got %+v", b)
	}

	ex := harness.Exchange(t, b.UserAuth.Endpoints.URL, map[string]any{"idpToken": ip.Token(t, ip.Claims("alice@example.com", time.Hour)), "actor": "cli", "ttlSec": 3})
	if ex.Owner != owner {
		t.Fatalf("exchange: got owner %q, want %q", ex.Owner, owner)
	}
	if left := time.Until(time.Unix(ex.Exp, 0)); left > 4*time.Second || left < 0 {
		t.Fatalf("exchange: exp %d is %s away, want the 3 s asked for", ex.Exp, left)
	}

	var errs harness.AsyncErrors
	closed := make(chan struct{})
	nc, err := harness.BearerConnect(t, b, ex.Token, owner, "cli", errs.Option(), nats.ClosedHandler(func(*nats.Conn) { close(closed) }))
	if err != nil {
		t.Fatalf("connect with the bearer: %v", err)
	}
	// Allowed: a call to the plane as itself, answered in its own inbox.
	cl, err := client.New(nc, harness.TestSpace, owner, "cli")
	if err != nil {
		t.Fatal(err)
	}
	_, err = cl.Do(t.Context(), subjects.EndpointManagerAuthority, map[string]any{"kind": "nonsense"})
	var refusal *client.Refusal
	if !errors.As(err, &refusal) || refusal.Code != "bad-request" {
		t.Fatalf("a call to the plane over the callout's connection: got %v, want the plane's bad-request refusal", err)
	}
	// Refused: another principal's subjects, and anything outside the caller's rail.
	other := "cotal." + harness.TestSpace + ".auth.manager-authority." + harness.OwnerB + ".cli"
	if err := nc.Publish(other, []byte("{}")); err != nil {
		t.Fatal(err)
	}
	errs.WaitViolation(t, "Publish", other)
	if _, err := nc.SubscribeSync("cotal.>"); err != nil {
		t.Fatal(err)
	}
	errs.WaitViolation(t, "Subscription", "cotal.>")

	// The user expires with the bearer: the broker closes the connection, and the bearer
	// connects no more.
	select {
	case <-closed:
	case <-time.After(10 * time.Second):
		t.Fatalf("the connection outlived its bearer (exp %d, now %d)", ex.Exp, time.Now().Unix())
	}
	if nc, err := harness.BearerConnect(t, b, ex.Token, owner, "cli"); err == nil {
		nc.Close()
		t.Fatal("an expired bearer connected, want it refused")
	} else if !errors.Is(err, nats.ErrAuthorization) && !strings.Contains(strings.ToLower(err.Error()), "authorization") {
		t.Fatalf("an expired bearer: got %v, want an authorization violation", err)
	}
}

// The callout refuses every bearer it should not honour: none, garbage, another space's or a
// forged one, a principal whose row is gone, an agent revoked after its exchange; and a
// refused connection is recorded, not minted.
func TestCalloutRefusesBadBearers(t *testing.T) {
	t.Parallel()
	ip := testkit.NewIdP(t)
	p := harness.StartFacesPlane(t, ip, nil)
	b := harness.FetchBundle(t, p.PublicURL())

	// An agent exchanges, then is revoked: its bearer no longer connects.
	secret, _, err := admin.SetAgent(harness.GrantCtx(t), p.Keys(), p.NATSURL(), harness.OwnerA, "worker")
	if err != nil {
		t.Fatal(err)
	}
	agent := harness.Exchange(t, p.PublicURL(), map[string]any{"owner": harness.OwnerA, "actor": "worker", "actorToken": secret})
	nc, err := harness.BearerConnect(t, b, agent.Token, harness.OwnerA, "worker")
	if err != nil {
		t.Fatalf("the agent's bearer: %v", err)
	}
	nc.Close()
	if _, err := admin.RevokeAgent(harness.GrantCtx(t), p.Keys(), p.NATSURL(), harness.OwnerA, "worker"); err != nil {
		t.Fatal(err)
	}
	if r := harness.Post(t, p.PublicURL()+"/exchange", map[string]any{"owner": harness.OwnerA, "actor": "worker", "actorToken": secret}); r.Status != http.StatusUnauthorized {
		t.Errorf("a revoked agent's exchange: got %d %s, want 401", r.Status, r.Body)
	}

	// A plane bearer of another space: signed with a key this space does not publish.
	human := harness.HumanOwner(t, p, ip, "bob")
	harness.Grant(t, p, human, "cli", "admin")
	good := harness.Exchange(t, p.PublicURL(), map[string]any{"idpToken": ip.Token(t, ip.Claims("bob", time.Hour)), "actor": "cli"})

	for _, tt := range []struct {
		name, token string
	}{
		{"no token", ""},
		{"garbage", "not-a-bearer"},
		{"an IdP token", ip.Token(t, ip.Claims("bob", time.Hour))},
		{"a revoked agent's bearer", agent.Token},
		{"a bearer with a forged signature", good.Token[:len(good.Token)-6] + "AAAAAA"},
		{"an oversized token", strings.Repeat("a", 9000)},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if nc, err := harness.BearerConnect(t, b, tt.token, human, "cli"); err == nil {
				nc.Close()
				t.Fatalf("connected, want the callout to refuse")
			}
		})
	}
	// The good one still connects: the refusals were the tokens', not the plane's.
	nc, err = harness.BearerConnect(t, b, good.Token, human, "cli")
	if err != nil {
		t.Fatalf("a good bearer after the refusals: %v", err)
	}
	nc.Close()
}

// Every connection the callout makes is on record in `minted` (under no instance), and an ops
// bearer — loopback only, for an admin — connects as an operator who may discover the service.
func TestCalloutRecordsAndOpsView(t *testing.T) {
	t.Parallel()
	ip := testkit.NewIdP(t)
	var dir string
	p := harness.StartFacesPlane(t, ip, func(c *service.Config) { dir = c.Dir })
	owner := harness.HumanOwner(t, p, ip, "carol")
	harness.Grant(t, p, owner, "ops", manager.Admin)
	b := harness.FetchBundle(t, p.PublicURL())

	body := map[string]any{"idpToken": ip.Token(t, ip.Claims("carol", time.Hour)), "actor": "ops", "view": "ops"}
	if r := harness.Post(t, p.PublicURL()+"/exchange", body); r.Status != http.StatusForbidden || r.Code() != "permission-denied" {
		t.Fatalf("an ops view on the public face: got %d %s, want 403 permission-denied", r.Status, r.Body)
	}
	ex := harness.Exchange(t, p.HTTPURL(), body, harness.CapHeader(t, dir)...)
	nc, err := harness.BearerConnect(t, b, ex.Token, owner, "ops")
	if err != nil {
		t.Fatalf("connect with an ops bearer: %v", err)
	}
	if _, err := nc.Request("$SRV.PING."+subjects.ServiceName, nil, 5*time.Second); err != nil {
		t.Fatalf("an ops connection pings the service: %v", err)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	st, err := p.JS(t).Stream(ctx, subjects.MintedStream(harness.TestSpace))
	if err != nil {
		t.Fatal(err)
	}
	info, err := st.Info(ctx, jetstream.WithSubjectFilter(subjects.MintedInstanceFilter(harness.TestSpace, subjects.NoInstance)))
	if err != nil {
		t.Fatal(err)
	}
	if len(info.State.Subjects) != 1 {
		t.Fatalf("minted records under no instance: got %v, want the one connection's", info.State.Subjects)
	}
	for subject := range info.State.Subjects {
		var rec audit.Minted
		harness.ReadRecord(t, p, subjects.MintedStream(harness.TestSpace), subject, &rec)
		if rec.Endpoint != handlers.EndpointCallout || rec.Caller != subjects.Principal(owner, "ops") || len(rec.Credentials) != 1 ||
			rec.Credentials[0].Duty != string(subjects.DutyOps) || rec.Credentials[0].Exp != ex.Exp || subject != subjects.MintedSubject(harness.TestSpace, "", []string{rec.Credentials[0].NKey}) {
			t.Errorf("the connection's minted record on %s: got %+v, want auth-callout, %s, one ops credential of exp %d, on its key's subject", subject, rec, subjects.Principal(owner, "ops"), ex.Exp)
		}
	}
}

// The user the callout mints commits on its principal's ledger row as read: an agent revoked
// between the check and the commit gets no connection, and the mint is recorded discarded.
func TestCalloutCommitsOnTheLedgerRow(t *testing.T) {
	t.Parallel()
	ip := testkit.NewIdP(t)
	var armed atomic.Bool
	reached, release := make(chan struct{}), make(chan struct{})
	p := harness.StartFacesPlane(t, ip, func(c *service.Config) {
		c.Hooks = &service.Hooks{BeforeCommit: func() {
			if armed.CompareAndSwap(true, false) {
				close(reached)
				<-release
			}
		}}
	})
	b := harness.FetchBundle(t, p.PublicURL())
	secret, _, err := admin.SetAgent(harness.GrantCtx(t), p.Keys(), p.NATSURL(), harness.OwnerA, "racer")
	if err != nil {
		t.Fatal(err)
	}
	ex := harness.Exchange(t, p.PublicURL(), map[string]any{"owner": harness.OwnerA, "actor": "racer", "actorToken": secret})

	armed.Store(true)
	connected := make(chan error, 1)
	go func() {
		nc, err := harness.BearerConnect(t, b, ex.Token, harness.OwnerA, "racer")
		if err == nil {
			nc.Close()
		}
		connected <- err
	}()
	select {
	case <-reached:
	case <-time.After(5 * time.Second):
		t.Fatal("the callout's mint never reached its commit")
	}
	// The revoke writes the row, then keeps kicking the agent's connections for a while: the
	// mint commits as soon as the row is written.
	revoked := make(chan error, 1)
	go func() {
		_, err := admin.RevokeAgent(harness.GrantCtx(t), p.Keys(), p.NATSURL(), harness.OwnerA, "racer")
		revoked <- err
	}()
	bucket := subjects.ActorsBucket(harness.TestSpace)
	testkit.CheckFor(t, 5*time.Second, 10*time.Millisecond, func() error {
		m, err := harness.LastMsg(t, p, bucket, "$KV."+bucket+"."+subjects.ActorKey(harness.OwnerA, "racer"))
		if err != nil || strings.Contains(string(m.Data), "tokenHash") {
			return fmt.Errorf("the agent's row is not revoked yet (%v)", err)
		}
		return nil
	})
	close(release)
	if err := <-revoked; err != nil {
		t.Fatal(err)
	}
	if err := <-connected; err == nil {
		t.Fatal("an agent revoked before the callout's commit connected, want it refused")
	}
	var rec audit.Decision
	harness.ReadRecord(t, p, subjects.AuditStream(harness.TestSpace), subjects.AuditSubject(harness.TestSpace, "discarded", harness.OwnerA, "racer"), &rec)
	if rec.Endpoint != handlers.EndpointCallout || rec.Code != "conflict" {
		t.Errorf("the discarded record: got %+v, want auth-callout, conflict", rec)
	}
	if v := harness.Sample(harness.Scrape(t, p.HTTPURL()), "authplane_mints_discarded_total", map[string]string{"endpoint": handlers.EndpointCallout, "code": "conflict"}); v != 1 {
		t.Errorf("/metrics discarded callout mints: got %v, want 1", v)
	}
}

// Two replicas of one space share the bearer keys through the store: a bearer one issues
// connects whichever replica's callout answers, a rotation made through either is what both
// publish and sign with, and the old bearer still connects until its key is retired.
func TestReplicasShareTheBearerKeysAndTheCallout(t *testing.T) {
	t.Parallel()
	s := harness.StartStandalone(t, harness.TestSpace)
	ip := testkit.NewIdP(t)
	a := harness.StartFacesPlane(t, ip, harness.AgainstStandalone(s))
	b := harness.StartFacesPlane(t, ip, harness.AgainstStandalone(s))
	owner := harness.HumanOwner(t, a, ip, "dana")
	harness.Grant(t, a, owner, "cli")
	bun := harness.FetchBundle(t, b.PublicURL())
	token := func(p *harness.TestPlane) string {
		return harness.Exchange(t, p.PublicURL(), map[string]any{"idpToken": ip.Token(t, ip.Claims("dana", time.Hour)), "actor": "cli"}).Token
	}
	old := token(a)
	// The broker asks one callout replica per connection, at random: of twenty, each replica
	// answers some (all twenty to one has odds of one in half a million).
	for i := range 20 {
		nc, err := harness.BearerConnect(t, bun, old, owner, "cli")
		if err != nil {
			t.Fatalf("connection %d with replica A's bearer: %v", i, err)
		}
		nc.Close()
	}
	served := map[string]string{"endpoint": handlers.EndpointCallout, "code": "ok"}
	na, nb := harness.Sample(harness.Scrape(t, a.HTTPURL()), "authplane_requests_total", served), harness.Sample(harness.Scrape(t, b.HTTPURL()), "authplane_requests_total", served)
	if na+nb != 20 || na == 0 || nb == 0 {
		t.Errorf("connections each replica's callout served: got %v and %v, want 20 between both, some each", na, nb)
	}

	keys, done, err := admin.BearerKeys(harness.GrantCtx(t), a.Keys(), s.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer done()
	kid, err := keys.Rotate(harness.GrantCtx(t))
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range []*harness.TestPlane{a, b} {
		if jwks := harness.Get(t, p.PublicURL()+"/jwks"); !strings.Contains(string(jwks.Body), kid) {
			t.Errorf("a replica's /jwks after the rotation: %s, want kid %s", jwks.Body, kid)
		}
		fresh := token(p)
		if h, _ := harness.JwtParts(t, fresh); h["kid"] != kid {
			t.Errorf("a replica's bearer after the rotation: kid %v, want %s", h["kid"], kid)
		}
		nc, err := harness.BearerConnect(t, bun, fresh, owner, "cli")
		if err != nil {
			t.Fatalf("a bearer of the new key: %v", err)
		}
		nc.Close()
	}
	nc, err := harness.BearerConnect(t, bun, old, owner, "cli")
	if err != nil {
		t.Fatalf("a bearer of the old key, not yet retired: %v", err)
	}
	nc.Close()
}

// The servers' `user` filter lists the auth callout's connection of a principal, and also
// every JWT user that sent that principal as its user name: here three of them, connected
// first, fill a page of two and a half. The listing of the callout's connections still finds
// the agent's one, on the second page, and only it; and revoking the agent closes it. (The
// listing once read one page: past 1,024 such connections on a server, an agent's revoke
// kicked nothing and reported every connection of it closed.)
func TestCalloutConnectionsAreFoundBehindPagesOfOthersThatSentTheirName(t *testing.T) {
	t.Parallel()
	ip := testkit.NewIdP(t)
	p := harness.StartFacesPlane(t, ip, nil)
	b := harness.FetchBundle(t, p.PublicURL())
	principal := subjects.Principal(harness.OwnerA, "worker")
	for i := range 3 {
		kp, err := nkeys.CreateUser()
		if err != nil {
			t.Fatal(err)
		}
		harness.ConnectSendingName(t, p, kp, subjects.Principal(harness.OwnerB, fmt.Sprintf("crowd%d", i)), principal)
	}
	secret, _, err := admin.SetAgent(harness.GrantCtx(t), p.Keys(), p.NATSURL(), harness.OwnerA, "worker")
	if err != nil {
		t.Fatal(err)
	}
	agent := harness.Exchange(t, p.PublicURL(), map[string]any{"owner": harness.OwnerA, "actor": "worker", "actorToken": secret})
	closed := make(chan struct{})
	nc, err := harness.BearerConnect(t, b, agent.Token, harness.OwnerA, "worker", nats.ClosedHandler(func(*nats.Conn) { close(closed) }), nats.MaxReconnects(0))
	if err != nil {
		t.Fatalf("the agent's bearer: %v", err)
	}
	defer nc.Close()
	cid, err := nc.GetClientID()
	if err != nil {
		t.Fatal(err)
	}

	acct := broker.Account{NC: harness.SystemConn(t, p), Public: p.Account(), Page: 2}
	live, err := acct.CalloutConnections(harness.GrantCtx(t), principal, 1)
	if err != nil {
		t.Fatal(err)
	}
	if len(live) != 1 || live[0].CID != cid || !live[0].Callout || live[0].Principal != principal {
		t.Fatalf("the callout's connections of %s, a page of two at a time: got %+v, want the agent's (cid %d) alone", principal, live, cid)
	}
	if _, err := admin.RevokeAgent(harness.GrantCtx(t), p.Keys(), p.NATSURL(), harness.OwnerA, "worker"); err != nil {
		t.Fatal(err)
	}
	select {
	case <-closed:
	case <-time.After(5 * time.Second):
		t.Fatal("the revoked agent's connection is still open")
	}
}
