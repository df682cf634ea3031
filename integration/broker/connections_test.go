package broker

import (
	"errors"
	"fmt"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/cotal-ai/authplane/integration/internal/harness"
	"github.com/cotal-ai/authplane/internal/platform/conns"
	"github.com/cotal-ai/authplane/internal/testkit"
	"github.com/cotal-ai/authplane/service"
	"github.com/cotal-ai/authplane/subjects"
)

// excessLife is how long a connection past its budget may live (docs/OPERATIONS.md,
// "Connections"): the plane kicks it when the broker's connect event reaches it.
const excessLife = 2 * time.Second

func startHog(t *testing.T, url, creds string, want int) *harness.Hog {
	t.Helper()
	return harness.StartHogWith(t, url, want, nats.UserCredentials(creds))
}

// Unbounded, one caller credential opened 39 of the data account's 40 connections; every other
// principal got "maximum account active connections exceeded", and so did the plane's own
// serving-user renewal while /health said ok. So each principal has a cap, the
// tenants together keep out of the plane's reserve, a bearer past either is refused by the
// auth callout, a JWT user past either is kicked within excessLife, one that keeps coming back
// is held out at the broker, and the plane renews its serving user through the flood.
func TestOneCredentialCannotTakeTheDataAccountsConnections(t *testing.T) {
	harness.Long(t, "waits out the plane's serving user's life")
	t.Parallel()
	const ttl = 10 * time.Second
	logs := &harness.SyncBuffer{}
	start := time.Now()
	ip := testkit.NewIdP(t)
	p := harness.StartFacesPlane(t, ip, func(c *service.Config) {
		c.MaxConnections, c.ReservedConnections, c.MaxConnectionsPerPrincipal = 40, 4, 4
		c.PlaneUserTTL, c.RequestTimeout, c.Rate = ttl, 2*time.Second, 0
		c.Logger = harness.NewTextLogger(logs)
	})
	b := harness.FetchBundle(t, p.PublicURL())

	// One credential tries to hold all 40 until the plane has renewed its serving user. Kicked
	// past its cap of 4 and coming back at once, it is held out at the broker, its 4 closed
	// too. (Without the budgets it had filled the account by now.)
	h := startHog(t, p.NATSURL(), harness.WriteCallerCreds(t, p.Keys(), harness.OwnerA, "hog"), 40)
	// Held out means the plane counts none of its connections any more either: the ledger
	// hears of each close from the broker a moment after the hog sees it.
	testkit.CheckFor(t, testkit.Stretched(15*time.Second), 20*time.Millisecond, func() error {
		m := harness.Scrape(t, p.HTTPURL())
		held := harness.Sample(m, "authplane_connections_refused_total", map[string]string{"budget": conns.BudgetBackoff, "by": "hold"})
		if m["authplane_data_connections"] == nil {
			return errors.New("the plane exports no authplane_data_connections")
		}
		counted := harness.Sample(m, "authplane_data_connections", map[string]string{"who": "tenants"})
		if n := h.Held(0); held != 1 || n > 0 || counted != 0 {
			return fmt.Errorf("the hog opened %d connections and holds %d, the plane counts %v; %v keys held out, want its own", h.Opened.Load(), n, counted, held)
		}
		return nil
	})

	// Other principals still connect, up to their caps: five JWT users and four bearer users
	// (through the callout), four connections each: the tenants' 36 (40 less the plane's
	// reserve of 4).
	var legit []*nats.Conn
	for i := range 5 {
		actor := fmt.Sprintf("jwt%d", i)
		creds := harness.WriteCallerCreds(t, p.Keys(), harness.OwnerB, actor)
		for range 4 {
			legit = append(legit, harness.ConnectCreds(t, p.NATSURL(), creds, harness.OwnerB, actor))
		}
	}
	for i := range 4 {
		actor := fmt.Sprintf("agent%d", i)
		token := harness.AgentBearer(t, p, harness.OwnerB, actor)
		for k := range 4 {
			// The hog is held out: none of its attempts takes a place of the tenants' 36.
			nc, err := harness.BearerConnect(t, b, token, harness.OwnerB, actor)
			if err != nil {
				t.Fatalf("bearer connection %d of %s.%s: %v; the plane's log lines naming it:\n%s", k+1, harness.OwnerB, actor, err, linesNaming(logs.String(), actor))
			}
			legit = append(legit, nc)
		}
		if i == 0 {
			// A fifth is past the principal's cap: the callout refuses it.
			if nc, err := harness.BearerConnect(t, b, token, harness.OwnerB, actor); err == nil {
				nc.Close()
				t.Fatalf("a fifth bearer connection of %s.%s was let in, want its cap of 4 to refuse it", harness.OwnerB, actor)
			}
		}
	}

	// A JWT user past its cap, and one past the tenants' budget, connect (user JWTs carry no
	// connection limit) and are kicked within excessLife.
	for _, tt := range []struct{ what, actor string }{{"a fifth connection of " + harness.OwnerB + ".jwt0", "jwt0"}, {"a principal past the tenants' 36", "late"}} {
		closed := make(chan time.Time, 1)
		creds := harness.WriteCallerCreds(t, p.Keys(), harness.OwnerB, tt.actor)
		// The broker lets it in and the plane kicks it when its connect event arrives, which
		// may be before Connect returns (then Connect reads EOF): its life counts from the
		// attempt.
		opened := time.Now()
		nc, err := nats.Connect(p.NATSURL(), nats.UserCredentials(creds), nats.NoReconnect(),
			nats.ClosedHandler(func(*nats.Conn) { closed <- time.Now() }))
		if errors.Is(err, io.EOF) {
			if life := time.Since(opened); life > testkit.Stretched(excessLife) {
				t.Errorf("%s lived %s, want at most %s", tt.what, life, testkit.Stretched(excessLife))
			}
			continue
		}
		if err != nil {
			t.Fatalf("%s: %v, want it to connect and then be kicked", tt.what, err)
		}
		select {
		case at := <-closed:
			if life := at.Sub(opened); life > testkit.Stretched(excessLife) {
				t.Errorf("%s lived %s, want at most %s", tt.what, life, testkit.Stretched(excessLife))
			}
		case <-time.After(10 * time.Second):
			nc.Close()
			t.Fatalf("%s is still connected after 10 s, want it kicked within %s", tt.what, excessLife)
		}
	}
	// A bearer user past the tenants' budget is refused by the callout.
	if nc, err := harness.BearerConnect(t, b, harness.AgentBearer(t, p, harness.OwnerB, "lateagent"), harness.OwnerB, "lateagent"); err == nil {
		nc.Close()
		t.Fatal("a bearer connection past the tenants' 36 was let in, want the plane's reserve kept")
	}

	// The plane renews its serving user through the flood, and serves past the first one's
	// expiry.
	testkit.CheckFor(t, ttl+10*time.Second, 100*time.Millisecond, func() error {
		if !strings.Contains(logs.String(), `msg="renewed the serving user" conn=serving`) {
			return fmt.Errorf("the serving user not renewed yet")
		}
		return nil
	})
	if held := h.Held(0); held > 0 {
		t.Errorf("the hog held %d connections, want none: its key is held out", held)
	}
	h.End()
	// A kick is a round trip through the broker: on a loaded machine it takes longer, as in
	// the churn test.
	if longest := time.Duration(h.Longest.Load()); longest > testkit.Stretched(excessLife) {
		t.Errorf("a connection of the hog past its cap lived %s, want at most %s", longest, testkit.Stretched(excessLife))
	}
	t.Logf("the hog opened %d connections; the longest a kicked one lived: %s", h.Opened.Load(), time.Duration(h.Longest.Load()))
	testkit.CheckFor(t, ttl+10*time.Second, 100*time.Millisecond, func() error {
		if time.Since(start) < ttl+time.Second {
			return fmt.Errorf("the first serving user expires at %s", start.Add(ttl).Format(time.TimeOnly))
		}
		return nil
	})
	if o := harness.Ask(t, legit[0], harness.OwnerB, "jwt0", subjects.EndpointManagerAuthority, map[string]any{"kind": "nonsense"}); o.Code != "bad-request" {
		t.Fatalf("a call after the serving user's renewal: got %q %q, want the plane's bad-request", o.Code, o.Message)
	}
	if r := harness.Get(t, p.HTTPURL()+"/health"); r.Status != 200 {
		t.Errorf("/health: got %d %s, want 200", r.Status, r.Body)
	}
	for i, nc := range legit {
		if !nc.IsConnected() {
			t.Errorf("legitimate connection %d: got %s, want it still connected", i, nc.Status())
		}
	}

	families := harness.Scrape(t, p.HTTPURL())
	for _, l := range []map[string]string{
		{"budget": "principal", "by": "callout"},
		{"budget": "principal", "by": "kick"},
		{"budget": "tenants", "by": "callout"},
		{"budget": "tenants", "by": "kick"},
	} {
		if n := harness.Sample(families, "authplane_connections_refused_total", l); n < 1 {
			t.Errorf("/metrics authplane_connections_refused_total%v: got %v, want at least 1", l, n)
		}
	}
}

// The serving user's renewal must not fail while /health says ok. A reserve
// too small for the replicas (two against one broker, the reserve 2: no room for either to
// renew while the tenants hold their share) makes it fail here: /health says so and the
// failure is counted, and the renewal is retried until a slot frees, before the current user
// expires; then /health is ok again.
func TestAFailingServingRenewalIsRetriedAndShownByHealth(t *testing.T) {
	harness.Long(t, "waits out the plane's serving user's life")
	t.Parallel()
	const ttl = 15 * time.Second
	s := harness.StartStandalone(t, harness.TestSpace)
	var planes []*harness.TestPlane
	for range 2 {
		planes = append(planes, harness.StartPlane(t, func(c *service.Config) {
			harness.AgainstStandalone(s)(c)
			c.MaxConnections, c.ReservedConnections, c.MaxConnectionsPerPrincipal = 4, 2, 2
			c.PlaneUserTTL, c.RequestTimeout = ttl, 2*time.Second
		}))
	}
	a := planes[0]
	// Two tenants take the share of 4 less the reserve; the account is full.
	var tenants []*nats.Conn
	for _, actor := range []string{"one", "two"} {
		tenants = append(tenants, harness.CallerConn(t, a, harness.OwnerA, actor))
	}
	var reason string
	testkit.CheckFor(t, ttl, 50*time.Millisecond, func() error {
		r := harness.Get(t, a.HTTPURL()+"/health")
		if r.Status == 200 {
			return fmt.Errorf("/health is ok")
		}
		if reason = r.Field("reason"); !strings.Contains(reason, "renewing the serving user fails") {
			return fmt.Errorf("/health: got %d %s, want the failing renewal", r.Status, r.Body)
		}
		return nil
	})
	if !strings.Contains(reason, "maximum account active connections") {
		t.Errorf("/health's reason: got %q, want the broker's refusal in it", reason)
	}
	if n := harness.Sample(harness.Scrape(t, a.HTTPURL()), "authplane_plane_user_renewals_failed_total", map[string]string{"conn": "serving"}); n < 1 {
		t.Errorf("/metrics failed serving renewals: got %v, want at least 1", n)
	}
	tenants[0].Close()
	for i, p := range planes {
		testkit.CheckFor(t, ttl, 50*time.Millisecond, func() error {
			if r := harness.Get(t, p.HTTPURL()+"/health"); r.Status != 200 {
				return fmt.Errorf("plane %d's /health: got %d %s, want ok once a slot is free", i, r.Status, r.Body)
			}
			return nil
		})
	}
	o := harness.Ask(t, tenants[1], harness.OwnerA, "two", subjects.EndpointManagerAuthority, map[string]any{"kind": "nonsense"})
	if o.Code != "bad-request" {
		t.Fatalf("a call after the renewals: got %q %q, want the plane's bad-request", o.Code, o.Message)
	}
}

// One owner's principals together hold at most --max-connections-per-owner: its people, agents
// and instances' duties are each a principal within its own cap, and one owner once held the
// whole tenants' share through them, refusing every other owner's bearer. Here an owner's 12
// connections over three principals stay; its agent's bearer is refused by the callout, a JWT
// user of a fourth principal is kicked within excessLife, and another owner's agent connects.
func TestOneOwnerCannotTakeTheTenantsShareThroughManyPrincipals(t *testing.T) {
	t.Parallel()
	ip := testkit.NewIdP(t)
	p := harness.StartFacesPlane(t, ip, func(c *service.Config) {
		c.MaxConnections, c.ReservedConnections, c.MaxConnectionsPerPrincipal, c.MaxConnectionsPerOwner = 40, 4, 4, 12
		c.Rate = 0
	})
	b := harness.FetchBundle(t, p.PublicURL())
	for i := range 3 {
		actor := fmt.Sprintf("tool%d", i)
		creds := harness.WriteCallerCreds(t, p.Keys(), harness.OwnerA, actor)
		for range 4 {
			harness.ConnectCreds(t, p.NATSURL(), creds, harness.OwnerA, actor)
		}
	}
	testkit.CheckFor(t, 5*time.Second, 20*time.Millisecond, func() error {
		if n := harness.Sample(harness.Scrape(t, p.HTTPURL()), "authplane_data_connections", map[string]string{"who": "tenants"}); n != 12 {
			return fmt.Errorf("the plane counts %v tenants' connections, want the owner's 12", n)
		}
		return nil
	})
	if nc, err := harness.BearerConnect(t, b, harness.AgentBearer(t, p, harness.OwnerA, "worker"), harness.OwnerA, "worker"); err == nil {
		nc.Close()
		t.Fatalf("a 13th connection of owner %s, its agent's first, was let in", harness.OwnerA)
	}
	closed := make(chan struct{})
	opened := time.Now()
	nc, err := nats.Connect(p.NATSURL(), nats.UserCredentials(harness.WriteCallerCreds(t, p.Keys(), harness.OwnerA, "tool3")), nats.NoReconnect(),
		nats.ClosedHandler(func(*nats.Conn) { close(closed) }))
	if err == nil {
		select {
		case <-closed:
		case <-time.After(10 * time.Second):
			nc.Close()
			t.Fatalf("a 13th connection of owner %s, a JWT user's, is still open after 10 s", harness.OwnerA)
		}
	} else if !errors.Is(err, io.EOF) {
		t.Fatalf("a JWT user past its owner's cap: %v, want it to connect and then be kicked", err)
	}
	if life := time.Since(opened); life > excessLife+time.Second {
		t.Errorf("the JWT user past its owner's cap lived %s, want it kicked within %s", life, excessLife)
	}
	other, err := harness.BearerConnect(t, b, harness.AgentBearer(t, p, harness.OwnerB, "worker"), harness.OwnerB, "worker")
	if err != nil {
		t.Fatalf("another owner's agent: %v", err)
	}
	other.Close()
	families := harness.Scrape(t, p.HTTPURL())
	for _, by := range []string{"callout", "kick"} {
		if n := harness.Sample(families, "authplane_connections_refused_total", map[string]string{"budget": "owner", "by": by}); n != 1 {
			t.Errorf("authplane_connections_refused_total{budget=owner,by=%s}: got %v, want 1", by, n)
		}
	}
}

// A refusal of the auth callout reaches the client as the broker's "Authorization Violation",
// whatever the plane's code, and nats.go by default stops reconnecting once one server
// answers the same auth error twice in a row (docs/PROTOCOL.md, "The HTTP face"): a bearer
// client refused while a slot or the stores are busy, as in a reconnect storm, gives up for good
// unless it opts out with nats.IgnoreAuthErrorAbort. Two agents each retry a connection
// while another connection of theirs holds their cap of one; once that one closes, the agent
// that opted out gets in, and the one on the defaults has closed.
func TestABearerClientOnNatsDefaultsGivesUpAfterTwoRefusalsAndOneThatOptsOutGetsIn(t *testing.T) {
	t.Parallel()
	ip := testkit.NewIdP(t)
	p := harness.StartFacesPlane(t, ip, func(c *service.Config) {
		c.MaxConnections, c.ReservedConnections, c.MaxConnectionsPerPrincipal = 40, 4, 1
	})
	b := harness.FetchBundle(t, p.PublicURL())

	type agent struct {
		actor          string
		opts           []nats.Option
		holder, conn   *nats.Conn
		joined, closed chan struct{}
	}
	agents := []*agent{
		{actor: "patient", opts: []nats.Option{nats.IgnoreAuthErrorAbort()}},
		{actor: "defaults"},
	}
	for _, a := range agents {
		token := harness.AgentBearer(t, p, harness.OwnerB, a.actor)
		holder, err := harness.BearerConnect(t, b, token, harness.OwnerB, a.actor)
		if err != nil {
			t.Fatalf("%s: the first connection: %v", a.actor, err)
		}
		a.holder, a.joined, a.closed = holder, make(chan struct{}), make(chan struct{})
		// RetryOnFailedConnect: a refused first connect goes on as nats.go's reconnects do.
		opts := append([]nats.Option{
			nats.RetryOnFailedConnect(true), nats.MaxReconnects(-1), nats.ReconnectWait(50 * time.Millisecond),
			nats.ConnectHandler(func(*nats.Conn) { close(a.joined) }),
			nats.ClosedHandler(func(*nats.Conn) { close(a.closed) }),
		}, a.opts...)
		if a.conn, err = harness.BearerConnect(t, b, token, harness.OwnerB, a.actor, opts...); err != nil {
			t.Fatalf("%s: a connection that retries: %v", a.actor, err)
		}
	}
	patient, defaults := agents[0], agents[1]
	select {
	case <-defaults.closed:
	case <-time.After(20 * time.Second):
		t.Fatalf("the agent on nats.go's defaults still retries after %d attempts, want it closed after two", 1+defaults.conn.Stats().Reconnects)
	}
	if n := 1 + defaults.conn.Stats().Reconnects; n != 2 || !errors.Is(defaults.conn.LastError(), nats.ErrAuthorization) {
		t.Errorf("the agent on the defaults closed after %d attempts (%v), want 2 refused", n, defaults.conn.LastError())
	}
	testkit.CheckFor(t, 20*time.Second, 20*time.Millisecond, func() error {
		if n := 1 + patient.conn.Stats().Reconnects; n < 4 || !errors.Is(patient.conn.LastError(), nats.ErrAuthorization) {
			return fmt.Errorf("the agent that opted out made %d attempts (%v)", n, patient.conn.LastError())
		}
		return nil
	})
	for _, a := range agents {
		a.holder.Close()
	}
	select {
	case <-patient.joined:
	case <-patient.closed:
		t.Fatal("the agent that opted out closed, want it connected once its cap had room")
	case <-time.After(20 * time.Second):
		t.Fatalf("the agent that opted out is not connected 20 s after its cap had room (%v)", patient.conn.LastError())
	}
	if !patient.conn.IsConnected() {
		t.Errorf("the agent that opted out: status %v, want connected", patient.conn.Status())
	}
	if !defaults.conn.IsClosed() {
		t.Errorf("the agent on the defaults: status %v, want closed for good", defaults.conn.Status())
	}
}

// linesNaming is the lines of log that name what: a refusal the plane logged, or none when
// the callout did not answer within the broker's authorization timeout.
func linesNaming(log, what string) string {
	var out []string
	for line := range strings.SplitSeq(log, "\n") {
		if strings.Contains(line, what) {
			out = append(out, line)
		}
	}
	return strings.Join(out, "\n")
}
