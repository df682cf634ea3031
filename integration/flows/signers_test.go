package flows

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nkeys"

	"github.com/cotal-ai/authplane/client"
	"github.com/cotal-ai/authplane/integration/internal/harness"
	"github.com/cotal-ai/authplane/internal/capability/signers"
	"github.com/cotal-ai/authplane/internal/core/issue"
	"github.com/cotal-ai/authplane/internal/platform/broker"
	"github.com/cotal-ai/authplane/internal/platform/space"
	"github.com/cotal-ai/authplane/internal/testkit"
	"github.com/cotal-ai/authplane/service"
	"github.com/cotal-ai/authplane/subjects"
)

// TestTheKeyOfARegistrationThatNeverCommittedLeavesWithTheSweep: a first prepare's key is
// listed before it signs; the prepare then misses its deadline before its commit, so its gate
// is never written. The key stays listed until twice the request deadline and the replicas'
// clock skew have passed (the registration might still commit until then), and the next sweep
// takes it off; a prepare of the instance again lists it again and works.
func TestTheKeyOfARegistrationThatNeverCommittedLeavesWithTheSweep(t *testing.T) {
	t.Parallel()
	clock := &harness.FakeClock{}
	var stall atomic.Bool
	p := harness.StartPlane(t, func(c *service.Config) {
		c.Now = clock.Now
		c.RequestTimeout = 3 * time.Second
		c.Hooks = &service.Hooks{SignersRecheckEvery: 100 * time.Millisecond, BeforeCommit: func() {
			if stall.Load() {
				time.Sleep(3200 * time.Millisecond) // past the request's deadline
			}
		}}
	})
	harness.Grant(t, p, harness.OwnerA, "cli", "supervise")
	nc := harness.CallerConn(t, p, harness.OwnerA, "cli")
	m := harness.NewManagerKeys(t)
	stall.Store(true)
	if o := harness.AskWithin(10*time.Second, nc, harness.OwnerA, "cli", "manager-authority", m.Body(t, "prepare", "cli")); o.Code != "unavailable" {
		t.Fatalf("a prepare past its deadline: got %q %s, want unavailable", o.Code, o.Message)
	}
	stall.Store(false)
	if _, ok := harness.LiveSigners(t, p)[m.Iid]; !ok || !harness.Listed(t, p, m.Iid) {
		t.Fatalf("the key of the prepare that did not commit is not listed: it was not added before signing")
	}
	// Until the registration's deadline has passed twice over, and the skew, the key stays.
	clock.Advance(6*time.Second + time.Minute)
	time.Sleep(500 * time.Millisecond) // five recheck ticks
	if !harness.Listed(t, p, m.Iid) {
		t.Fatal("the key left before its registration could no longer commit")
	}
	clock.Advance(2 * time.Minute)
	testkit.CheckFor(t, 10*time.Second, 100*time.Millisecond, func() error {
		if harness.Listed(t, p, m.Iid) {
			return errors.New("the key of a registration that never committed is still listed")
		}
		return nil
	})
	if _, ok := harness.LiveSigners(t, p)[m.Iid]; ok {
		t.Fatal("the swept instance is still on the set")
	}
	prep := harness.MustMint(t, nc, harness.OwnerA, "cli", m.Body(t, "prepare", "cli"))
	if !harness.Listed(t, p, m.Iid) {
		t.Fatal("a prepare after the sweep did not list the key again")
	}
	harness.DutyConn(t, p, m, harness.OwnerA, subjects.DutySupervisor, prep.Credentials["supervisor"].JWT)
}

// TestAnInstancePastTheSpacesCapacityIsRefusedAndAnEndStillRevokes: the space holds as many
// live instances as the data account's JWT can list signing keys of within one broker message.
// With the set filled to one short of it, a first prepare of another owner takes the last
// place, and the next is refused resource-exhausted naming the capacity, having written and
// listed nothing; an end at the full capacity still takes its instance's key off (it needs no
// room), the broker refuses its credentials and closes their connections, and there is room
// again. The account JWT at the capacity is within one message.
func TestAnInstancePastTheSpacesCapacityIsRefusedAndAnEndStillRevokes(t *testing.T) {
	t.Parallel()
	// Every round signs and pushes an account JWT of about 1 MiB and reads it back from the
	// broker, and the first after the fill derives every instance's key (some 0.3 s; under the
	// race detector, a dozen): the test is about the capacity, not the deadline, so the plane
	// gets 40 s.
	p, pa, s := harness.SupervisedPlane(t, func(c *service.Config) { c.RequestTimeout = 40 * time.Second }, time.Now().Add(time.Hour))
	capacity := p.Info.InstanceCapacity
	if capacity < 10_000 || capacity > 15_000 {
		t.Fatalf("capacity %d instances under a 1 MiB broker message; want about 13,000", capacity)
	}
	harness.FillSigners(t, p, harness.OwnerA, capacity-2) // and s's own
	sup := harness.WatchDuty(t, p.NATSURL(), s, subjects.DutySupervisor, s.Prep.Credentials["supervisor"].JWT)

	harness.Grant(t, p, harness.OwnerB, "cli", "supervise")
	nc := harness.CallerConn(t, p, harness.OwnerB, "cli")
	last, extra := harness.NewManagerKeys(t), harness.NewManagerKeys(t)
	if o := harness.AskUntilAnswered(45*time.Second, nc, harness.OwnerB, "cli", "manager-authority", last.Body(t, "prepare", "cli")); o.Code != "" {
		t.Fatalf("a prepare that takes the last place: got %q %s", o.Code, o.Message)
	}
	before := harness.StoreSeqs(t, p)
	o := harness.AskWithin(20*time.Second, nc, harness.OwnerB, "cli", "manager-authority", extra.Body(t, "prepare", "cli"))
	if o.Code != "resource-exhausted" || !strings.Contains(o.Message, fmt.Sprintf("the space holds %d live manager instances", capacity)) {
		t.Fatalf("a prepare past the capacity: got %q %s, want resource-exhausted naming the capacity", o.Code, o.Message)
	}
	harness.WantUnwritten(t, p, "a prepare past the capacity", before.Except(subjects.AuditStream(harness.TestSpace)))
	if harness.Listed(t, p, extra.Iid) {
		t.Fatal("the refused instance's key is listed")
	}

	// The plane has 40 s for the end; the caller waits as long.
	ctx, cancel := context.WithTimeout(context.Background(), 45*time.Second)
	defer cancel()
	r, err := pa.C.End(ctx, client.End{Owner: s.Owner, InstanceID: s.M.Iid, LifecycleUID: s.M.Uid, Reason: "the engagement is over"})
	if err != nil || !r.Done || !r.Revoked.Done {
		t.Fatalf("an end at the capacity: %+v, %v; want done", r, err)
	}
	sup.WantEvicted(t, subjects.DutySupervisor)
	harness.WantRefusedToConnect(t, p.NATSURL(), s, subjects.DutySupervisor, s.Prep.Credentials["supervisor"].JWT)
	claims, size := harness.DataAccountAtBroker(t, p)
	if len(claims.SigningKeys) != capacity || size > 1<<20 {
		t.Errorf("the broker's account JWT: %d signing keys in %d bytes, want %d within one 1 MiB message", len(claims.SigningKeys), size, capacity)
	}
	if o := harness.AskUntilAnswered(45*time.Second, nc, harness.OwnerB, "cli", "manager-authority", extra.Body(t, "prepare", "cli")); o.Code != "" {
		t.Fatalf("a prepare once an end made room: got %q %s", o.Code, o.Message)
	}
}

// TestAnEndTheBrokerDoesNotConfirmByTheDeadlineAnswersUnavailableAndARepeatConfirmsIt: the
// broker takes the end's account JWT, but every read-back shows it as it was before the end (a
// fault injected between the plane and the broker: a server that lags, or something pushing
// an older JWT), so no server is seen to drop the instance's key. The end still ends and
// retires the lifecycle, answers unavailable by its deadline with the report (its key off the
// set, its keys not known revoked), and nothing is minted under the lifecycle after it; once the
// read-back shows what the broker holds, a repeat of the end confirms the revocation.
func TestAnEndTheBrokerDoesNotConfirmByTheDeadlineAnswersUnavailableAndARepeatConfirmsIt(t *testing.T) {
	t.Parallel()
	lag := &laggingBroker{}
	p, pa, s := harness.SupervisedPlane(t, func(c *service.Config) {
		c.RequestTimeout = 5 * time.Second
		if c.Hooks == nil {
			c.Hooks = &service.Hooks{}
		}
		c.Hooks.SignersBroker = func(b signers.Broker) signers.Broker { lag.Broker = b; return lag }
	}, time.Now().Add(time.Hour))
	_, before := heldAccount(t, p)
	lag.show(before)

	_, err := pa.End(s)
	var refusal *client.Refusal
	if !errors.As(err, &refusal) || refusal.Code != "unavailable" || !strings.Contains(refusal.Message, "did not confirm") {
		t.Fatalf("an end the broker does not confirm: got %v, want unavailable saying the broker did not confirm", err)
	}
	var report client.EndReport
	if err := json.Unmarshal(refusal.Details, &report); err != nil {
		t.Fatalf("the refusal's details %s: %v", refusal.Details, err)
	}
	if report.Assignment.State != client.StateEnded || report.Retired.Gate != "retired" || report.Done || report.Revoked.Done ||
		len(report.Revoked.NKeys) == 0 || !slices.Equal(report.Revoked.Unrevoked, report.Revoked.NKeys) {
		t.Fatalf("the report: got %+v, want the lifecycle ended and retired and every key unrevoked", report)
	}
	if _, ok := harness.LiveSigners(t, p)[s.M.Iid]; ok {
		t.Errorf("the ended instance is still on the signer set")
	}
	before2 := harness.StoreSeqs(t, p)
	_, err = pa.Authority(s, client.OpRenew)
	harness.WantRefusalOf(t, "supervisor-authority after the unconfirmed end", err, "permission-denied", endedText(s.Owner))
	harness.WantUnwritten(t, p, "a renewal after the unconfirmed end", before2)

	lag.show("")
	r, err := pa.End(s)
	if err != nil || !r.Done || !r.Revoked.Done || len(r.Revoked.Unrevoked) != 0 || !slices.Equal(r.Revoked.NKeys, report.Revoked.NKeys) {
		t.Fatalf("the repeated end: %+v, %v; want done, every key revoked", r, err)
	}
	if harness.Listed(t, p, s.M.Iid) {
		t.Errorf("after the repeat, the broker lists the ended instance's key")
	}
	harness.WantRefusedToConnect(t, p.NATSURL(), s, subjects.DutySupervisor, s.Prep.Credentials["supervisor"].JWT)
}

// laggingBroker is the signer set's broker with its read-backs replaced, while shown is
// set, by that account JWT on every server.
type laggingBroker struct {
	signers.Broker
	mu    sync.Mutex
	shown string
}

func (l *laggingBroker) show(token string) {
	l.mu.Lock()
	l.shown = token
	l.mu.Unlock()
}

func (l *laggingBroker) Lookup(ctx context.Context, n int) ([]string, error) {
	l.mu.Lock()
	shown := l.shown
	l.mu.Unlock()
	if shown == "" {
		return l.Broker.Lookup(ctx, n)
	}
	return slices.Repeat([]string{shown}, n), nil
}

// heldAccount returns the data account as the plane's system user reaches it, and the account
// JWT the broker holds now.
func heldAccount(t testing.TB, p *harness.TestPlane) (broker.Account, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	acct := broker.Account{NC: harness.SystemConn(t, p), Public: p.Account()}
	tokens, err := acct.Lookup(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	return acct, tokens[0]
}

// TestAnOlderAccountJWTPushedAfterAnEndIsUndoneByTheRecheck: something else pushes the data
// account's JWT as it was before an end (a push replaces what the broker holds, whatever its
// issue time), so the broker lists the ended instance's key again and takes its credentials.
// The plane's recheck finds the broker listing a key off the set and signs and pushes the set
// again: the credentials are refused again.
func TestAnOlderAccountJWTPushedAfterAnEndIsUndoneByTheRecheck(t *testing.T) {
	t.Parallel()
	p, pa, s := harness.SupervisedPlane(t, func(c *service.Config) {
		if c.Hooks == nil {
			c.Hooks = &service.Hooks{}
		}
		c.Hooks.SignersRecheckEvery = 200 * time.Millisecond
	}, time.Now().Add(time.Hour))
	acct, older := heldAccount(t, p)
	r, err := pa.End(s)
	if err != nil || !r.Done {
		t.Fatalf("the end: %+v, %v; want done", r, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := acct.Push(ctx, older); err != nil {
		t.Fatal(err)
	}
	if !harness.Listed(t, p, s.M.Iid) {
		t.Fatal("after the older JWT's push the broker does not list the ended instance's key: the push did not take")
	}
	// The recheck leaves the set to the end's own round for signers.RecheckGrace after its
	// signing, then signs it again.
	testkit.CheckFor(t, signers.RecheckGrace+20*time.Second, 100*time.Millisecond, func() error {
		if harness.Listed(t, p, s.M.Iid) {
			return errors.New("the broker lists the ended instance's key")
		}
		return nil
	})
	harness.WantRefusedToConnect(t, p.NATSURL(), s, subjects.DutySupervisor, s.Prep.Credentials["supervisor"].JWT)
}

// TestTheSpacesInstanceCapacityIsWhatOneBrokerMessageCarries: the data account's JWT signed
// listing as many instance keys as the plane's capacity says is taken by the broker and fills
// at least 99% of its largest message (1 MiB here); one with 1% more keys is over it and
// refused. The capacity is the ceiling, measured, not a guess.
func TestTheSpacesInstanceCapacityIsWhatOneBrokerMessageCarries(t *testing.T) {
	t.Parallel()
	p := harness.StartPlane(t, nil)
	capacity := p.Info.InstanceCapacity
	keys := p.Keys()
	sys := harness.SystemConn(t, p)
	push := func(n int) (int, error) {
		pubs := make([]string, n)
		for i := range pubs {
			raw := make([]byte, 32)
			binary.BigEndian.PutUint32(raw, uint32(i))
			raw[31] = 0xa5
			k, err := nkeys.Encode(nkeys.PrefixByteAccount, raw) // a valid account key, cheaply
			if err != nil {
				t.Fatal(err)
			}
			pubs[i] = string(k)
		}
		token, _, err := keys.DataAccountJWT(space.DataPolicy{MaxConnections: 10_000, Signers: pubs})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		return len(token), broker.PushAccount(ctx, sys, keys.Data.Public(), token)
	}
	maxPayload := int(sys.MaxPayload())
	if size, err := push(capacity); err != nil || size < maxPayload*99/100 {
		t.Fatalf("the account JWT at the capacity (%d keys, %d bytes): %v; want it taken, and at least 99%% of the broker's %d-byte message", capacity, size, err, maxPayload)
	}
	if size, err := push(capacity * 101 / 100); err == nil || size <= maxPayload {
		t.Fatalf("the account JWT 1%% past the capacity (%d bytes): %v, want it over the broker's %d bytes and refused", size, err, maxPayload)
	}
}

// TestTheEvictionWaitCountsAJWTUserByItsJWTWhateverNameItSent: the broker's connection listing
// filters on the user name a client sends beside its JWT, so an end waiting for a revoked key's
// connections to go must not ask it by name. A connection that sent another user's key as its
// name, one that sent any name and one that sent none are each listed as the key their JWT is
// for, and signed by the key that signed it, and only as that.
func TestTheEvictionWaitCountsAJWTUserByItsJWTWhateverNameItSent(t *testing.T) {
	t.Parallel()
	p := harness.StartPlane(t, nil)
	newUser := func() (nkeys.KeyPair, string) {
		kp, err := nkeys.CreateUser()
		if err != nil {
			t.Fatal(err)
		}
		pub, _ := kp.PublicKey()
		return kp, pub
	}
	connect := func(kp nkeys.KeyPair, sent string) {
		t.Helper()
		harness.ConnectSendingName(t, p, kp, "u_aaaaaaaaaaaaaaaaaaaaaaaaaa.evicted", sent)
	}
	kpA, a := newUser()
	kpB, b := newUser()
	kpC, _ := newUser()
	_, absent := newUser()
	connect(kpA, b)       // A sends B's key as its name
	connect(kpB, "decoy") // B sends a name like no key
	connect(kpB, "")      // and B again, with no name
	connect(kpC, "")

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	conns, _, err := broker.Account{NC: harness.SystemConn(t, p), Public: p.Account()}.ListConnections(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	signer, err := p.Keys().Data.Signer.PublicKey()
	if err != nil {
		t.Fatal(err)
	}
	held := map[string]int{}
	for _, c := range conns {
		if c.Principal == "u_aaaaaaaaaaaaaaaaaaaaaaaaaa.evicted" {
			held[c.User]++
			if c.Signer != signer {
				t.Errorf("connection %d: signed by %q, want %s", c.CID, c.Signer, signer)
			}
		}
	}
	if held[a] != 1 || held[b] != 2 || held[absent] != 0 || len(held) != 3 {
		t.Fatalf("connections listed by JWT subject: got %v, want A once and B twice, as C once (%s, %s)", held, a, b)
	}
}

// TestAFirstPrepareRefusedAtItsCommitTakesItsKeyOffAndSpendsItsBudget: two first prepares of
// an owner with a quota of one meet at the commit, each having listed its instance's key before
// it signed; one registers, the other is refused resource-exhausted at the quota's step and
// discarded. The refused one's key leaves the set and the broker's account JWT within seconds,
// long before the sweep could take it (twice the request deadline and the clock skew: 130 s),
// the winner's stays listed and its credential connects, and the owner's new-keys budget is
// spent for both: six keys each, the instance's signing key with its five identities.
func TestAFirstPrepareRefusedAtItsCommitTakesItsKeyOffAndSpendsItsBudget(t *testing.T) {
	t.Parallel()
	hold := &siblingHold{}
	p := harness.StartPlane(t, func(c *service.Config) {
		c.MaxInstancesPerOwner, c.NewKeysPerOwner, c.Rate = 1, 100, 0
		c.Workers = 32 // a sibling meets the held worker 1 time in 32
		c.Hooks = &service.Hooks{BeforeCommit: hold.hook}
	})
	harness.Grant(t, p, harness.OwnerA, "cli", "supervise")
	cli := harness.CallerConn(t, p, harness.OwnerA, "cli")
	ms := []*harness.ManagerKeys{harness.NewManagerKeys(t), harness.NewManagerKeys(t)}
	got := make([]harness.Outcome, 2)
	held, answered := hold.arm(), make(chan struct{})
	go func() {
		defer close(answered)
		got[0] = harness.AskAsync(cli, harness.OwnerA, "cli", subjects.EndpointManagerAuthority, ms[0].Body(t, "prepare", "cli"))
	}()
	select { // the second starts while the first waits at its commit
	case <-held:
	case <-answered:
		t.Fatalf("the first prepare was answered before its commit: %s %q", got[0].Code, got[0].Message)
	}
	got[1] = harness.AskAsync(cli, harness.OwnerA, "cli", subjects.EndpointManagerAuthority, ms[1].Body(t, "prepare", "cli"))
	<-answered
	win, lose := 0, 1
	if got[0].Code != "" {
		win, lose = 1, 0
	}
	if got[win].Code != "" || got[lose].Code != "resource-exhausted" || !strings.Contains(got[lose].Message, "--max-instances-per-owner") {
		t.Fatalf("two first prepares at a quota of one: got %s %q and %s %q, want one issued and one refused at the quota",
			got[0].Code, got[0].Message, got[1].Code, got[1].Message)
	}
	if n := countMsgs(t, p, subjects.AuditStream(harness.TestSpace), subjects.AuditSubject(harness.TestSpace, "discarded", harness.OwnerA, "cli")); n != 1 {
		t.Fatalf("%d prepares were discarded at their commit, want the refused one: the test did not race", n)
	}
	testkit.CheckFor(t, 15*time.Second, 100*time.Millisecond, func() error {
		if _, ok := harness.LiveSigners(t, p)[ms[lose].Iid]; ok || harness.Listed(t, p, ms[lose].Iid) {
			return errors.New("the key of the prepare refused at its commit is still listed")
		}
		return nil
	})
	if !harness.Listed(t, p, ms[win].Iid) {
		t.Fatal("the registered instance's key is not listed")
	}
	harness.DutyConn(t, p, ms[win], harness.OwnerA, subjects.DutySupervisor, got[win].Material.Credentials["supervisor"].JWT)
	var left struct {
		Tokens float64 `json:"tokens"`
	}
	harness.ReadRecord(t, p, subjects.AuthBucket(harness.TestSpace), "$KV."+subjects.AuthBucket(harness.TestSpace)+"."+subjects.BudgetKey(issue.NewKeysOwner, harness.OwnerA), &left)
	if left.Tokens > 100-12+0.5 {
		t.Errorf("the owner's new-keys budget holds %.2f of 100 after two first prepares, want 88: six keys each, the refused one's too", left.Tokens)
	}
}
