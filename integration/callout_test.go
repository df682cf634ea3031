package integration

import (
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/cotal-ai/authplane/admin"
	"github.com/cotal-ai/authplane/client"
	"github.com/cotal-ai/authplane/internal/idp/idptest"
	"github.com/cotal-ai/authplane/subjects"
)

// A client that knows only the bundle's URL and holds an IdP token fetches the bundle,
// exchanges the token for a bearer, connects through the auth callout, and may do what a caller
// may: call the plane and publish its own run-starts; nothing else. When its bearer expires
// the broker cuts it off, and the bearer no longer connects.
func TestBundleExchangeConnectExpire(t *testing.T) {
	t.Parallel()
	ip := idptest.New(t)
	p := startFacesPlane(t, ip, nil)
	owner := humanOwner(t, p, ip, "alice@example.com")
	grant(t, p, owner, "cli")

	b := fetchBundle(t, p.PublicURL())
	if b.Space != testSpace || b.Server != p.NATSURL() || b.UserAuth.Provider != "cotal" ||
		b.UserAuth.Endpoints.URL != p.PublicURL() || b.UserAuth.Endpoints.ManagerAuthorityURL != p.PublicURL()+"/manager-service-authority" ||
		b.UserAuth.IdP.Issuer != ip.Issuer || b.UserAuth.IdP.Audience != ip.Audience || b.UserAuth.IdP.URL != ip.Server.URL {
		t.Fatalf("bundle: got %+v", b)
	}

	ex := exchange(t, b.UserAuth.Endpoints.URL, map[string]any{"idpToken": ip.Token(t, ip.Claims("alice@example.com", time.Hour)), "actor": "cli", "ttlSec": 3})
	if ex.Owner != owner {
		t.Fatalf("exchange: got owner %q, want %q", ex.Owner, owner)
	}
	if left := time.Until(time.Unix(ex.Exp, 0)); left > 4*time.Second || left < 0 {
		t.Fatalf("exchange: exp %d is %s away, want the 3 s asked for", ex.Exp, left)
	}

	var errs asyncErrors
	closed := make(chan struct{})
	nc, err := bearerConnect(t, b, ex.Token, owner, "cli", errs.option(), nats.ClosedHandler(func(*nats.Conn) { close(closed) }))
	if err != nil {
		t.Fatalf("connect with the bearer: %v", err)
	}
	// Allowed: a call to the plane as itself, answered in its own inbox.
	cl, err := client.New(nc, testSpace, owner, "cli")
	if err != nil {
		t.Fatal(err)
	}
	_, err = cl.Do(t.Context(), subjects.EndpointManagerAuthority, map[string]any{"kind": "nonsense"})
	var refusal *client.Refusal
	if !errors.As(err, &refusal) || refusal.Code != "bad-request" {
		t.Fatalf("a call to the plane over the callout's connection: got %v, want the plane's bad-request refusal", err)
	}
	// Refused: another principal's subjects, and anything outside the caller's rail.
	other := "cotal." + testSpace + ".auth.manager-authority." + ownerB + ".cli"
	if err := nc.Publish(other, []byte("{}")); err != nil {
		t.Fatal(err)
	}
	errs.waitViolation(t, "Publish", other)
	if _, err := nc.SubscribeSync("cotal.>"); err != nil {
		t.Fatal(err)
	}
	errs.waitViolation(t, "Subscription", "cotal.>")

	// The user expires with the bearer: the broker closes the connection, and the bearer
	// connects no more.
	select {
	case <-closed:
	case <-time.After(10 * time.Second):
		t.Fatalf("the connection outlived its bearer (exp %d, now %d)", ex.Exp, time.Now().Unix())
	}
	if nc, err := bearerConnect(t, b, ex.Token, owner, "cli"); err == nil {
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
	ip := idptest.New(t)
	p := startFacesPlane(t, ip, nil)
	b := fetchBundle(t, p.PublicURL())

	// An agent exchanges, then is revoked: its bearer no longer connects.
	secret, _, err := admin.SetAgent(grantCtx(t), p.Keys(), p.NATSURL(), ownerA, "worker")
	if err != nil {
		t.Fatal(err)
	}
	agent := exchange(t, p.PublicURL(), map[string]any{"owner": ownerA, "actor": "worker", "actorToken": secret})
	nc, err := bearerConnect(t, b, agent.Token, ownerA, "worker")
	if err != nil {
		t.Fatalf("the agent's bearer: %v", err)
	}
	nc.Close()
	if _, err := admin.RevokeAgent(grantCtx(t), p.Keys(), p.NATSURL(), ownerA, "worker"); err != nil {
		t.Fatal(err)
	}
	if r := post(t, p.PublicURL()+"/exchange", map[string]any{"owner": ownerA, "actor": "worker", "actorToken": secret}); r.Status != http.StatusUnauthorized {
		t.Errorf("a revoked agent's exchange: got %d %s, want 401", r.Status, r.Body)
	}

	// A plane bearer of another space: signed with a key this space does not publish.
	human := humanOwner(t, p, ip, "bob")
	grant(t, p, human, "cli", "admin")
	good := exchange(t, p.PublicURL(), map[string]any{"idpToken": ip.Token(t, ip.Claims("bob", time.Hour)), "actor": "cli"})

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
			if nc, err := bearerConnect(t, b, tt.token, human, "cli"); err == nil {
				nc.Close()
				t.Fatalf("connected, want the callout to refuse")
			}
		})
	}
	// The good one still connects: the refusals were the tokens', not the plane's.
	nc, err = bearerConnect(t, b, good.Token, human, "cli")
	if err != nil {
		t.Fatalf("a good bearer after the refusals: %v", err)
	}
	nc.Close()
}
