package integration

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats.go"

	"github.com/cotal-ai/authplane/admin"
	"github.com/cotal-ai/authplane/internal/broker"
	"github.com/cotal-ai/authplane/internal/idp/idptest"
	"github.com/cotal-ai/authplane/internal/signers"
	"github.com/cotal-ai/authplane/internal/store"
	"github.com/cotal-ai/authplane/service"
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

// generations derives the data account's signing keys of every generation, as the plane does:
// generation 0 from the material, later ones from the keys bucket.
func generations(t testing.TB, p *testPlane) *signers.Keys {
	t.Helper()
	nc, _ := planeConn(t, p.Keys(), p.NATSURL())
	kv, err := store.OpenBucket(grantCtx(t), nc, subjects.KeysBucket(testSpace))
	if err != nil {
		t.Fatal(err)
	}
	k, err := signers.NewKeys(testSpace, p.Account(), p.Keys().Data.Signer, time.Now)
	if err != nil {
		t.Fatal(err)
	}
	return k.Stored(kv)
}

// mainKey is generation gen's own signing key.
func mainKey(t testing.TB, k *signers.Keys, gen uint64) string {
	t.Helper()
	if err := k.Load(grantCtx(t), gen); err != nil {
		t.Fatal(err)
	}
	iss, err := k.Main(gen)
	if err != nil {
		t.Fatal(err)
	}
	return iss.Signer()
}

// signedBy is the key that signed a user JWT.
func signedBy(t testing.TB, token string) string {
	t.Helper()
	c, err := jwt.DecodeUserClaims(token)
	if err != nil {
		t.Fatal(err)
	}
	return c.Issuer
}

// issuedCred is one credential a test was given: its JWT, the seed it connects with, its
// expiry (on the plane's clock) and the key that signed it.
type issuedCred struct {
	what, jwt, seed, signer string
	exp                     int64
}

// connects fails the test unless c connects to url and round-trips.
func (c issuedCred) connects(t testing.TB, url string) {
	t.Helper()
	nc, err := nats.Connect(url, nats.UserJWTAndSeed(c.jwt, c.seed), nats.MaxReconnects(0), nats.Timeout(5*time.Second))
	if err == nil {
		err = nc.Flush()
		nc.Close()
	}
	if err != nil {
		t.Errorf("%s (expires %d, signed by %s): %v, want it connected", c.what, c.exp, c.signer, err)
	}
}

// renewer is a manager that renews without pause: its keys, its newest material, and what
// its renewals send.
type renewer struct {
	m      *managerKeys
	latest material
	epoch  uint64
	proof  string
}

func (r *renewer) iid() string { return r.m.iid }

// TestAScheduledRotationUnderARenewalLoadRefusesNothingAndKeepsTheOldKeyUntilItsLastCredentialExpired:
// the plane begins a scheduled rotation on its own (--rotate-signing-every, on the test clock)
// while three managers renew without pause, each over a connection of its newest credential.
// No renewal is refused or fails. Once the new generation signs, every credential minted
// before it still connects, until its expiry, and so does a long `authplane creds` credential
// signed before the switch, whose expiry the store tracked. The old generation's key stays in
// the account JWT until the test clock passes the last of those expiries, and leaves then; the
// old credentials are refused from that moment.
func TestAScheduledRotationUnderARenewalLoadRefusesNothingAndKeepsTheOldKeyUntilItsLastCredentialExpired(t *testing.T) {
	t.Parallel()
	clock := &fakeClock{}
	p := startPlane(t, func(c *service.Config) {
		c.Now = clock.now
		c.StandingTTL = time.Hour
		c.RotateSigningEvery = 72 * time.Hour
		c.Hooks = &service.Hooks{RotationTick: 50 * time.Millisecond}
		unbudgeted(c)
	})
	url := p.NATSURL()
	keys := generations(t, p)
	grant(t, p, ownerA, "cli", "supervise")
	cli := callerConn(t, p, ownerA, "cli")

	var mu sync.Mutex
	var creds []issuedCred // every credential minted, in order
	keep := func(what string, m *managerKeys, mat material) {
		mu.Lock()
		defer mu.Unlock()
		for duty, c := range mat.Credentials {
			seed, _ := m.keys[subjects.Duty(duty)].Seed()
			creds = append(creds, issuedCred{what: what + " " + duty, jwt: c.JWT, seed: string(seed), signer: signedBy(t, c.JWT), exp: c.Exp})
		}
	}
	// A person's credential for 100 h on the plane's clock, signed before the rotation: the
	// store keeps its expiry, and the old key stays listed until then.
	o := admin.DefaultCreds()
	o.Owner, o.Actor, o.TTL = ownerA, "ops", 100*time.Hour
	iss, err := admin.CredsIssuer(grantCtx(t), p.Keys(), url, clock.now().Add(o.TTL))
	if err != nil {
		t.Fatal(err)
	}
	o.Issuer = iss
	person, err := admin.IssueCreds(p.Keys(), o, clock.now())
	if err != nil {
		t.Fatal(err)
	}
	personCred := issuedCred{what: "the person's 100 h credential", jwt: mustCredsJWT(t, person.Data), seed: mustCredsSeed(t, person.Data), exp: person.Exp.Unix()}
	personCred.signer = signedBy(t, personCred.jwt)

	var rs []*renewer
	for range 3 {
		m := newManagerKeys(t)
		prep, act := registered(t, cli, ownerA, "cli", m)
		keep("prepare", m, prep)
		keep("activate", m, act)
		rs = append(rs, &renewer{m: m, latest: prep, epoch: prep.ProcessEpoch, proof: act.NextRegistrationProof})
	}
	var renewals, failures atomic.Int64
	var failed sync.Map
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for i, r := range rs {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				// Each renewal goes over a connection of the instance's newest supervisor
				// credential, as a manager that reconnects with what it was given does.
				seed, _ := r.m.keys[subjects.DutySupervisor].Seed()
				actor := subjects.SupervisorActor(r.m.iid)
				nc, err := nats.Connect(url, nats.UserJWTAndSeed(r.latest.Credentials["supervisor"].JWT, string(seed)),
					nats.CustomInboxPrefix(subjects.InboxPrefix(ownerA, actor)), nats.MaxReconnects(0))
				if err != nil {
					failures.Add(1)
					failed.Store(fmt.Sprintf("manager %d connect", i), err.Error())
					continue
				}
				out := askAsync(nc, ownerA, actor, subjects.EndpointManagerAuthority, renewal(r.m.body(t, "renew", actor), r.proof, p.Account(), r.epoch))
				nc.Close()
				if out.code != "" {
					failures.Add(1)
					failed.Store(fmt.Sprintf("manager %d renew", i), out.code+": "+out.message)
					continue
				}
				renewals.Add(1)
				keep("renewal", r.m, out.material)
				r.latest = out.material
				time.Sleep(10 * time.Millisecond) // pace: a manager renews, it does not flood
			}
		})
	}
	stopped := false
	end := func() {
		if !stopped {
			stopped = true
			close(stop)
			wg.Wait()
		}
	}
	t.Cleanup(end)
	checkFor(t, 10*time.Second, 20*time.Millisecond, func() error {
		if renewals.Load() < 10 {
			return fmt.Errorf("%d renewals so far", renewals.Load())
		}
		return nil
	})

	// The schedule: 72 h after the first start, the plane begins a rotation on its own; it
	// lists generation 1, switches, and waits.
	clock.advance(72*time.Hour + time.Minute)
	var status *signers.Report
	checkFor(t, 20*time.Second, 50*time.Millisecond, func() error {
		st, rep, err := admin.SigningStatus(grantCtx(t), p.Keys(), url)
		if err != nil {
			return err
		}
		if st.Current != 1 || rep.Step != signers.StepSwitched {
			return fmt.Errorf("generation %d signs, step %q; want 1, switched", st.Current, rep.Step)
		}
		status = rep
		return nil
	})
	switched := clock.now().Unix()
	old, fresh := mainKey(t, keys, 0), mainKey(t, keys, 1)
	wantListed := func(what string, oldListed bool) {
		t.Helper()
		claims, _ := dataAccountAtBroker(t, p)
		if _, ok := claims.SigningKeys[old]; ok != oldListed {
			t.Fatalf("%s: generation 0's key listed %v, want %v", what, ok, oldListed)
		}
		if _, ok := claims.SigningKeys[fresh]; !ok {
			t.Fatalf("%s: generation 1's key is not listed", what)
		}
	}
	wantListed("switched", true)
	// New mints are signed by generation 1's keys.
	base := renewals.Load()
	checkFor(t, 10*time.Second, 20*time.Millisecond, func() error {
		if renewals.Load() < base+6 {
			return fmt.Errorf("%d renewals since the switch", renewals.Load()-base)
		}
		return nil
	})
	for _, r := range rs {
		sup := r.latest.Credentials["supervisor"].JWT
		want, err := keys.PublicOf(1, r.m.iid)
		if err != nil {
			t.Fatal(err)
		}
		if got := signedBy(t, sup); got != want {
			t.Errorf("a renewal after the switch is signed by %s, want instance %s's key of generation 1 (%s)", got, r.m.iid, want)
		}
	}

	// Every credential minted before the switch connects, until its expiry.
	mu.Lock()
	var oldCreds []issuedCred
	for _, c := range creds {
		if !ofGeneration(t, keys, 1, c.signer, rs) {
			oldCreds = append(oldCreds, c)
		}
	}
	mu.Unlock()
	oldCreds = append(oldCreds, personCred)
	var lastExp int64
	for _, c := range oldCreds {
		lastExp = max(lastExp, c.exp)
	}
	if lastExp != personCred.exp {
		t.Fatalf("the last old expiry is %d, want the person's credential's %d", lastExp, personCred.exp)
	}
	if status.RemoveAfter.Unix() < lastExp {
		t.Fatalf("generation 0 may leave at %s, before its last credential expires at %s", status.RemoveAfter, time.Unix(lastExp, 0))
	}
	for _, c := range spread(oldCreds, 12) {
		c.connects(t, url)
	}
	// A minute before the old key may leave, on the test clock: still listed, and the
	// person's credential, the last to expire, still connects.
	clock.advance(status.RemoveAfter.Sub(clock.now()) - time.Minute)
	time.Sleep(300 * time.Millisecond) // six ticks: none may remove it yet
	wantListed("a minute before the last old credential's expiry", true)
	personCred.connects(t, url)

	// Past it, the tick removes it: the test clock is then past every old credential's expiry.
	clock.advance(2 * time.Minute)
	checkFor(t, 20*time.Second, 50*time.Millisecond, func() error {
		_, rep, err := admin.SigningStatus(grantCtx(t), p.Keys(), url)
		if err != nil {
			return err
		}
		if !rep.Done {
			return fmt.Errorf("the rotation is at step %s", rep.Step)
		}
		return nil
	})
	if now := clock.now().Unix(); now < lastExp {
		t.Fatalf("generation 0 left at %d, before its last credential's expiry %d", now, lastExp)
	}
	wantListed("done", false)
	for _, c := range spread(oldCreds, 6) {
		connectRefused(t, c.what+" after the old key left", url, nats.UserJWTAndSeed(c.jwt, c.seed))
	}
	end()
	if failures.Load() != 0 {
		failed.Range(func(k, v any) bool { t.Errorf("%s: %s", k, v); return true })
		t.Fatalf("%d of %d renewals failed during the rotation, want none", failures.Load(), failures.Load()+renewals.Load())
	}
	t.Logf("%d renewals, none refused; the switch came at %d, generation 0 left at %d", renewals.Load(), switched, clock.now().Unix())
}

// ofGeneration reports whether signer is generation gen's own key or one of rs's instances'.
func ofGeneration[R interface{ iid() string }](t testing.TB, k *signers.Keys, gen uint64, signer string, rs []R) bool {
	t.Helper()
	if signer == mainKey(t, k, gen) {
		return true
	}
	for _, r := range rs {
		if pub, err := k.PublicOf(gen, r.iid()); err == nil && pub == signer {
			return true
		}
	}
	return false
}

// spread is at most n of cs, spread over them.
func spread(cs []issuedCred, n int) []issuedCred {
	if len(cs) <= n {
		return cs
	}
	out := make([]issuedCred, 0, n)
	for i := range n {
		out = append(out, cs[i*len(cs)/n])
	}
	return append(out, cs[len(cs)-1])
}

// mustCredsJWT and mustCredsSeed read a `.creds` file's JWT and seed.
func mustCredsJWT(t testing.TB, data []byte) string {
	t.Helper()
	token, err := jwt.ParseDecoratedJWT(data)
	if err != nil {
		t.Fatal(err)
	}
	return token
}

func mustCredsSeed(t testing.TB, data []byte) string {
	t.Helper()
	kp, err := jwt.ParseDecoratedUserNKey(data)
	if err != nil {
		t.Fatal(err)
	}
	seed, err := kp.Seed()
	if err != nil {
		t.Fatal(err)
	}
	return string(seed)
}
