package powercut

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	mrand "math/rand/v2"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"

	"github.com/cotal-ai/authplane/admin"
	"github.com/cotal-ai/authplane/client"
	"github.com/cotal-ai/authplane/integration/internal/harness"
	"github.com/cotal-ai/authplane/internal/platform/space"
	"github.com/cotal-ai/authplane/subjects"
)

// The load: requesters in this process, each on connections of its own, that drive the plane
// until the cut and log what it acknowledged (acks). Managers of ownerA (prepares, activates,
// renewals, re-registrations, runs admitted, taken over and revoked) through ownerA.cli; a
// platform admin assigning, registering and ending supervised managers of fresh owners; an
// operator changing scopes of ownerB's principals (`authplane grant`); agents of ownerB whose
// secrets are set, exchanged for bearers on the HTTP face, and revoked.

// Requesters of each kind.
const (
	managerRequesters    = 2
	supervisorRequesters = 2
	// requestTimeout bounds one request: past the plane's own deadline (5 s), so a request the
	// plane gave up on is answered.
	requestTimeout = 10 * time.Second
)

// Principals of the load.
const (
	cliActor     = "cli"
	starterActor = "starter"
	adminActor   = "admin"
)

// grantees and agentActors are ownerB's principals whose scopes and secrets the load changes.
var (
	grantees    = []string{"g0", "g1", "g2", "g3"}
	agentActors = []string{"agent0", "agent1"}
)

// life is what outlives a cut: the disk (the plane restarts on it) and the load's managers.
type life struct {
	managers [][]*mgr // each manager requester's own
}

// target is a running plane as the load and the checks reach it.
type target struct {
	url      string   // the broker: every server of a cluster
	servers  []string // each server's URL
	keys     *space.Keys
	spaceDir string
	http     string // the plane's loopback face
	cap      string // its capability
}

// load is one trial's load.
type load struct {
	a    *acks
	lf   *life
	tg   target
	stop chan struct{}
	// base is every request's context: ended at the cut, so none waits out its timeout.
	base   context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
	// closers close the load's connections once it has stopped.
	closers []func()
}

// startLoad connects the requesters to tg and starts them; seed makes the trial's choices.
func startLoad(t *testing.T, tg target, a *acks, lf *life, seed uint64) *load {
	t.Helper()
	l := &load{a: a, lf: lf, tg: tg, stop: make(chan struct{})}
	l.base, l.cancel = context.WithCancel(context.Background())
	// The requesters' slots exist before any requester starts: each one reads its own.
	for len(lf.managers) < managerRequesters {
		lf.managers = append(lf.managers, nil)
	}
	for i := range managerRequesters {
		cli := l.caller(t, harness.OwnerA, cliActor)
		starter := l.caller(t, harness.OwnerA, starterActor).Conn()
		rng := mrand.New(mrand.NewPCG(seed, uint64(i)))
		l.run(func() bool { return l.managerStep(rng, cli, starter, &lf.managers[i]) })
	}
	for range supervisorRequesters {
		pa := l.caller(t, harness.OwnerP, adminActor)
		l.run(func() bool { return l.supervisorStep(pa) })
	}
	grng := mrand.New(mrand.NewPCG(seed, 100))
	l.run(func() bool { return l.grantStep(grng) })
	arng := mrand.New(mrand.NewPCG(seed, 101))
	l.run(func() bool { return l.agentStep(arng) })
	return l
}

// caller connects as owner.actor with a caller credential (`authplane creds`); it reconnects
// to another server of a cluster while one is cut, until the load stops.
func (l *load) caller(t *testing.T, owner, actor string) *client.Client {
	t.Helper()
	c, err := client.Connect(l.tg.url, harness.TestSpace, owner, actor, nats.UserCredentials(callerCreds(t, l.tg.keys, owner, actor)),
		nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond))
	if err != nil {
		t.Fatalf("connect as %s: %v", subjects.Principal(owner, actor), err)
	}
	l.closers = append(l.closers, c.Close)
	return c
}

// credsFiles are the caller credentials written so far, by data account and principal: each
// is good for an hour, longer than a life's trials.
var credsFiles sync.Map

// callerCreds is a caller credential file for owner.actor of the space keys serve.
func callerCreds(t *testing.T, keys *space.Keys, owner, actor string) string {
	t.Helper()
	key := keys.Data.Public() + " " + subjects.Principal(owner, actor)
	if path, ok := credsFiles.Load(key); ok {
		return path.(string)
	}
	path := harness.WriteCallerCreds(t, keys, owner, actor)
	credsFiles.Store(key, path)
	return path
}

// run runs step until the load stops or step reports that it cannot go on.
func (l *load) run(step func() bool) {
	l.wg.Go(func() {
		for !l.stopped() && step() {
		}
	})
}

func (l *load) stopped() bool {
	select {
	case <-l.stop:
		return true
	default:
		return false
	}
}

// finish stops the load, waits for every requester and closes the connections.
func (l *load) finish() {
	close(l.stop)
	l.cancel()
	l.wg.Wait()
	for _, c := range l.closers {
		c()
	}
}

// ctx is one request's context.
func (l *load) ctx() (context.Context, context.CancelFunc) {
	return context.WithTimeout(l.base, requestTimeout)
}

// gone says the plane is gone (the connection closed): the requester stops.
func gone(err error) bool {
	return errors.Is(err, nats.ErrConnectionClosed) || errors.Is(err, nats.ErrConnectionDraining)
}

// managerStep does one thing with ownerA's managers: registers one, renews one, registers one
// again (a new epoch), or starts a run, admits it and takes it over, and revokes it half the
// time.
func (l *load) managerStep(rng *mrand.Rand, cli *client.Client, starter *nats.Conn, managers *[]*mgr) bool {
	var ready []*mgr
	for _, m := range *managers {
		if m.ok {
			ready = append(ready, m)
		}
	}
	switch r := rng.Float64(); {
	case len(ready) < 2 || r < 0.15:
		return l.register(cli, managers)
	case r < 0.45:
		return l.renew(rng, cli, ready[rng.IntN(len(ready))])
	case r < 0.55:
		return l.reregister(cli, ready[rng.IntN(len(ready))])
	default:
		return l.runOnce(rng, cli, starter, ready[rng.IntN(len(ready))])
	}
}

// register prepares and activates a fresh manager.
func (l *load) register(cli *client.Client, managers *[]*mgr) bool {
	m, keys, err := client.NewManager()
	if err != nil {
		panic(err)
	}
	mg := &mgr{m: m, keys: keys}
	*managers = append(*managers, mg)
	return l.prepare(cli, mg)
}

// reregister prepares mg again, which advances its epoch, and activates it.
func (l *load) reregister(cli *client.Client, mg *mgr) bool {
	mg.ok = false
	return l.prepare(cli, mg)
}

// prepare prepares and activates mg; it is ok again only if the prepare was acknowledged.
func (l *load) prepare(cli *client.Client, mg *mgr) bool {
	c, cancel := l.ctx()
	defer cancel()
	prep, err := cli.Prepare(c, mg.m)
	if err != nil {
		l.a.refused(client.OpPrepare, err)
		return !gone(err)
	}
	var old *client.Renewal
	if mg.cur.Proof != "" {
		prev := mg.cur
		old = &prev
	}
	acked := l.a.material(mg.m, mg.keys, prep.Credentials)
	l.a.ack(kindEpoch, epochAck{Instance: mg.m.InstanceID, Epoch: prep.ProcessEpoch}, func() {
		l.a.epochs[mg.m.InstanceID] = &epochAck{Instance: mg.m.InstanceID, Epoch: prep.ProcessEpoch, Trial: l.a.trial, mgr: mg, old: old}
	})
	act, err := cli.Activate(c, mg.m, prep.RegistrationProof)
	if err != nil {
		l.a.refused(client.OpActivate, err)
		return !gone(err)
	}
	l.a.material(mg.m, mg.keys, act.Credentials)
	mg.cur, mg.ok = act.Renewal(), acked
	return true
}

// renew renews mg: its supervisor and executor, or all five.
func (l *load) renew(rng *mrand.Rand, cli *client.Client, mg *mgr) bool {
	c, cancel := l.ctx()
	defer cancel()
	op, renew := client.OpRenew, cli.Renew
	if rng.IntN(2) == 1 {
		op, renew = client.OpRenewStandingBundle, cli.RenewStandingBundle
	}
	mat, err := renew(c, mg.m, mg.cur)
	if err != nil {
		l.a.refused(op, err)
		return !gone(err)
	}
	l.a.material(mg.m, mg.keys, mat.Credentials)
	return true
}

// runOnce publishes a run-start as ownerA.starter, admits it for mg, takes it over at (1, 1)
// with fresh driver and mediator keys, and revokes it half the time.
func (l *load) runOnce(rng *mrand.Rand, cli *client.Client, starter *nats.Conn, mg *mgr) bool {
	runID := client.NewRunID()
	rs := subjects.RunStart{Space: harness.TestSpace, Route: subjects.RouteOne, Owner: harness.OwnerA, Actor: starterActor,
		UID: mg.m.LifecycleUID, Generation: "1", Nonce: hex.EncodeToString(random(12))}
	if err := starter.Publish(rs.Subject(), []byte(`{}`)); err != nil {
		return !gone(err)
	}
	if err := starter.Flush(); err != nil {
		return !gone(err)
	}
	c, cancel := l.ctx()
	defer cancel()
	// The witness stores the run-start without an ack: ask until it has.
	var err error
	for {
		if _, err = cli.Admit(c, mg.m, mg.cur, runID, rs.Subject()); err == nil || !strings.Contains(err.Error(), "not witnessed") || c.Err() != nil {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err != nil {
		l.a.refused("admission", err)
		return !gone(err)
	}
	run := &runAck{RunID: runID, Instance: mg.m.InstanceID, mgr: mg}
	l.a.ack(kindAdmission, *run, func() { run.Trial = l.a.trial; l.a.runs[runID] = run })
	driver, mediator := userKey(), userKey()
	a := client.Attempt{RunID: runID, TakeoverID: hex.EncodeToString(random(8)), Epoch: 1, FencingToken: 1,
		DriverID: public(driver), MediatorID: public(mediator)}
	rm, err := cli.Attempt(c, mg.m, mg.cur, a)
	if err != nil {
		l.a.refused("attempt", err)
		return !gone(err)
	}
	l.a.material(mg.m, map[subjects.Duty]nkeys.KeyPair{subjects.DutyDriver: driver, subjects.DutyMediator: mediator}, rm.Credentials)
	l.a.ack(kindAttempt, map[string]any{"runId": runID, "epoch": 1, "fencingToken": 1}, func() { run.Epoch, run.Token = 1, 1 })
	if rng.IntN(2) == 0 {
		return true
	}
	if _, err := cli.Revoke(c, mg.m, mg.cur, runID, "the power-cut test revokes it"); err != nil {
		l.a.refused("run-revoke", err)
		return !gone(err)
	}
	l.a.ack(kindRunRevoke, map[string]any{"runId": runID, "instance": mg.m.InstanceID}, func() { l.a.revoked[runID] = run })
	return true
}

// supervisorStep assigns a fresh owner's manager to the platform admin, registers it (prepare
// and activate through supervisor-authority), renews it and ends it.
func (l *load) supervisorStep(pa *client.Client) bool {
	m, keys, err := client.NewManager()
	if err != nil {
		panic(err)
	}
	owner := newOwner()
	end := &endAck{Owner: owner, Instance: m.InstanceID, Lifecycle: m.LifecycleUID}
	c, cancel := l.ctx()
	defer cancel()
	a, err := pa.Assign(c, client.Assign{Owner: owner, InstanceID: m.InstanceID, LifecycleUID: m.LifecycleUID, ExpiresAt: time.Now().Add(time.Hour).Unix()})
	if err != nil {
		l.a.refused("supervisor-assign", err)
		return !gone(err)
	}
	l.a.ack(kindAssign, end, func() { end.Trial = l.a.trial; l.a.assigned[m.InstanceID] = end })
	authority := func(op string, set func(*client.SupervisorAuthority)) *client.Material {
		b := pa.SupervisorBody(owner, a.Revision, op, m)
		if set != nil {
			set(&b)
		}
		mat, err := pa.SupervisorAuthority(c, b)
		if err != nil {
			l.a.refused("supervisor-authority "+op, err)
			return nil
		}
		l.a.material(m, keys, mat.Credentials)
		return mat
	}
	prep := authority(client.OpPrepare, nil)
	if prep == nil {
		return !l.stopped()
	}
	act := authority(client.OpActivate, func(b *client.SupervisorAuthority) { b.Request.RegistrationProof = &prep.RegistrationProof })
	if act == nil {
		return !l.stopped()
	}
	r := act.Renewal()
	if authority(client.OpRenewStandingBundle, func(b *client.SupervisorAuthority) {
		b.Request.RegistrationProof, b.Request.AccountPublicKey, b.Request.ProcessEpoch = &r.Proof, &r.Account, &r.Epoch
	}) == nil {
		return !l.stopped()
	}
	return l.end(pa, end)
}

// end ends an assignment: under way until acknowledged done.
func (l *load) end(pa *client.Client, end *endAck) bool {
	l.a.mu.Lock()
	l.a.underway[end.Instance] = end
	l.a.mu.Unlock()
	c, cancel := l.ctx()
	defer cancel()
	r, err := pa.End(c, client.End{Owner: end.Owner, InstanceID: end.Instance, LifecycleUID: end.Lifecycle, Reason: "the power-cut test ends it"})
	if err == nil && !r.Done {
		err = fmt.Errorf("the end answered not done: %+v", r)
	}
	if err != nil {
		l.a.refused("supervisor-end", err)
		return !gone(err)
	}
	l.a.ack(kindEnd, end, func() {
		delete(l.a.underway, end.Instance)
		l.a.ends[end.Instance] = end
	})
	return true
}

// grantStep gives one of ownerB's grantees `supervise`, or takes it away, as `authplane grant`
// does: a pending scope until acknowledged.
func (l *load) grantStep(rng *mrand.Rand) bool {
	actor := grantees[rng.IntN(len(grantees))]
	principal := subjects.Principal(harness.OwnerB, actor)
	l.a.mu.Lock()
	s := l.a.scopes[principal]
	if s == nil {
		s = &scopeAck{}
		l.a.scopes[principal] = s
	}
	scope := []string{"supervise"}
	if len(s.Scope) > 0 {
		scope = []string{}
	}
	s.pending = append(s.pending, scope)
	l.a.mu.Unlock()
	c, cancel := l.ctx()
	defer cancel()
	if _, err := admin.Grant(c, l.tg.keys, l.tg.url, harness.OwnerB, actor, scope); err != nil {
		l.a.refused("grant", err)
		return !l.stopped()
	}
	l.a.ack(kindScope, map[string]any{"principal": principal, "scope": scope}, func() {
		s.Scope, s.Trial, s.pending = scope, l.a.trial, nil
	})
	return true
}

// agentStep sets one of ownerB's agents a fresh secret and exchanges it for a bearer on the
// loopback face, or revokes it: pending until acknowledged.
func (l *load) agentStep(rng *mrand.Rand) bool {
	actor := agentActors[rng.IntN(len(agentActors))]
	principal := subjects.Principal(harness.OwnerB, actor)
	l.a.mu.Lock()
	ag := l.a.agents[principal]
	if ag == nil {
		ag = &agentAck{Revoked: true}
		l.a.agents[principal] = ag
	}
	revoke := !ag.Revoked && rng.IntN(3) == 0
	ag.pending = true
	l.a.mu.Unlock()
	c, cancel := l.ctx()
	defer cancel()
	if revoke {
		if _, err := admin.RevokeAgent(c, l.tg.keys, l.tg.url, harness.OwnerB, actor); err != nil {
			l.a.refused("agent revoke", err)
			return !l.stopped()
		}
		l.a.ack(kindAgent, map[string]any{"principal": principal, "revoked": true}, func() {
			ag.Revoked, ag.Trial, ag.pending = true, l.a.trial, false
		})
		return true
	}
	secret, _, err := admin.SetAgent(c, l.tg.keys, l.tg.url, harness.OwnerB, actor)
	if err != nil {
		l.a.refused("agent set", err)
		return !l.stopped()
	}
	bearer, err := exchange(c, l.tg, harness.OwnerB, actor, secret)
	if err != nil {
		l.a.refused("agent exchange", err)
		return !l.stopped()
	}
	l.a.ack(kindAgent, map[string]any{"principal": principal, "revoked": false}, func() {
		ag.Revoked, ag.Trial, ag.pending, ag.secret, ag.bearer = false, l.a.trial, false, secret, bearer
	})
	return true
}

// exchange exchanges an agent's secret for a bearer on the loopback face.
func exchange(c context.Context, tg target, owner, actor, secret string) (harness.Exchanged, error) {
	var e harness.Exchanged
	body, _ := json.Marshal(map[string]string{"owner": owner, "actor": actor, "actorToken": secret})
	req, err := http.NewRequestWithContext(c, http.MethodPost, tg.http+"/exchange", bytes.NewReader(body))
	if err != nil {
		return e, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+tg.cap)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return e, err
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		return e, err
	}
	if resp.StatusCode != http.StatusOK {
		return e, &client.Refusal{Code: fmt.Sprint(resp.StatusCode), Numeric: resp.StatusCode, Message: string(raw)}
	}
	if err := json.Unmarshal(raw, &e); err != nil || e.Token == "" {
		return e, fmt.Errorf("exchange: %s: %v", raw, err)
	}
	return e, nil
}

func random(n int) []byte {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		panic(err)
	}
	return b
}

func userKey() nkeys.KeyPair {
	kp, err := nkeys.CreateUser()
	if err != nil {
		panic(err)
	}
	return kp
}

func public(kp nkeys.KeyPair) string {
	p, err := kp.PublicKey()
	if err != nil {
		panic(err)
	}
	return p
}

// newOwner is a fresh `u_` owner.
func newOwner() string {
	const alphabet = "abcdefghijklmnopqrstuvwxyz234567"
	b := random(26)
	for i := range b {
		b[i] = alphabet[int(b[i])%len(alphabet)]
	}
	return "u_" + string(b)
}
