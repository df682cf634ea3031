package integration

import (
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats.go"

	"github.com/cotal-ai/authplane/service"
	"github.com/cotal-ai/authplane/subjects"
)

// TestManagerFlowMintsCredentialsTheBrokerAcceptsAndConfines drives prepare → activate → renew
// → renewStandingBundle over the bus, then connects with every credential: each is accepted,
// can do its duty, and is refused by the broker outside its grant.
func TestManagerFlowMintsCredentialsTheBrokerAcceptsAndConfines(t *testing.T) {
	t.Parallel()
	p := startPlane(t, nil)
	grant(t, p, ownerA, "cli", "supervise")
	cli := callerConn(t, p, ownerA, "cli")
	m := newManagerKeys(t)
	account := p.Keys().Data.Public()

	prep := mustMint(t, cli, ownerA, "cli", m.body(t, "prepare", "cli"))
	wantDuties(t, "prepare", prep, "supervisor", "executor")
	if prep.ProcessEpoch != 0 || prep.AccountPublicKey != account || prep.RegistrationProof == "" || prep.Owner != ownerA {
		t.Fatalf("prepare: got epoch %d, account %s, proof %q, owner %s; want 0, %s, a proof, %s",
			prep.ProcessEpoch, prep.AccountPublicKey, prep.RegistrationProof, prep.Owner, account, ownerA)
	}
	act := m.body(t, "activate", "cli")
	act["registrationProof"] = prep.RegistrationProof
	activated := mustMint(t, cli, ownerA, "cli", act)
	wantDuties(t, "activate", activated, "serve", "goalWriter", "sessionLedger")
	if activated.NextRegistrationProof == "" || activated.NextRegistrationProof == prep.RegistrationProof {
		t.Fatalf("activate: got nextRegistrationProof %q, want a new proof", activated.NextRegistrationProof)
	}
	renewed := mustMint(t, cli, ownerA, "cli", renewal(m.body(t, "renew", "cli"), activated.NextRegistrationProof, account, 0))
	wantDuties(t, "renew", renewed, "supervisor", "executor")
	bundle := mustMint(t, cli, ownerA, "cli", renewal(m.body(t, "renewStandingBundle", "cli"), activated.NextRegistrationProof, account, 0))
	wantDuties(t, "renewStandingBundle", bundle, "supervisor", "executor", "serve", "goalWriter", "sessionLedger")

	// The broker accepts every credential of every operation.
	for _, got := range []material{prep, activated, renewed, bundle} {
		for duty, c := range got.Credentials {
			nc := dutyConn(t, p, m, ownerA, subjects.Duty(duty), c.JWT)
			flush(t, nc)
			nc.Close()
		}
	}

	// Every credential says who it is for, for how long, and nothing more.
	for duty, c := range bundle.Credentials {
		claims, err := jwt.DecodeUserClaims(c.JWT)
		if err != nil {
			t.Fatalf("%s: decode: %v", duty, err)
		}
		wantName := subjects.Principal(ownerA, subjects.DutyActor(subjects.Duty(duty), m.iid, ""))
		if claims.Subject != m.pub(t, subjects.Duty(duty)) || claims.Name != wantName || claims.IssuerAccount != account || claims.Expires != c.Exp {
			t.Errorf("%s: got sub %s name %s issuer account %s exp %d; want %s %s %s %d",
				duty, claims.Subject, claims.Name, claims.IssuerAccount, claims.Expires, m.pub(t, subjects.Duty(duty)), wantName, account, c.Exp)
		}
		if claims.Resp != nil || claims.BearerToken {
			t.Errorf("%s: got response permission %v, bearer %v; want neither", duty, claims.Resp, claims.BearerToken)
		}
	}
	exec := bundle.Credentials["executor"].Exp - bundle.IssuedAt/1000
	if exec > 301 || exec < 290 {
		t.Errorf("executor lifetime: got %ds, want about 300s", exec)
	}
	if standing := bundle.Credentials["serve"].Exp - bundle.IssuedAt/1000; standing < 24*3600-10 {
		t.Errorf("standing lifetime: got %ds, want 24h", standing)
	}

	sp := "cotal." + testSpace
	other := newManagerKeys(t).iid

	// serve: receives its owner's run-starts (queue manager.<owner>) and its instance's
	// subjects, and answers on its instance's reply subjects.
	serveErrs := &asyncErrors{}
	serve := dutyConn(t, p, m, ownerA, subjects.DutyServe, bundle.Credentials["serve"].JWT, serveErrs.option())
	runStarts, err := serve.QueueSubscribeSync(sp+".ep.v1.one.manager.run-start."+ownerA+".>", "manager."+ownerA)
	if err != nil {
		t.Fatal(err)
	}
	inst, err := serve.SubscribeSync(sp + ".ep.v1.inst.manager." + m.iid + ".>")
	if err != nil {
		t.Fatal(err)
	}
	flush(t, serve)
	replies, err := cli.SubscribeSync(sp + ".ep.reply.manager.*.*." + ownerA + ".cli.>")
	if err != nil {
		t.Fatal(err)
	}
	flush(t, cli)
	start := sp + ".ep.v1.one.manager.run-start." + ownerA + ".cli.uid1.gen1.nonce1"
	if err := cli.Publish(start, []byte("start")); err != nil {
		t.Fatal(err)
	}
	if msg, err := runStarts.NextMsg(3 * time.Second); err != nil || msg.Subject != start {
		t.Fatalf("serve: got %v, %v; want the run-start on %s", msg, err, start)
	}
	instStart := sp + ".ep.v1.inst.manager." + m.iid + ".run-start." + ownerA + ".cli.uid1.gen1.nonce2"
	if err := cli.Publish(instStart, []byte("start")); err != nil {
		t.Fatal(err)
	}
	if msg, err := inst.NextMsg(3 * time.Second); err != nil || msg.Subject != instStart {
		t.Fatalf("serve: got %v, %v; want the instance run-start on %s", msg, err, instStart)
	}
	answer := sp + ".ep.reply.manager." + m.iid + ".0." + ownerA + ".cli.uid1.nonce1"
	if err := serve.Publish(answer, []byte("done")); err != nil {
		t.Fatal(err)
	}
	if msg, err := replies.NextMsg(3 * time.Second); err != nil || msg.Subject != answer {
		t.Fatalf("caller: got %v, %v; want serve's answer on %s", msg, err, answer)
	}
	if _, err := serve.SubscribeSync(sp + ".ep.v1.inst.manager." + other + ".>"); err != nil {
		t.Fatal(err)
	}
	serveErrs.waitViolation(t, "Subscription", sp+".ep.v1.inst.manager."+other+".>")
	// The one-of run-starts only in its owner's queue group: not in another, not outside one.
	for _, queue := range []string{"thieves", ""} {
		errs := &asyncErrors{}
		nc := dutyConn(t, p, m, ownerA, subjects.DutyServe, bundle.Credentials["serve"].JWT, errs.option())
		if _, err := nc.QueueSubscribeSync(sp+".ep.v1.one.manager.run-start."+ownerA+".>", queue); err != nil {
			t.Fatal(err)
		}
		errs.waitViolation(t, "Subscription", sp+".ep.v1.one.manager.run-start."+ownerA+".>")
	}

	// The others: one allowed publish each (no violation after a round trip), one refused.
	cases := []struct {
		duty    subjects.Duty
		allowed string
		refused string
	}{
		{subjects.DutySupervisor, subjects.EndpointSubject(testSpace, "manager-authority", ownerA, subjects.SupervisorActor(m.iid)), sp + ".goal." + ownerA + ".g1"},
		{subjects.DutyExecutor, subjects.EndpointSubject(testSpace, "run-revoke", ownerA, subjects.ExecutorActor(m.iid)), subjects.EndpointSubject(testSpace, "manager-authority", ownerA, subjects.SupervisorActor(m.iid))},
		{subjects.DutyGoalWriter, sp + ".goal." + ownerA + ".g1", sp + ".goal." + ownerB + ".g1"},
		{subjects.DutySessionLedger, sp + ".session." + ownerA + ".s1", "$JS.API.STREAM.LIST"},
		{subjects.DutyServe, sp + ".ep.reply.manager." + m.iid + ".x", sp + ".ep.reply.manager." + other + ".x"},
	}
	for _, c := range cases {
		t.Run(string(c.duty), func(t *testing.T) {
			errs := &asyncErrors{}
			nc := dutyConn(t, p, m, ownerA, c.duty, bundle.Credentials[string(c.duty)].JWT, errs.option())
			if err := nc.Publish(c.allowed, []byte("x")); err != nil {
				t.Fatal(err)
			}
			flush(t, nc)
			if err := errs.violation(c.allowed); err != nil {
				t.Fatalf("publish %s: got %v, want it allowed", c.allowed, err)
			}
			if err := nc.Publish(c.refused, []byte("x")); err != nil {
				t.Fatal(err)
			}
			errs.waitViolation(t, "Publish", c.refused)
		})
	}
}

func wantDuties(t testing.TB, op string, m material, duties ...string) {
	t.Helper()
	if len(m.Credentials) != len(duties) {
		t.Fatalf("%s: got credentials for %v, want exactly %v", op, keys(m.Credentials), duties)
	}
	for _, d := range duties {
		c, ok := m.Credentials[d]
		if !ok || c.JWT == "" || c.Exp == 0 {
			t.Fatalf("%s: got credentials for %v, want %s", op, keys(m.Credentials), d)
		}
		if m.ExpiresAt > c.Exp*1000 {
			t.Errorf("%s: expiresAt %d is after %s's exp %d", op, m.ExpiresAt, d, c.Exp)
		}
	}
}

func keys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	return out
}

func flush(t testing.TB, nc *nats.Conn) {
	t.Helper()
	if err := nc.FlushTimeout(3 * time.Second); err != nil {
		t.Fatalf("flush: %v", err)
	}
}

// TestStandingCredentialIsDisconnectedByTheBrokerAtExpiry: with --standing-ttl 5s the broker,
// not the plane, ends a connection when its JWT expires.
func TestStandingCredentialIsDisconnectedByTheBrokerAtExpiry(t *testing.T) {
	t.Parallel()
	p := startPlane(t, func(c *service.Config) { c.StandingTTL = 5 * time.Second })
	grant(t, p, ownerA, "cli", "supervise")
	cli := callerConn(t, p, ownerA, "cli")
	m := newManagerKeys(t)
	prep := mustMint(t, cli, ownerA, "cli", m.body(t, "prepare", "cli"))
	if life := prep.Credentials["supervisor"].Exp - prep.IssuedAt/1000; life > 5 || life < 4 {
		t.Fatalf("got a %ds supervisor credential, want 5s", life)
	}
	closed := make(chan struct{})
	var mu sync.Mutex
	var reason error
	nc := dutyConn(t, p, m, ownerA, subjects.DutySupervisor, prep.Credentials["supervisor"].JWT,
		nats.DisconnectErrHandler(func(_ *nats.Conn, err error) {
			mu.Lock()
			defer mu.Unlock()
			if reason == nil {
				reason = err
			}
		}),
		nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
			mu.Lock()
			defer mu.Unlock()
			if reason == nil {
				reason = err
			}
		}),
		nats.ClosedHandler(func(*nats.Conn) { close(closed) }))
	flush(t, nc)
	select {
	case <-closed:
	case <-time.After(15 * time.Second):
		t.Fatal("the connection is still open 15s after a 5s credential was issued")
	}
	mu.Lock()
	defer mu.Unlock()
	if reason == nil || !strings.Contains(strings.ToLower(reason.Error()), "expired") {
		t.Fatalf("got disconnect reason %v, want the broker's authentication expired", reason)
	}
	if time.Now().Unix() < prep.Credentials["supervisor"].Exp {
		t.Fatalf("disconnected before the credential's exp %d", prep.Credentials["supervisor"].Exp)
	}
}

// TestReRegistrationAdvancesTheEpochAndFencesTheOldOne: prepare again moves processEpoch; the
// old epoch's renewal is `conflict`, the old registration's proof cannot activate.
func TestReRegistrationAdvancesTheEpochAndFencesTheOldOne(t *testing.T) {
	t.Parallel()
	p := startPlane(t, nil)
	grant(t, p, ownerA, "cli", "supervise")
	cli := callerConn(t, p, ownerA, "cli")
	account := p.Keys().Data.Public()
	m := newManagerKeys(t)
	first, act := registered(t, cli, ownerA, "cli", m)

	second := mustMint(t, cli, ownerA, "cli", m.body(t, "prepare", "cli"))
	if second.ProcessEpoch != first.ProcessEpoch+1 {
		t.Fatalf("re-registration: got epoch %d, want %d", second.ProcessEpoch, first.ProcessEpoch+1)
	}
	o := ask(t, cli, ownerA, "cli", subjects.EndpointManagerAuthority, renewal(m.body(t, "renew", "cli"), act.NextRegistrationProof, account, first.ProcessEpoch))
	if o.code != "conflict" || o.numeric != 409 || !strings.Contains(o.message, "processEpoch is stale") {
		t.Fatalf("renew at the old epoch: got %s %d %q, want conflict 409 processEpoch is stale", o.code, o.numeric, o.message)
	}
	o = ask(t, cli, ownerA, "cli", subjects.EndpointManagerAuthority, renewal(m.body(t, "renew", "cli"), act.NextRegistrationProof, account, second.ProcessEpoch))
	if o.code != "permission-denied" {
		t.Fatalf("renew with the old registration's proof at the new epoch: got %q, want permission-denied", o.code)
	}
	old := m.body(t, "activate", "cli")
	old["registrationProof"] = first.RegistrationProof
	if o := ask(t, cli, ownerA, "cli", subjects.EndpointManagerAuthority, old); o.code != "permission-denied" {
		t.Fatalf("activate with the previous registration's proof: got %q, want permission-denied", o.code)
	}
	cur := m.body(t, "activate", "cli")
	cur["registrationProof"] = second.RegistrationProof
	act2 := mustMint(t, cli, ownerA, "cli", cur)
	mustMint(t, cli, ownerA, "cli", renewal(m.body(t, "renew", "cli"), act2.NextRegistrationProof, account, second.ProcessEpoch))
}

// TestManagerRenewsAsItsOwnSupervisor: the instance's own supervisor (and executor) credential
// renews with no ledger row of its own, cannot renew another instance, and is refused once the
// person who prepared it loses `supervise`.
func TestManagerRenewsAsItsOwnSupervisor(t *testing.T) {
	t.Parallel()
	p := startPlane(t, nil)
	grant(t, p, ownerA, "cli", "supervise")
	cli := callerConn(t, p, ownerA, "cli")
	account := p.Keys().Data.Public()
	m, other := newManagerKeys(t), newManagerKeys(t)
	prep, act := registered(t, cli, ownerA, "cli", m)
	_, otherAct := registered(t, cli, ownerA, "cli", other)

	supActor := subjects.SupervisorActor(m.iid)
	sup := dutyConn(t, p, m, ownerA, subjects.DutySupervisor, prep.Credentials["supervisor"].JWT)
	renewed := mustMint(t, sup, ownerA, supActor, renewal(m.body(t, "renew", supActor), act.NextRegistrationProof, account, 0))
	wantDuties(t, "renew as supervisor", renewed, "supervisor", "executor")

	execActor := subjects.ExecutorActor(m.iid)
	exe := dutyConn(t, p, m, ownerA, subjects.DutyExecutor, renewed.Credentials["executor"].JWT)
	mustMint(t, exe, ownerA, execActor, renewal(m.body(t, "renewStandingBundle", execActor), act.NextRegistrationProof, account, 0))

	// Its credential speaks only for its own instance, even with the other's valid proof.
	o := ask(t, sup, ownerA, supActor, subjects.EndpointManagerAuthority, renewal(other.body(t, "renew", supActor), otherAct.NextRegistrationProof, account, 0))
	if o.code != "permission-denied" || len(o.material.Credentials) != 0 {
		t.Fatalf("supervisor of %s renewing %s: got %q with %d credentials, want permission-denied and none", m.iid, other.iid, o.code, len(o.material.Credentials))
	}

	grant(t, p, ownerA, "cli") // the preparer loses every scope
	o = ask(t, sup, ownerA, supActor, subjects.EndpointManagerAuthority, renewal(m.body(t, "renew", supActor), act.NextRegistrationProof, account, 0))
	if o.code != "permission-denied" || !strings.Contains(o.message, "whoever prepared") || strings.Contains(o.message, ownerA+".cli") {
		t.Fatalf("renew after the preparer lost supervise: got %s %q, want permission-denied about the preparer, naming no other principal", o.code, o.message)
	}
}

// TestConcurrentRenewalsOfOneInstanceAllSucceed: mints on one gate contend on its CAS; the
// retry rule (content unchanged: retry) lets every one of them commit.
func TestConcurrentRenewalsOfOneInstanceAllSucceed(t *testing.T) {
	t.Parallel()
	p := startPlane(t, func(c *service.Config) { c.Workers = 8 })
	grant(t, p, ownerA, "cli", "supervise")
	cli := callerConn(t, p, ownerA, "cli")
	account := p.Keys().Data.Public()
	m := newManagerKeys(t)
	_, act := registered(t, cli, ownerA, "cli", m)

	const n = 40
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			op := "renew"
			if i%2 == 1 {
				op = "renewStandingBundle"
			}
			o := askAsync(cli, ownerA, "cli", subjects.EndpointManagerAuthority, renewal(m.body(t, op, "cli"), act.NextRegistrationProof, account, 0))
			if o.code != "" || len(o.material.Credentials) == 0 {
				errs <- fmt.Errorf("%s: got %q %q with %d credentials, want credentials", op, o.code, o.message, len(o.material.Credentials))
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}
