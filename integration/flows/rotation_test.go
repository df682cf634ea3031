package flows

import (
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats.go"

	"github.com/cotal-ai/authplane/admin"
	"github.com/cotal-ai/authplane/integration/internal/harness"
	"github.com/cotal-ai/authplane/internal/capability/signers"
	"github.com/cotal-ai/authplane/internal/testkit"
	"github.com/cotal-ai/authplane/service"
	"github.com/cotal-ai/authplane/subjects"
)

// TestAnEmergencyRotationKillsEveryCredentialOfTheOldKeysOnTheEmbeddedBroker: see harness.Emergency.
func TestAnEmergencyRotationKillsEveryCredentialOfTheOldKeysOnTheEmbeddedBroker(t *testing.T) {
	t.Parallel()
	p := harness.StartFacesPlane(t, testkit.NewIdP(t), nil)
	harness.Emergency(t, p, []string{p.NATSURL()})
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
	m      *harness.ManagerKeys
	latest harness.Material
	epoch  uint64
	proof  string
}

func (r *renewer) iid() string { return r.m.Iid }

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
	clock := &harness.FakeClock{}
	p := harness.StartPlane(t, func(c *service.Config) {
		c.Now = clock.Now
		c.StandingTTL = time.Hour
		c.RotateSigningEvery = 72 * time.Hour
		c.Hooks = &service.Hooks{RotationTick: 50 * time.Millisecond}
		harness.Unbudgeted(c)
	})
	url := p.NATSURL()
	keys := harness.Generations(t, p)
	harness.Grant(t, p, harness.OwnerA, "cli", "supervise")
	cli := harness.CallerConn(t, p, harness.OwnerA, "cli")

	var mu sync.Mutex
	var creds []issuedCred // every credential minted, in order
	keep := func(what string, m *harness.ManagerKeys, mat harness.Material) {
		mu.Lock()
		defer mu.Unlock()
		for duty, c := range mat.Credentials {
			seed, _ := m.Keys[subjects.Duty(duty)].Seed()
			creds = append(creds, issuedCred{what: what + " " + duty, jwt: c.JWT, seed: string(seed), signer: harness.SignedBy(t, c.JWT), exp: c.Exp})
		}
	}
	// A person's credential for 100 h on the plane's clock, signed before the rotation: the
	// store keeps its expiry, and the old key stays listed until then.
	o := admin.DefaultCreds()
	o.Owner, o.Actor, o.TTL = harness.OwnerA, "ops", 100*time.Hour
	iss, err := admin.CredsIssuer(harness.GrantCtx(t), p.Keys(), url, clock.Now().Add(o.TTL))
	if err != nil {
		t.Fatal(err)
	}
	o.Issuer = iss
	person, err := admin.IssueCreds(p.Keys(), o, clock.Now())
	if err != nil {
		t.Fatal(err)
	}
	personCred := issuedCred{what: "the person's 100 h credential", jwt: mustCredsJWT(t, person.Data), seed: mustCredsSeed(t, person.Data), exp: person.Exp.Unix()}
	personCred.signer = harness.SignedBy(t, personCred.jwt)

	var rs []*renewer
	for range 3 {
		m := harness.NewManagerKeys(t)
		prep, act := harness.Registered(t, cli, harness.OwnerA, "cli", m)
		keep("prepare", m, prep)
		keep("activate", m, act)
		rs = append(rs, &renewer{m: m, latest: prep, epoch: prep.ProcessEpoch, proof: act.NextRegistrationProof})
	}
	var renewals, failures atomic.Int64
	var failed sync.Map
	// jumping keeps the test clock's jumps out of the renewals: a renewal that reads the
	// clock before a jump of hours and checks its expiry after it is refused (unavailable,
	// "the clock passed a credential's expiry while it was minted") whatever the keys.
	var jumping sync.RWMutex
	advance := func(d time.Duration) {
		jumping.Lock()
		defer jumping.Unlock()
		clock.Advance(d)
	}
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
				seed, _ := r.m.Keys[subjects.DutySupervisor].Seed()
				actor := subjects.SupervisorActor(r.m.Iid)
				jumping.RLock()
				mu.Lock()
				latest := r.latest.Credentials["supervisor"].JWT
				mu.Unlock()
				nc, err := nats.Connect(url, nats.UserJWTAndSeed(latest, string(seed)),
					nats.CustomInboxPrefix(subjects.InboxPrefix(harness.OwnerA, actor)), nats.MaxReconnects(0))
				if err != nil {
					failures.Add(1)
					failed.Store(fmt.Sprintf("manager %d connect", i), err.Error())
					jumping.RUnlock()
					continue
				}
				out := harness.AskAsync(nc, harness.OwnerA, actor, subjects.EndpointManagerAuthority, harness.Renewal(r.m.Body(t, "renew", actor), r.proof, p.Account(), r.epoch))
				nc.Close()
				jumping.RUnlock()
				if out.Code != "" {
					failures.Add(1)
					failed.Store(fmt.Sprintf("manager %d renew", i), out.Code+": "+out.Message)
					continue
				}
				renewals.Add(1)
				keep("renewal", r.m, out.Material)
				mu.Lock()
				r.latest = out.Material
				mu.Unlock()
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
	testkit.CheckFor(t, 10*time.Second, 20*time.Millisecond, func() error {
		if renewals.Load() < 10 {
			return fmt.Errorf("%d renewals so far", renewals.Load())
		}
		return nil
	})

	// The schedule: 72 h after the first start, the plane begins a rotation on its own; it
	// lists generation 1, switches, and waits.
	advance(72*time.Hour + time.Minute)
	var status *signers.Report
	testkit.CheckFor(t, 20*time.Second, 50*time.Millisecond, func() error {
		st, rep, err := admin.SigningStatus(harness.GrantCtx(t), p.Keys(), url)
		if err != nil {
			return err
		}
		if st.Current != 1 || rep.Step != signers.StepSwitched {
			return fmt.Errorf("generation %d signs, step %q; want 1, switched", st.Current, rep.Step)
		}
		status = rep
		return nil
	})
	switched := clock.Now().Unix()
	old, fresh := harness.MainKey(t, keys, 0), harness.MainKey(t, keys, 1)
	wantListed := func(what string, oldListed bool) {
		t.Helper()
		claims, _ := harness.DataAccountAtBroker(t, p)
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
	testkit.CheckFor(t, 10*time.Second, 20*time.Millisecond, func() error {
		if renewals.Load() < base+6 {
			return fmt.Errorf("%d renewals since the switch", renewals.Load()-base)
		}
		return nil
	})
	mu.Lock()
	latest := make([]string, len(rs))
	for i, r := range rs {
		latest[i] = r.latest.Credentials["supervisor"].JWT
	}
	mu.Unlock()
	for i, r := range rs {
		sup := latest[i]
		want, err := keys.PublicOf(1, r.m.Iid)
		if err != nil {
			t.Fatal(err)
		}
		if got := harness.SignedBy(t, sup); got != want {
			t.Errorf("a renewal after the switch is signed by %s, want instance %s's key of generation 1 (%s)", got, r.m.Iid, want)
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
	advance(status.RemoveAfter.Sub(clock.Now()) - time.Minute)
	time.Sleep(300 * time.Millisecond) // six ticks: none may remove it yet
	wantListed("a minute before the last old credential's expiry", true)
	personCred.connects(t, url)

	// Past it, the tick removes it: the test clock is then past every old credential's expiry.
	advance(2 * time.Minute)
	testkit.CheckFor(t, 20*time.Second, 50*time.Millisecond, func() error {
		_, rep, err := admin.SigningStatus(harness.GrantCtx(t), p.Keys(), url)
		if err != nil {
			return err
		}
		if !rep.Done {
			return fmt.Errorf("the rotation is at step %s", rep.Step)
		}
		return nil
	})
	if now := clock.Now().Unix(); now < lastExp {
		t.Fatalf("generation 0 left at %d, before its last credential's expiry %d", now, lastExp)
	}
	wantListed("done", false)
	for _, c := range spread(oldCreds, 6) {
		harness.ConnectRefused(t, c.what+" after the old key left", url, nats.UserJWTAndSeed(c.jwt, c.seed))
	}
	end()
	if failures.Load() != 0 {
		failed.Range(func(k, v any) bool { t.Errorf("%s: %s", k, v); return true })
		t.Fatalf("%d of %d renewals failed during the rotation, want none", failures.Load(), failures.Load()+renewals.Load())
	}
	t.Logf("%d renewals, none refused; the switch came at %d, generation 0 left at %d", renewals.Load(), switched, clock.Now().Unix())
}

// ofGeneration reports whether signer is generation gen's own key or one of rs's instances'.
func ofGeneration[R interface{ iid() string }](t testing.TB, k *signers.Keys, gen uint64, signer string, rs []R) bool {
	t.Helper()
	if signer == harness.MainKey(t, k, gen) {
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
