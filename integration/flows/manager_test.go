package flows

import (
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats.go"

	"github.com/cotal-ai/authplane/integration/internal/harness"
	"github.com/cotal-ai/authplane/service"
	"github.com/cotal-ai/authplane/subjects"
)

// TestManagerFlowMintsCredentialsTheBrokerAcceptsAndConfines drives prepare → activate → renew
// → renewStandingBundle over the bus, then connects with every credential: each is accepted,
// can do its duty, and is refused by the broker outside its grant.
func TestManagerFlowMintsCredentialsTheBrokerAcceptsAndConfines(t *testing.T) {
	t.Parallel()
	p := harness.StartPlane(t, nil)
	harness.Grant(t, p, harness.OwnerA, "cli", "supervise")
	cli := harness.CallerConn(t, p, harness.OwnerA, "cli")
	m := harness.NewManagerKeys(t)
	account := p.Keys().Data.Public()

	prep := harness.MustMint(t, cli, harness.OwnerA, "cli", m.Body(t, "prepare", "cli"))
	harness.WantDuties(t, "prepare", prep, "supervisor", "executor")
	if prep.ProcessEpoch != 0 || prep.AccountPublicKey != account || prep.RegistrationProof == "" || prep.Owner != harness.OwnerA {
		t.Fatalf("prepare: got epoch %d, account %s, proof %q, owner %s; want 0, %s, a proof, %s",
			prep.ProcessEpoch, prep.AccountPublicKey, prep.RegistrationProof, prep.Owner, account, harness.OwnerA)
	}
	act := m.Body(t, "activate", "cli")
	act["registrationProof"] = prep.RegistrationProof
	activated := harness.MustMint(t, cli, harness.OwnerA, "cli", act)
	harness.WantDuties(t, "activate", activated, "serve", "goalWriter", "sessionLedger")
	if activated.NextRegistrationProof == "" || activated.NextRegistrationProof == prep.RegistrationProof {
		t.Fatalf("activate: got nextRegistrationProof %q, want a new proof", activated.NextRegistrationProof)
	}
	renewed := harness.MustMint(t, cli, harness.OwnerA, "cli", harness.Renewal(m.Body(t, "renew", "cli"), activated.NextRegistrationProof, account, 0))
	harness.WantDuties(t, "renew", renewed, "supervisor", "executor")
	bundle := harness.MustMint(t, cli, harness.OwnerA, "cli", harness.Renewal(m.Body(t, "renewStandingBundle", "cli"), activated.NextRegistrationProof, account, 0))
	harness.WantDuties(t, "renewStandingBundle", bundle, "supervisor", "executor", "serve", "goalWriter", "sessionLedger")

	// The broker accepts every credential of every operation.
	for _, got := range []harness.Material{prep, activated, renewed, bundle} {
		for duty, c := range got.Credentials {
			nc := harness.DutyConn(t, p, m, harness.OwnerA, subjects.Duty(duty), c.JWT)
			harness.Flush(t, nc)
			nc.Close()
		}
	}

	// Every credential says who it is for, for how long, and nothing more.
	for duty, c := range bundle.Credentials {
		claims, err := jwt.DecodeUserClaims(c.JWT)
		if err != nil {
			t.Fatalf("%s: decode: %v", duty, err)
		}
		wantName := subjects.Principal(harness.OwnerA, subjects.DutyActor(subjects.Duty(duty), m.Iid, ""))
		if claims.Subject != m.Pub(t, subjects.Duty(duty)) || claims.Name != wantName || claims.IssuerAccount != account || claims.Expires != c.Exp {
			t.Errorf("%s: got sub %s name %s issuer account %s exp %d; want %s %s %s %d",
				duty, claims.Subject, claims.Name, claims.IssuerAccount, claims.Expires, m.Pub(t, subjects.Duty(duty)), wantName, account, c.Exp)
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

	sp := "cotal." + harness.TestSpace
	other := harness.NewManagerKeys(t).Iid

	// serve: receives its owner's run-starts (queue manager.<owner>) and its instance's
	// subjects, and answers on its instance's reply subjects.
	serveErrs := &harness.AsyncErrors{}
	serve := harness.DutyConn(t, p, m, harness.OwnerA, subjects.DutyServe, bundle.Credentials["serve"].JWT, serveErrs.Option())
	runStarts, err := serve.QueueSubscribeSync(sp+".ep.v1.one.manager.run-start."+harness.OwnerA+".>", "manager."+harness.OwnerA)
	if err != nil {
		t.Fatal(err)
	}
	inst, err := serve.SubscribeSync(sp + ".ep.v1.inst.manager." + m.Iid + ".>")
	if err != nil {
		t.Fatal(err)
	}
	harness.Flush(t, serve)
	replies, err := cli.SubscribeSync(sp + ".ep.reply.manager.*.*." + harness.OwnerA + ".cli.>")
	if err != nil {
		t.Fatal(err)
	}
	harness.Flush(t, cli)
	start := sp + ".ep.v1.one.manager.run-start." + harness.OwnerA + ".cli.uid1.gen1.nonce1"
	if err := cli.Publish(start, []byte("start")); err != nil {
		t.Fatal(err)
	}
	if msg, err := runStarts.NextMsg(3 * time.Second); err != nil || msg.Subject != start {
		t.Fatalf("serve: got %v, %v; want the run-start on %s", msg, err, start)
	}
	instStart := sp + ".ep.v1.inst.manager." + m.Iid + ".run-start." + harness.OwnerA + ".cli.uid1.gen1.nonce2"
	if err := cli.Publish(instStart, []byte("start")); err != nil {
		t.Fatal(err)
	}
	if msg, err := inst.NextMsg(3 * time.Second); err != nil || msg.Subject != instStart {
		t.Fatalf("serve: got %v, %v; want the instance run-start on %s", msg, err, instStart)
	}
	answer := sp + ".ep.reply.manager." + m.Iid + ".0." + harness.OwnerA + ".cli.uid1.nonce1"
	if err := serve.Publish(answer, []byte("done")); err != nil {
		t.Fatal(err)
	}
	if msg, err := replies.NextMsg(3 * time.Second); err != nil || msg.Subject != answer {
		t.Fatalf("caller: got %v, %v; want serve's answer on %s", msg, err, answer)
	}
	if _, err := serve.SubscribeSync(sp + ".ep.v1.inst.manager." + other + ".>"); err != nil {
		t.Fatal(err)
	}
	serveErrs.WaitViolation(t, "Subscription", sp+".ep.v1.inst.manager."+other+".>")
	// The one-of run-starts only in its owner's queue group: not in another, not outside one.
	for _, queue := range []string{"thieves", ""} {
		errs := &harness.AsyncErrors{}
		nc := harness.DutyConn(t, p, m, harness.OwnerA, subjects.DutyServe, bundle.Credentials["serve"].JWT, errs.Option())
		if _, err := nc.QueueSubscribeSync(sp+".ep.v1.one.manager.run-start."+harness.OwnerA+".>", queue); err != nil {
			t.Fatal(err)
		}
		errs.WaitViolation(t, "Subscription", sp+".ep.v1.one.manager.run-start."+harness.OwnerA+".>")
	}

	// The others: one allowed publish each (no violation after a round trip), one refused.
	cases := []struct {
		duty    subjects.Duty
		allowed string
		refused string
	}{
		{subjects.DutySupervisor, subjects.EndpointSubject(harness.TestSpace, "manager-authority", harness.OwnerA, subjects.SupervisorActor(m.Iid)), sp + ".goal." + harness.OwnerA + ".g1"},
		{subjects.DutyExecutor, subjects.EndpointSubject(harness.TestSpace, "run-revoke", harness.OwnerA, subjects.ExecutorActor(m.Iid)), subjects.EndpointSubject(harness.TestSpace, "manager-authority", harness.OwnerA, subjects.SupervisorActor(m.Iid))},
		{subjects.DutyGoalWriter, sp + ".goal." + harness.OwnerA + ".g1", sp + ".goal." + harness.OwnerB + ".g1"},
		{subjects.DutySessionLedger, sp + ".session." + harness.OwnerA + ".s1", "$JS.API.STREAM.LIST"},
		{subjects.DutyServe, sp + ".ep.reply.manager." + m.Iid + ".x", sp + ".ep.reply.manager." + other + ".x"},
	}
	for _, c := range cases {
		t.Run(string(c.duty), func(t *testing.T) {
			errs := &harness.AsyncErrors{}
			nc := harness.DutyConn(t, p, m, harness.OwnerA, c.duty, bundle.Credentials[string(c.duty)].JWT, errs.Option())
			if err := nc.Publish(c.allowed, []byte("x")); err != nil {
				t.Fatal(err)
			}
			harness.Flush(t, nc)
			if err := errs.Violation(c.allowed); err != nil {
				t.Fatalf("publish %s: got %v, want it allowed", c.allowed, err)
			}
			if err := nc.Publish(c.refused, []byte("x")); err != nil {
				t.Fatal(err)
			}
			errs.WaitViolation(t, "Publish", c.refused)
		})
	}
}

// TestStandingCredentialIsDisconnectedByTheBrokerAtExpiry: with --standing-ttl 5s the broker,
// not the plane, ends a connection when its JWT expires.
func TestStandingCredentialIsDisconnectedByTheBrokerAtExpiry(t *testing.T) {
	t.Parallel()
	p := harness.StartPlane(t, func(c *service.Config) { c.StandingTTL = 5 * time.Second })
	harness.Grant(t, p, harness.OwnerA, "cli", "supervise")
	cli := harness.CallerConn(t, p, harness.OwnerA, "cli")
	m := harness.NewManagerKeys(t)
	prep := harness.MustMint(t, cli, harness.OwnerA, "cli", m.Body(t, "prepare", "cli"))
	if life := prep.Credentials["supervisor"].Exp - prep.IssuedAt/1000; life > 5 || life < 4 {
		t.Fatalf("got a %ds supervisor credential, want 5s", life)
	}
	closed := make(chan struct{})
	var mu sync.Mutex
	var reason error
	nc := harness.DutyConn(t, p, m, harness.OwnerA, subjects.DutySupervisor, prep.Credentials["supervisor"].JWT,
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
	harness.Flush(t, nc)
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
	p := harness.StartPlane(t, nil)
	harness.Grant(t, p, harness.OwnerA, "cli", "supervise")
	cli := harness.CallerConn(t, p, harness.OwnerA, "cli")
	account := p.Keys().Data.Public()
	m := harness.NewManagerKeys(t)
	first, act := harness.Registered(t, cli, harness.OwnerA, "cli", m)

	second := harness.MustMint(t, cli, harness.OwnerA, "cli", m.Body(t, "prepare", "cli"))
	if second.ProcessEpoch != first.ProcessEpoch+1 {
		t.Fatalf("re-registration: got epoch %d, want %d", second.ProcessEpoch, first.ProcessEpoch+1)
	}
	o := harness.Ask(t, cli, harness.OwnerA, "cli", subjects.EndpointManagerAuthority, harness.Renewal(m.Body(t, "renew", "cli"), act.NextRegistrationProof, account, first.ProcessEpoch))
	if o.Code != "conflict" || o.Numeric != 409 || !strings.Contains(o.Message, "processEpoch is stale") {
		t.Fatalf("renew at the old epoch: got %s %d %q, want conflict 409 processEpoch is stale", o.Code, o.Numeric, o.Message)
	}
	o = harness.Ask(t, cli, harness.OwnerA, "cli", subjects.EndpointManagerAuthority, harness.Renewal(m.Body(t, "renew", "cli"), act.NextRegistrationProof, account, second.ProcessEpoch))
	if o.Code != "permission-denied" {
		t.Fatalf("renew with the old registration's proof at the new epoch: got %q, want permission-denied", o.Code)
	}
	old := m.Body(t, "activate", "cli")
	old["registrationProof"] = first.RegistrationProof
	if o := harness.Ask(t, cli, harness.OwnerA, "cli", subjects.EndpointManagerAuthority, old); o.Code != "permission-denied" {
		t.Fatalf("activate with the previous registration's proof: got %q, want permission-denied", o.Code)
	}
	cur := m.Body(t, "activate", "cli")
	cur["registrationProof"] = second.RegistrationProof
	act2 := harness.MustMint(t, cli, harness.OwnerA, "cli", cur)
	harness.MustMint(t, cli, harness.OwnerA, "cli", harness.Renewal(m.Body(t, "renew", "cli"), act2.NextRegistrationProof, account, second.ProcessEpoch))
}

// TestManagerRenewsAsItsOwnSupervisor: the instance's own supervisor (and executor) credential
// renews with no ledger row of its own, cannot renew another instance, and is refused once the
// person who prepared it loses `supervise`.
func TestManagerRenewsAsItsOwnSupervisor(t *testing.T) {
	t.Parallel()
	p := harness.StartPlane(t, nil)
	harness.Grant(t, p, harness.OwnerA, "cli", "supervise")
	cli := harness.CallerConn(t, p, harness.OwnerA, "cli")
	account := p.Keys().Data.Public()
	m, other := harness.NewManagerKeys(t), harness.NewManagerKeys(t)
	prep, act := harness.Registered(t, cli, harness.OwnerA, "cli", m)
	_, otherAct := harness.Registered(t, cli, harness.OwnerA, "cli", other)

	supActor := subjects.SupervisorActor(m.Iid)
	sup := harness.DutyConn(t, p, m, harness.OwnerA, subjects.DutySupervisor, prep.Credentials["supervisor"].JWT)
	renewed := harness.MustMint(t, sup, harness.OwnerA, supActor, harness.Renewal(m.Body(t, "renew", supActor), act.NextRegistrationProof, account, 0))
	harness.WantDuties(t, "renew as supervisor", renewed, "supervisor", "executor")

	execActor := subjects.ExecutorActor(m.Iid)
	exe := harness.DutyConn(t, p, m, harness.OwnerA, subjects.DutyExecutor, renewed.Credentials["executor"].JWT)
	harness.MustMint(t, exe, harness.OwnerA, execActor, harness.Renewal(m.Body(t, "renewStandingBundle", execActor), act.NextRegistrationProof, account, 0))

	// Its credential speaks only for its own instance, even with the other's valid proof.
	o := harness.Ask(t, sup, harness.OwnerA, supActor, subjects.EndpointManagerAuthority, harness.Renewal(other.Body(t, "renew", supActor), otherAct.NextRegistrationProof, account, 0))
	if o.Code != "permission-denied" || len(o.Material.Credentials) != 0 {
		t.Fatalf("supervisor of %s renewing %s: got %q with %d credentials, want permission-denied and none", m.Iid, other.Iid, o.Code, len(o.Material.Credentials))
	}

	harness.Grant(t, p, harness.OwnerA, "cli") // the preparer loses every scope
	o = harness.Ask(t, sup, harness.OwnerA, supActor, subjects.EndpointManagerAuthority, harness.Renewal(m.Body(t, "renew", supActor), act.NextRegistrationProof, account, 0))
	if o.Code != "permission-denied" || !strings.Contains(o.Message, "whoever prepared") || strings.Contains(o.Message, harness.OwnerA+".cli") {
		t.Fatalf("renew after the preparer lost supervise: got %s %q, want permission-denied about the preparer, naming no other principal", o.Code, o.Message)
	}
}

// TestConcurrentRenewalsOfOneInstanceAllSucceed: mints on one gate contend on its CAS; the
// retry rule (content unchanged: retry) lets every one of them commit. Forty at once from one
// owner is past its budget of requests under way (--owner-in-flight): the budgets are lifted,
// as this tests the fence, not them.
func TestConcurrentRenewalsOfOneInstanceAllSucceed(t *testing.T) {
	t.Parallel()
	p := harness.StartPlane(t, func(c *service.Config) { harness.Unbudgeted(c); c.Workers = 8 })
	harness.Grant(t, p, harness.OwnerA, "cli", "supervise")
	cli := harness.CallerConn(t, p, harness.OwnerA, "cli")
	account := p.Keys().Data.Public()
	m := harness.NewManagerKeys(t)
	_, act := harness.Registered(t, cli, harness.OwnerA, "cli", m)

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
			o := harness.AskAsync(cli, harness.OwnerA, "cli", subjects.EndpointManagerAuthority, harness.Renewal(m.Body(t, op, "cli"), act.NextRegistrationProof, account, 0))
			if o.Code != "" || len(o.Material.Credentials) == 0 {
				errs <- fmt.Errorf("%s: got %q %q with %d credentials, want credentials", op, o.Code, o.Message, len(o.Material.Credentials))
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}
