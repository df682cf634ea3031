package integration

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats.go"

	"github.com/cotal-ai/authplane/admin"
	"github.com/cotal-ai/authplane/internal/broker"
	"github.com/cotal-ai/authplane/internal/idp/idptest"
	"github.com/cotal-ai/authplane/internal/signers"
	"github.com/cotal-ai/authplane/subjects"
)

// rotate runs `authplane keys rotate-signing` of kind against p, resuming with kind "".
func rotate(t testing.TB, p *testPlane, kind string) (*signers.Report, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	return admin.RotateSigning(ctx, p.Keys(), p.NATSURL(), admin.RotateOptions{Kind: kind, Resume: kind == ""})
}

// mustRotate is rotate, done.
func mustRotate(t testing.TB, p *testPlane, kind string) *signers.Report {
	t.Helper()
	rep, err := rotate(t, p, kind)
	if err != nil {
		t.Fatalf("rotate %s: %v", kind, err)
	}
	return rep
}

// currentCreds writes a `.creds` file of owner.actor as `authplane creds` does now: signed by
// the data account's signing key that signs now.
func currentCreds(t testing.TB, p *testPlane, owner, actor string) string {
	t.Helper()
	o := admin.DefaultCreds()
	o.Owner, o.Actor, o.TTL = owner, actor, time.Hour
	iss, err := admin.CredsIssuer(grantCtx(t), p.Keys(), p.NATSURL(), time.Now().Add(o.TTL))
	if err != nil {
		t.Fatal(err)
	}
	o.Issuer = iss
	c, err := admin.IssueCreds(p.Keys(), o, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), owner+"."+actor+".creds")
	if err := os.WriteFile(path, c.Data, 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// heldSigningKeys is the data account's signing keys as each server of p's broker applies them.
func heldSigningKeys(t testing.TB, p *testPlane, n int) map[string]map[string]bool {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	held, err := broker.Account{NC: systemConn(t, p), Public: p.Account()}.Held(ctx, n)
	if err != nil || len(held) != n {
		t.Fatalf("the data account at %d servers: got %d answers, %v", n, len(held), err)
	}
	out := map[string]map[string]bool{}
	for name, token := range held {
		claims, err := jwt.DecodeAccountClaims(token)
		if err != nil {
			t.Fatalf("server %s: %v", name, err)
		}
		out[name] = map[string]bool{}
		for k := range claims.SigningKeys {
			out[name][k] = true
		}
	}
	return out
}

// unlistedConnections lists, on p's broker's n servers, the data account's connections whose
// signing key no server lists any more.
func unlistedConnections(t testing.TB, p *testPlane, n int) []broker.Connection {
	t.Helper()
	held := heldSigningKeys(t, p, n)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	conns, answered, err := broker.Account{NC: systemConn(t, p), Public: p.Account()}.ListConnections(ctx, n)
	if err != nil || len(answered) != n {
		t.Fatalf("list the connections: %d of %d servers answered, %v", len(answered), n, err)
	}
	var out []broker.Connection
	for _, c := range conns {
		if c.Issuer == "" {
			t.Fatalf("connection %s of %s: the listing names no signing key", c.Principal, c.Server)
		}
		listed := false
		for _, keys := range held {
			listed = listed || keys[c.Issuer]
		}
		if !listed {
			out = append(out, c)
		}
	}
	return out
}

// connectRefused fails the test unless connecting to url with opts is refused at connect.
func connectRefused(t testing.TB, what, url string, opts ...nats.Option) {
	t.Helper()
	nc, err := nats.Connect(url, append([]nats.Option{nats.MaxReconnects(0), nats.Timeout(5 * time.Second)}, opts...)...)
	if err == nil {
		nc.Close()
		t.Errorf("%s: connected, want refused at connect", what)
		return
	}
	if !strings.Contains(strings.ToLower(err.Error()), "authorization") {
		t.Errorf("%s: got %v, want an authorization violation", what, err)
	}
}

// TestAnEmergencyRotationKillsEveryCredentialOfTheOldKeysOnTheEmbeddedBroker: see emergency.
func TestAnEmergencyRotationKillsEveryCredentialOfTheOldKeysOnTheEmbeddedBroker(t *testing.T) {
	t.Parallel()
	p := startFacesPlane(t, idptest.New(t), nil)
	emergency(t, p, []string{p.NATSURL()})
}

// emergency: a manager (its supervisor and serve duties), the person who prepared it (a caller
// credential) and a managed agent (through the auth callout) hold live connections, on every
// server of urls; an emergency rotation then closes every one of them, confirmed by the
// servers' connection listings; every old credential and bearer is refused at connect; a
// renewal with the old registration answers `expired` and writes nothing; and under the new
// keys a fresh caller credential, a prepare, an activate, a renewal, their connections and a
// new bearer all work.
func emergency(t *testing.T, p *testPlane, urls []string) {
	grant(t, p, ownerA, "cli", "supervise")
	cliCreds := writeCallerCreds(t, p.Keys(), ownerA, "cli")
	cli := connectCreds(t, urls[0], cliCreds, ownerA, "cli")
	m := newManagerKeys(t)
	prep, act := registered(t, cli, ownerA, "cli", m)
	bearerTok := agentBearer(t, p, ownerB, "agent")
	b := fetchBundle(t, p.PublicURL())
	var live []*nats.Conn
	for i, url := range urls {
		sup := dutyConnAt(t, url, m, ownerA, subjects.DutySupervisor, prep.Credentials["supervisor"].JWT)
		serve := dutyConnAt(t, url, m, ownerA, subjects.DutyServe, act.Credentials["serve"].JWT)
		b.Server = url
		agent, err := bearerConnect(t, b, bearerTok, ownerB, "agent")
		if err != nil {
			t.Fatalf("agent through the callout at server %d: %v", i, err)
		}
		live = append(live, sup, serve, agent)
	}
	live = append(live, cli)
	if left := unlistedConnections(t, p, len(urls)); len(left) != 0 {
		t.Fatalf("before the rotation: %d connections of keys not listed, want none", len(left))
	}

	rep := mustRotate(t, p, signers.Emergency)
	if !rep.Done || rep.To != 1 || rep.Left != 0 || len(rep.Unconfirmed) != 0 || len(rep.Confirmed) != len(urls) {
		t.Fatalf("the emergency rotation: got %+v, want done, generation 1, every server confirmed, no connection left", rep)
	}
	checkFor(t, 10*time.Second, 50*time.Millisecond, func() error {
		for i, nc := range live {
			if !nc.IsClosed() {
				return fmt.Errorf("live connection %d (%s) is still open", i, nc.Opts.Name)
			}
		}
		return nil
	})
	if left := unlistedConnections(t, p, len(urls)); len(left) != 0 {
		t.Fatalf("after the rotation: the servers list %d connections of the old keys (%v), want none", len(left), left)
	}
	for _, url := range urls {
		connectRefused(t, "the old caller credential at "+url, url, nats.UserCredentials(cliCreds))
		seed, _ := m.keys[subjects.DutySupervisor].Seed()
		connectRefused(t, "the old supervisor credential at "+url, url, nats.UserJWTAndSeed(prep.Credentials["supervisor"].JWT, string(seed)))
		b.Server = url
		if nc, err := bearerConnect(t, b, bearerTok, ownerB, "agent"); err == nil {
			nc.Close()
			t.Errorf("the old bearer at %s: connected, want refused", url)
		}
	}

	// A fresh caller credential works; a renewal with the old registration is expired. The
	// plane's own serving connection was closed with the old keys too: it is back under the
	// new ones within a second or so (no responders until then).
	cli = connectCreds(t, urls[len(urls)-1], currentCreds(t, p, ownerA, "cli"), ownerA, "cli")
	before := storeSeqs(t, p).except(subjects.AuthBucket(testSpace))
	var o outcome
	back := time.Now()
	checkFor(t, 10*time.Second, 20*time.Millisecond, func() error {
		if o = askWithin(time.Second, cli, ownerA, "cli", subjects.EndpointManagerAuthority, renewal(m.body(t, "renew", "cli"), act.NextRegistrationProof, p.Account(), 0)); o.code == "transport" {
			return fmt.Errorf("the plane does not answer: %s", o.message)
		}
		return nil
	})
	t.Logf("the plane answered again %s after the rotation returned", time.Since(back).Round(time.Millisecond))
	if o.code != "expired" || o.numeric != 410 || !strings.Contains(o.message, "emergency rotation; prepare again") {
		t.Fatalf("a renewal with the old registration: got %s %d %q, want expired 410 telling it to prepare again", o.code, o.numeric, o.message)
	}
	wantUnwritten(t, p, "the expired renewal", before)

	prep, act = registered(t, cli, ownerA, "cli", m)
	renewed := mustMint(t, cli, ownerA, "cli", renewal(m.body(t, "renew", "cli"), act.NextRegistrationProof, p.Account(), prep.ProcessEpoch))
	for i, url := range urls {
		sup := dutyConnAt(t, url, m, ownerA, subjects.DutySupervisor, renewed.Credentials["supervisor"].JWT)
		if err := sup.Flush(); err != nil {
			t.Errorf("the renewed supervisor at server %d: %v", i, err)
		}
	}
	b.Server = urls[0]
	agent, err := bearerConnect(t, b, agentBearer(t, p, ownerB, "agent"), ownerB, "agent")
	if err != nil {
		t.Fatalf("a new bearer after the rotation: %v", err)
	}
	if err := agent.Flush(); err != nil {
		t.Fatal(err)
	}
	for _, keys := range heldSigningKeys(t, p, len(urls)) {
		if own, _ := p.Keys().Data.Signer.PublicKey(); keys[own] {
			t.Errorf("a server still lists the material's data signing key")
		}
	}
}

// dutyConnAt is dutyConn at url.
func dutyConnAt(t testing.TB, url string, m *managerKeys, owner string, d subjects.Duty, token string) *nats.Conn {
	t.Helper()
	seed, err := m.keys[d].Seed()
	if err != nil {
		t.Fatal(err)
	}
	actor := subjects.DutyActor(d, m.iid, "")
	nc, err := nats.Connect(url, nats.UserJWTAndSeed(token, string(seed)), nats.CustomInboxPrefix(subjects.InboxPrefix(owner, actor)),
		nats.MaxReconnects(0), nats.Name(string(d)))
	if err != nil {
		t.Fatalf("connect as %s at %s: %v", d, url, err)
	}
	t.Cleanup(nc.Close)
	return nc
}
