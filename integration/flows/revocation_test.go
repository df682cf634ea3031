package flows

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nkeys"

	"github.com/cotal-ai/authplane/client"
	"github.com/cotal-ai/authplane/integration/internal/harness"
	"github.com/cotal-ai/authplane/internal/broker"
	"github.com/cotal-ai/authplane/internal/revocation"
	"github.com/cotal-ai/authplane/internal/space"
	"github.com/cotal-ai/authplane/internal/testkit"
	"github.com/cotal-ai/authplane/service"
	"github.com/cotal-ai/authplane/subjects"
)

// dataAccountAtBroker returns the data account's claims as the plane's broker holds them,
// read as the plane's system user reads them, and the JWT's size.
func dataAccountAtBroker(t testing.TB, p *harness.TestPlane) (*jwt.AccountClaims, int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	tokens, err := broker.Account{NC: harness.SystemConn(t, p), Public: p.Account()}.Lookup(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	claims, err := jwt.DecodeAccountClaims(tokens[0])
	if err != nil {
		t.Fatal(err)
	}
	return claims, len(tokens[0])
}

// revocationSet reads the data account's revocation set from the fence bucket.
func revocationSet(t testing.TB, p *harness.TestPlane) map[string]int64 {
	t.Helper()
	var set struct {
		Revoked map[string]int64 `json:"revoked"`
	}
	harness.ReadRecord(t, p, subjects.AuthBucket(harness.TestSpace), "$KV."+subjects.AuthBucket(harness.TestSpace)+"."+subjects.RevocationsKey(p.Account()), &set)
	return set.Revoked
}

// latestExp is the latest expiry among the credentials of materials.
func latestExp(materials ...*client.Material) int64 {
	var e int64
	for _, m := range materials {
		for _, c := range m.Credentials {
			e = max(e, c.Exp)
		}
	}
	return e
}

// TestARevokedKeyLeavesTheSetOnceEveryCredentialItRevokedHasExpiredAndNeverBefore: an end
// revokes its keys at the plane's time plus the skew; they stay on the set and in the account
// JWT the broker holds while any credential they revoke could be live, and the first end past
// the longest life of any credential (plus the skew) drops them from both. The plane runs on
// a test clock that jumps a day (service.Config.Now: the wall clock cannot be moved here).
func TestARevokedKeyLeavesTheSetOnceEveryCredentialItRevokedHasExpiredAndNeverBefore(t *testing.T) {
	t.Parallel()
	clock := &harness.FakeClock{}
	p, pa, first := harness.SupervisedPlane(t, func(c *service.Config) { c.Now = clock.Now }, time.Now().Add(29*24*time.Hour))
	if _, err := pa.End(first); err != nil {
		t.Fatalf("the first end: %v", err)
	}
	keys := harness.IdentityKeys(t, first.M)
	set := revocationSet(t, p)
	revokedAt := set[keys[0]]
	// The bound, as the docs state it: the longest life of a credential (a standing one at
	// --standing-ttl's maximum, 24 h) and the skew (a minute) past the revocation time.
	bound := time.Unix(revokedAt, 0).Add(24*time.Hour + time.Minute)
	exp := latestExp(first.Prep, first.Act)
	if !time.Unix(exp, 0).Before(bound) {
		t.Fatalf("a credential expires at %d, not before its key may leave the set (%s)", exp, bound)
	}

	endAnother := func(what string) {
		t.Helper()
		s := pa.Assign(clock.Now().Add(24 * time.Hour))
		pa.Register(s)
		if _, err := pa.End(s); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	}
	held := func(what string, want bool) {
		t.Helper()
		set := revocationSet(t, p)
		claims, _ := dataAccountAtBroker(t, p)
		for _, k := range keys {
			_, onSet := set[k]
			_, atBroker := claims.Revocations[k]
			if onSet != want || atBroker != want {
				t.Errorf("%s: key %s on the set %t, in the broker's account JWT %t; want %t", what, k, onSet, atBroker, want)
			}
		}
	}
	// Just before the first credential's expiry, and just before the bound: still revoked.
	clock.Advance(time.Unix(exp-1, 0).Sub(clock.Now()))
	endAnother("an end as the credentials are about to expire")
	held("as the credentials are about to expire", true)
	clock.Advance(bound.Add(-2 * time.Second).Sub(clock.Now()))
	endAnother("an end just before the bound")
	held("just before the bound", true)
	// Past it: gone from the set and the broker.
	clock.Advance(3 * time.Second)
	endAnother("an end past the bound")
	held("past the bound", false)
}

// TestAnEndPastTheRevocationSetsCeilingRetiresTheLifecycleAndNamesTheKeysItCouldNotRevoke: the
// set is filled to two keys short of its capacity (the most keys whose account JWT fits in one
// broker message). An end of a lifecycle with five keys still freezes and retires it and marks
// its assignment ended; it revokes the two keys that fit, answers resource-exhausted, lists
// the three it could not revoke in the refusal's report and in its `ended` record, and nothing
// is minted under the lifecycle afterwards. The account JWT the broker holds at the ceiling is
// within one message.
func TestAnEndPastTheRevocationSetsCeilingRetiresTheLifecycleAndNamesTheKeysItCouldNotRevoke(t *testing.T) {
	t.Parallel()
	// The end pushes an account JWT of about 1 MiB to the broker and reads it back. Under the
	// whole suite beside two CPU burners that once took longer than the default 5 s request
	// deadline, and the end answered, as documented, unavailable with the report (the two keys
	// that fit on the set, unconfirmed). This test is about the ceiling, not the deadline: the
	// plane gets 12 s (the platform admin waits 15).
	p, pa, s := harness.SupervisedPlane(t, func(c *service.Config) { c.RequestTimeout = 12 * time.Second }, time.Now().Add(time.Hour))
	capacity := p.Info.RevocationCapacity
	if capacity < 5_000 || capacity > 20_000 {
		t.Fatalf("capacity %d keys under a 1 MiB broker message; want about 11,000", capacity)
	}
	fillRevocationSet(t, p, capacity-2)
	own := harness.WatchDuty(t, p.NATSURL(), s, subjects.DutySupervisor, s.Prep.Credentials["supervisor"].JWT)

	_, err := pa.End(s)
	var refusal *client.Refusal
	if !errors.As(err, &refusal) || refusal.Code != "resource-exhausted" {
		t.Fatalf("the end past the ceiling: got %v, want resource-exhausted", err)
	}
	var report client.EndReport
	if err := json.Unmarshal(refusal.Details, &report); err != nil {
		t.Fatalf("the refusal's details %s: %v", refusal.Details, err)
	}
	if report.Assignment.State != client.StateEnded || report.Retired.Gate != "retired" || report.Done || report.Revoked.Done ||
		len(report.Revoked.NKeys) != 5 || len(report.Revoked.Unrevoked) != 3 {
		t.Fatalf("the report: got %+v, want the lifecycle ended and retired, five keys, three of them unrevoked", report)
	}
	if len(refusal.Message) > 256 || strings.Contains(refusal.Message, report.Revoked.Unrevoked[0]) {
		t.Errorf("the refusal's message %q names keys or passes 256 bytes: they belong in the report", refusal.Message)
	}
	set := revocationSet(t, p)
	if len(set) != capacity {
		t.Errorf("the set holds %d keys, want its capacity %d", len(set), capacity)
	}
	for _, k := range report.Revoked.Unrevoked {
		if _, ok := set[k]; ok {
			t.Errorf("unrevoked key %s is on the set", k)
		}
	}
	claims, size := dataAccountAtBroker(t, p)
	if len(claims.Revocations) != capacity || size > 1<<20 {
		t.Errorf("the broker's account JWT: %d revocations in %d bytes, want %d within one 1 MiB message", len(claims.Revocations), size, capacity)
	}
	revoked := 0
	for _, k := range report.Revoked.NKeys {
		if _, ok := claims.Revocations[k]; ok {
			revoked++
		}
	}
	if revoked != 2 {
		t.Errorf("the broker revokes %d of the lifecycle's keys, want the 2 that fit", revoked)
	}
	var ended struct {
		Revoked   []string `json:"revoked"`
		Unrevoked []string `json:"unrevoked"`
	}
	m, err := harness.LastMsg(t, p, subjects.AuditStream(harness.TestSpace), subjects.AuditSubject(harness.TestSpace, "ended", harness.OwnerP, "admin"))
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(m.Data, &ended); err != nil || fmt.Sprint(ended.Unrevoked) != fmt.Sprint(report.Revoked.Unrevoked) {
		t.Errorf("the ended record lists unrevoked %v (%v), want %v", ended.Unrevoked, err, report.Revoked.Unrevoked)
	}
	// Nothing more is minted under the lifecycle, through any door.
	before := harness.StoreSeqs(t, p)
	_, err = pa.Authority(s, client.OpRenew)
	harness.WantRefusalOf(t, "supervisor-authority after the end", err, "permission-denied", endedText(s.Owner))
	if o := harness.OwnRenewal(own.Nc, s, subjects.DutySupervisor, client.OpRenew); o.Code == "" {
		t.Errorf("the manager's own renewal after the end: issued, want a refusal")
	}
	harness.WantUnwritten(t, p, "renewals after an end past the ceiling", before)
}

// TestAnEndTheBrokerDoesNotConfirmByTheDeadlineAnswersUnavailableAndARepeatConfirmsIt: the
// broker takes the end's account JWT, but every read-back shows it as it was before the end (a
// fault injected between the plane and the broker: a server that lags, or something pushing
// an older JWT), so no server is seen to revoke the end's keys. The end still ends and retires
// the lifecycle, answers unavailable by its deadline with the report (its keys on the set, not
// revoked), and nothing is minted under the lifecycle after it; once the read-back shows what
// the broker holds, a repeat of the end confirms the revocation.
func TestAnEndTheBrokerDoesNotConfirmByTheDeadlineAnswersUnavailableAndARepeatConfirmsIt(t *testing.T) {
	t.Parallel()
	lag := &laggingBroker{}
	p, pa, s := harness.SupervisedPlane(t, func(c *service.Config) {
		c.RequestTimeout = 3 * time.Second
		if c.Hooks == nil {
			c.Hooks = &service.Hooks{}
		}
		c.Hooks.RevocationBroker = func(b revocation.Broker) revocation.Broker { lag.Broker = b; return lag }
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
	set := revocationSet(t, p)
	for _, k := range report.Revoked.NKeys {
		if _, ok := set[k]; !ok {
			t.Errorf("key %s is not on the revocation set", k)
		}
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
	claims, _ := dataAccountAtBroker(t, p)
	for _, k := range report.Revoked.NKeys {
		if _, ok := claims.Revocations[k]; !ok {
			t.Errorf("after the repeat, the broker does not revoke key %s", k)
		}
	}
}

// laggingBroker is the revocation set's broker with its read-backs replaced, while shown is
// set, by that account JWT on every server.
type laggingBroker struct {
	revocation.Broker
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
// issue time), so the broker stops revoking the end's keys. The plane's recheck finds a key of
// the set the broker does not revoke and signs and pushes the set again.
func TestAnOlderAccountJWTPushedAfterAnEndIsUndoneByTheRecheck(t *testing.T) {
	harness.Long(t, "waits for the revocation set's recheck")
	t.Parallel()
	p, pa, s := harness.SupervisedPlane(t, func(c *service.Config) {
		if c.Hooks == nil {
			c.Hooks = &service.Hooks{}
		}
		c.Hooks.RevocationRecheckEvery = 200 * time.Millisecond
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
	revokes := func() int {
		claims, _ := dataAccountAtBroker(t, p)
		n := 0
		for _, k := range r.Revoked.NKeys {
			if _, ok := claims.Revocations[k]; ok {
				n++
			}
		}
		return n
	}
	if n := revokes(); n != 0 {
		t.Fatalf("after the older JWT's push the broker revokes %d of the end's %d keys, want none: the push did not take", n, len(r.Revoked.NKeys))
	}
	// The recheck leaves the set to the end's own round for revocation.RecheckGrace after its
	// signing, then signs it again.
	testkit.CheckFor(t, revocation.RecheckGrace+20*time.Second, 100*time.Millisecond, func() error {
		if n := revokes(); n != len(r.Revoked.NKeys) {
			return fmt.Errorf("the broker revokes %d of the end's %d keys", n, len(r.Revoked.NKeys))
		}
		return nil
	})
}

// fillRevocationSet writes n made-up keys (as long as user nkeys) on the data account's
// revocation set, as ends of long ago would have left it, and has the plane's next end sign
// them all.
func fillRevocationSet(t testing.TB, p *harness.TestPlane, n int) {
	t.Helper()
	at := time.Now().Add(time.Hour).Unix()
	revoked := make(map[string]int64, n)
	for i := range n {
		revoked[fmt.Sprintf("UFILL%051d", i)] = at
	}
	row, err := json.Marshal(map[string]any{"v": 1, "account": p.Account(), "revoked": revoked, "issuedAt": 0, "nonce": "fill"})
	if err != nil {
		t.Fatal(err)
	}
	kv, err := p.JS(t).KeyValue(harness.CallCtx(t), subjects.AuthBucket(harness.TestSpace))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Put(harness.CallCtx(t), subjects.RevocationsKey(p.Account()), row); err != nil {
		t.Fatalf("fill the revocation set (%d bytes): %v", len(row), err)
	}
}

// TestTheRevocationSetsCapacityIsWhatOneBrokerMessageCarries: the data account's JWT signed
// with as many revoked keys as the plane's capacity says is taken by the broker and fills at
// least 99% of its largest message (1 MiB here); one with 1% more keys is over it and refused.
// The capacity is the ceiling, measured, not a guess.
func TestTheRevocationSetsCapacityIsWhatOneBrokerMessageCarries(t *testing.T) {
	t.Parallel()
	p := harness.StartPlane(t, nil)
	capacity := p.Info.RevocationCapacity
	keys := p.Keys()
	sys := harness.SystemConn(t, p)
	push := func(n int) (int, error) {
		revoked := make(map[string]int64, n)
		at := time.Now().Add(time.Hour).Unix()
		for i := range n {
			revoked[fmt.Sprintf("UCAP%052d", i)] = at
		}
		token, _, err := keys.DataAccountJWT(space.DataPolicy{MaxConnections: 10_000, Revocations: revoked})
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
// name, one that sent any name and one that sent none are each counted as the key their JWT
// is for, and only as that.
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
	held, err := broker.Account{NC: harness.SystemConn(t, p), Public: p.Account()}.Connections(ctx, []string{a, b, absent}, 1)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]int{a: 1, b: 2}
	if !maps.Equal(held, want) {
		t.Fatalf("connections counted by JWT subject: got %v, want %v (C, connected but not asked after, is not counted)", held, want)
	}
}
