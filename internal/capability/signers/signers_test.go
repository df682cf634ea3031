package signers

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nkeys"

	"github.com/cotal-ai/authplane/internal/core/fault"
	"github.com/cotal-ai/authplane/internal/core/fence"
	"github.com/cotal-ai/authplane/internal/core/issue"
	"github.com/cotal-ai/authplane/internal/platform/broker"
	"github.com/cotal-ai/authplane/internal/testkit"
	"github.com/cotal-ai/authplane/subjects"
)

func ctx(t testing.TB) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	return c
}

// resolver is a broker of one server whose resolver keeps the account JWT pushed last, whatever
// its issue time (as nats-server's does on a push), and counts the pushes. onPush, when set,
// runs at the start of every Push.
type resolver struct {
	account string
	mu      sync.Mutex
	held    string
	pushes  []*jwt.AccountClaims
	onPush  func()
}

func (r *resolver) Servers(context.Context) (int, error) { return 1, nil }

func (r *resolver) Push(_ context.Context, token string) error {
	if r.onPush != nil {
		r.onPush()
	}
	c, err := jwt.DecodeAccountClaims(token)
	if err != nil || c.Subject != r.account {
		return fmt.Errorf("not the data account's JWT: %v", err)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.pushes = append(r.pushes, c)
	r.held = token
	return nil
}

func (r *resolver) Lookup(context.Context, int) ([]string, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.held == "" {
		return nil, errors.New("no JWT held")
	}
	return []string{r.held}, nil
}

func (r *resolver) ListConnections(context.Context, int) ([]broker.Connection, map[string]bool, error) {
	return nil, map[string]bool{"s": true}, nil
}

func (r *resolver) Kick(context.Context, string, uint64) error { return nil }

func (r *resolver) pushed() []*jwt.AccountClaims {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.pushes)
}

// lists reports whether the JWT the resolver holds lists instance iid's key.
func (r *resolver) lists(t testing.TB, s *Set, iid string) bool {
	t.Helper()
	pub, err := s.Keys.Public(iid)
	if err != nil {
		t.Fatal(err)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	c, err := jwt.DecodeAccountClaims(r.held)
	if err != nil {
		t.Fatalf("the held JWT: %v", err)
	}
	_, ok := c.SigningKeys[pub]
	return ok
}

// world is a set's account: its operator, its own signing key, the keys it derives from it.
type world struct {
	account, own string
	op           nkeys.KeyPair
	keys         *Keys
}

func newWorld(t testing.TB) *world {
	t.Helper()
	op, err := nkeys.CreateOperator()
	if err != nil {
		t.Fatal(err)
	}
	acc, err := nkeys.CreateAccount()
	if err != nil {
		t.Fatal(err)
	}
	signer, err := nkeys.CreateAccount()
	if err != nil {
		t.Fatal(err)
	}
	w := &world{op: op}
	w.account, _ = acc.PublicKey()
	w.own, _ = signer.PublicKey()
	if w.keys, err = NewKeys("default", w.account, signer, time.Now); err != nil {
		t.Fatal(err)
	}
	return w
}

// set is a set of w on gates, pushing to b.
func (w *world) set(gates fence.KV, b Broker) *Set {
	return &Set{Gates: gates, Account: w.account, Keys: w.keys, Broker: b, Capacity: 10_000, Now: time.Now, Settle: time.Hour,
		Sign: func(signing []string, held map[string]int64) (string, int64, error) {
			c := jwt.NewAccountClaims(w.account)
			if signing == nil {
				signing = []string{w.own}
			}
			c.SigningKeys.Add(signing...)
			for k, until := range held {
				c.RevokeAt(k, time.Unix(until, 0))
			}
			token, err := c.Encode(w.op)
			return token, c.IssuedAt, err
		}}
}

// newSet is a set on an in-memory bucket and a resolver.
func newSet(t *testing.T) (*Set, *resolver, *testkit.KV) {
	t.Helper()
	w := newWorld(t)
	b := &resolver{account: w.account}
	gates := testkit.NewKV()
	return w.set(gates, b), b, gates
}

var iidN int

// iid is a fresh instance id.
func iid() string {
	iidN++
	return fmt.Sprintf("i%025d", iidN)
}

// setGate writes instance id's gate in state.
func setGate(t testing.TB, gates fence.KV, id, state string) {
	t.Helper()
	row := issue.GateRow{State: state, Principal: "u_aaaaaaaaaaaaaaaaaaaaaaaaaa.manager_serve_" + id}
	if state != issue.GateOpen {
		row.Op = &issue.GateOp{OpID: "x", Kind: issue.OpRetirement}
	}
	if _, err := issue.GateOf(gates, subjects.GateEndpointManager, id).Update(ctx(t), func(*issue.Gate) (issue.GateRow, error) { return row, nil }); err != nil {
		t.Fatal(err)
	}
}

// TestAnInstanceKeyIsDerivedTheSameByEveryReplica: two replicas derive the same account key for
// one instance from the same root, and different keys for different instances and from
// another root; the issuer signs for the data account with it.
func TestAnInstanceKeyIsDerivedTheSameByEveryReplica(t *testing.T) {
	w := newWorld(t)
	root, err := nkeys.CreateAccount()
	if err != nil {
		t.Fatal(err)
	}
	var pubs []string
	for _, k := range []struct {
		root nkeys.KeyPair
		iid  string
	}{{root, "p0ypj4vcq3dkr90t6t3ll7pmzsc07hn"}, {root, "p0ypj4vcq3dkr90t6t3ll7pmzsc07hn"}, {root, "q0ypj4vcq3dkr90t6t3ll7pmzsc07hn"}, {nil, "p0ypj4vcq3dkr90t6t3ll7pmzsc07hn"}} {
		keys := w.keys
		if k.root != nil {
			if keys, err = NewKeys("default", w.account, k.root, time.Now); err != nil {
				t.Fatal(err)
			}
		}
		pub, err := keys.Public(k.iid)
		if err != nil || !nkeys.IsValidPublicAccountKey(pub) {
			t.Fatalf("the key of %s: %q, %v", k.iid, pub, err)
		}
		pubs = append(pubs, pub)
	}
	if pubs[0] != pubs[1] || pubs[0] == pubs[2] || pubs[0] == pubs[3] {
		t.Fatalf("got %v: want the first two equal and the others not", pubs)
	}
	if _, err := NewKeys("default", w.account, nil, time.Now); err == nil {
		t.Fatal("keys without a root: want an error")
	}
	iss, err := w.keys.Issuer("p0ypj4vcq3dkr90t6t3ll7pmzsc07hn")
	if err != nil || iss.Account() != w.account || iss.Signer() != pubs[3] {
		t.Fatalf("issuer: %v, %v", iss, err)
	}
}

// TestChangesThatComeTogetherShareOneSigningAndPush: twenty first registrations and five ends
// at once, right after another change signed, are served by one round: one signing, in the
// next second, one push, one read-back; every key added is listed and every key removed is
// not. A renewal of a live instance costs no round trip at all.
func TestChangesThatComeTogetherShareOneSigningAndPush(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s, b, _ := newSet(t)
		ended := make([]string, 5)
		for i := range ended {
			ended[i] = iid()
			if _, err := s.Issuer(ctx(t), ended[i], 0, false); err != nil {
				t.Fatalf("the first registration of %s: %v", ended[i], err)
			}
		}
		n := len(b.pushed())
		var wg sync.WaitGroup
		added := make([]string, 20)
		for i := range added {
			added[i] = iid()
			wg.Go(func() {
				if _, err := s.Issuer(ctx(t), added[i], 0, false); err != nil {
					t.Errorf("registration %d: %v", i, err)
				}
			})
		}
		for _, id := range ended {
			wg.Go(func() {
				if out, err := s.Remove(ctx(t), id); err != nil || !out.Done {
					t.Errorf("the end of %s: %+v, %v", id, out, err)
				}
			})
		}
		wg.Wait()
		pushed := b.pushed()
		if len(pushed) != n+1 {
			t.Fatalf("got %d pushes for twenty registrations and five ends at once, want 1", len(pushed)-n)
		}
		if pushed[n].IssuedAt <= pushed[n-1].IssuedAt {
			t.Errorf("the round's signing is issued at %d, not after the last one's %d", pushed[n].IssuedAt, pushed[n-1].IssuedAt)
		}
		for _, id := range added {
			if !b.lists(t, s, id) {
				t.Errorf("the key of %s is not listed", id)
			}
		}
		for _, id := range ended {
			if b.lists(t, s, id) {
				t.Errorf("the key of ended %s is still listed", id)
			}
		}
		if _, err := s.Issuer(ctx(t), added[3], 0, true); err != nil || len(b.pushed()) != n+1 {
			t.Errorf("a renewal of a live instance: %v, %d pushes; want no push", err, len(b.pushed())-n-1)
		}
	})
}

// TestEverySigningIsLaterThanTheLastAndCarriesTheSetBeforeIt: changes one after another sign at
// most once a second, each JWT issued later than the one before, listing every instance added
// before it and not removed.
func TestEverySigningIsLaterThanTheLastAndCarriesTheSetBeforeIt(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s, b, _ := newSet(t)
		var live []string
		for i := range 6 {
			id := iid()
			live = append(live, id)
			if _, err := s.Issuer(ctx(t), id, 0, false); err != nil {
				t.Fatalf("registration %d: %v", i, err)
			}
			if i%2 == 1 {
				if out, err := s.Remove(ctx(t), live[0]); err != nil || !out.Done {
					t.Fatalf("end %d: %+v, %v", i, out, err)
				}
				live = live[1:]
			}
		}
		pushed := b.pushed()
		for i, c := range pushed {
			if i > 0 && c.IssuedAt <= pushed[i-1].IssuedAt {
				t.Errorf("push %d issued at %d, not after %d", i, c.IssuedAt, pushed[i-1].IssuedAt)
			}
		}
		last := pushed[len(pushed)-1]
		if len(last.SigningKeys) != len(live)+1 {
			t.Errorf("the last JWT lists %d keys, want the %d live instances' and the account's own", len(last.SigningKeys), len(live))
		}
		for _, id := range live {
			if !b.lists(t, s, id) {
				t.Errorf("live %s is not listed", id)
			}
		}
	})
}

// casHook is a bucket whose next CAS of the signer row first runs before, once.
type casHook struct {
	fence.KV
	mu     sync.Mutex
	before func()
}

func (h *casHook) Update(ctx context.Context, key string, value []byte, rev uint64) (uint64, error) {
	h.mu.Lock()
	before := h.before
	if strings.HasPrefix(key, "signers.") {
		h.before = nil
	} else {
		before = nil
	}
	h.mu.Unlock()
	if before != nil {
		before()
	}
	return h.KV.Update(ctx, key, value, rev)
}

// TestAnAddNeverBringsBackAKeyAnEndTookOff: a first registration's add has read the row and
// the gate (open) when an end freezes the gate and takes the instance's key off, though the
// key was never on the set; the add's CAS then fails, it reads the gate again, and refuses. Its
// key is on neither the row nor the broker, and a later add is refused as well.
func TestAnAddNeverBringsBackAKeyAnEndTookOff(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		w := newWorld(t)
		b := &resolver{account: w.account}
		mem := testkit.NewKV()
		hook := &casHook{KV: mem}
		adder, ender := w.set(hook, b), w.set(mem, b)
		if err := ender.Repush(ctx(t), true); err != nil { // the row exists: the add's first try is a CAS
			t.Fatal(err)
		}
		id := iid()
		setGate(t, mem, id, issue.GateOpen)
		hook.before = func() {
			setGate(t, mem, id, issue.GateFrozen)
			if out, err := ender.Remove(ctx(t), id); err != nil || !out.Done {
				t.Errorf("the end: %+v, %v", out, err)
			}
		}
		_, err := adder.Issuer(ctx(t), id, 0, true)
		var f *fault.Error
		if !errors.As(err, &f) || f.Code != fault.FailedPrecondition {
			t.Fatalf("the add after the end: %v, want failed-precondition", err)
		}
		if b.lists(t, adder, id) {
			t.Fatalf("the broker lists the key of ended instance %s", id)
		}
		if _, err := adder.Issuer(ctx(t), id, 0, true); !errors.As(err, &f) || f.Code != fault.FailedPrecondition {
			t.Fatalf("a later add: %v, want failed-precondition", err)
		}
		if b.lists(t, adder, id) {
			t.Fatalf("the broker lists the key of ended instance %s", id)
		}
	})
}

// TestAnInstancePastTheCapacityIsRefusedAndAnEndStillTakesItsKeyOff: a space at its capacity
// refuses another instance resource-exhausted, listing nothing more; an end of an instance
// still takes its key off (it needs no room), and then there is room again.
func TestAnInstancePastTheCapacityIsRefusedAndAnEndStillTakesItsKeyOff(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s, b, _ := newSet(t)
		s.Capacity = 3
		var live []string
		for range 3 {
			live = append(live, iid())
			if _, err := s.Issuer(ctx(t), live[len(live)-1], 0, false); err != nil {
				t.Fatal(err)
			}
		}
		n := len(b.pushed())
		extra := iid()
		_, err := s.Issuer(ctx(t), extra, 0, false)
		var f *fault.Error
		if !errors.As(err, &f) || f.Code != fault.ResourceExhausted {
			t.Fatalf("a fourth instance: %v, want resource-exhausted", err)
		}
		if len(b.pushed()) != n || b.lists(t, s, extra) {
			t.Fatalf("the refused instance: %d pushes, listed %v; want none", len(b.pushed())-n, b.lists(t, s, extra))
		}
		if out, err := s.Remove(ctx(t), live[1]); err != nil || !out.Done || b.lists(t, s, live[1]) {
			t.Fatalf("an end at the capacity: %+v, %v", out, err)
		}
		if _, err := s.Issuer(ctx(t), extra, 0, false); err != nil || !b.lists(t, s, extra) {
			t.Fatalf("the fourth instance once one ended: %v", err)
		}
	})
}

// TestTheSweepTakesOffTheKeysOfInstancesThatMintNothing: an instance whose gate is still absent
// Settle after its key was added, and one whose gate is frozen (an end that stopped before
// its step took the key off), lose their keys; a registered one and one whose registration
// may still commit keep theirs. A registration still to commit renews when its key was added.
func TestTheSweepTakesOffTheKeysOfInstancesThatMintNothing(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s, b, gates := newSet(t)
		never, frozen, open, young, renewed := iid(), iid(), iid(), iid(), iid()
		for _, id := range []string{never, frozen, open, renewed} {
			if _, err := s.Issuer(ctx(t), id, 0, false); err != nil {
				t.Fatal(err)
			}
		}
		setGate(t, gates, frozen, issue.GateFrozen)
		setGate(t, gates, open, issue.GateOpen)
		start := time.Now()
		s.Now = func() time.Time { return time.Now().Add(time.Since(start) + s.Settle*3/4) }
		if _, err := s.Issuer(ctx(t), renewed, 0, false); err != nil { // a prepare again, still to commit
			t.Fatal(err)
		}
		if _, err := s.Issuer(ctx(t), young, 0, false); err != nil {
			t.Fatal(err)
		}
		s.Now = func() time.Time { return time.Now().Add(time.Since(start) + s.Settle + time.Minute) }
		gone, err := s.Sweep(ctx(t))
		if err != nil || gone != 2 {
			t.Fatalf("the sweep took %d keys off (%v), want 2", gone, err)
		}
		for id, want := range map[string]bool{never: false, frozen: false, open: true, young: true, renewed: true} {
			if got := b.lists(t, s, id); got != want {
				t.Errorf("listed %s: %v, want %v", id, got, want)
			}
		}
	})
}

// TestARecheckSignsTheSetAgainWhenABrokerHoldsAnOlderJWT: something pushed the data account an
// older JWT without a live instance's key. A recheck within RecheckGrace of the set's last
// signing leaves it to that signing's round; after it, the recheck has a round sign and push
// the set again, and the next finds nothing to do.
func TestARecheckSignsTheSetAgainWhenABrokerHoldsAnOlderJWT(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s, b, _ := newSet(t)
		if err := s.Repush(ctx(t), true); err != nil {
			t.Fatal(err)
		}
		old := b.held
		time.Sleep(time.Second)
		id := iid()
		if _, err := s.Issuer(ctx(t), id, 0, false); err != nil {
			t.Fatal(err)
		}
		if err := b.Push(ctx(t), old); err != nil {
			t.Fatal(err)
		}
		n := len(b.pushed())
		if again, err := s.Recheck(ctx(t)); again || err != nil || len(b.pushed()) != n {
			t.Fatalf("a recheck within the grace: got %v, %v, %d pushes more; want nothing done", again, err, len(b.pushed())-n)
		}
		time.Sleep(RecheckGrace)
		if again, err := s.Recheck(ctx(t)); !again || err != nil || !b.lists(t, s, id) {
			t.Fatalf("a recheck after the grace: got %v, %v, listed %v; want the set pushed again", again, err, b.lists(t, s, id))
		}
		n = len(b.pushed())
		time.Sleep(RecheckGrace)
		if again, err := s.Recheck(ctx(t)); again || err != nil || len(b.pushed()) != n {
			t.Fatalf("a recheck of a broker that holds the set: got %v, %v, %d pushes more", again, err, len(b.pushed())-n)
		}
	})
}

// TestAPushAgainSendsTheNewestJWTWithoutSigningWhenThisReplicaSignedIt: a server that rejoined
// gets the newest JWT again at once, not in the next second; once another replica signed, a
// push again signs anew (this replica's newest is older).
func TestAPushAgainSendsTheNewestJWTWithoutSigningWhenThisReplicaSignedIt(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		w := newWorld(t)
		b := &resolver{account: w.account}
		gates := testkit.NewKV()
		s, other := w.set(gates, b), w.set(gates, b)
		if _, err := s.Issuer(ctx(t), iid(), 0, false); err != nil {
			t.Fatal(err)
		}
		n, at := len(b.pushed()), time.Now()
		if err := s.Repush(ctx(t), false); err != nil || len(b.pushed()) != n+1 || time.Since(at) != 0 {
			t.Fatalf("a push again: %v, %d pushes, after %s; want the newest at once", err, len(b.pushed())-n, time.Since(at))
		}
		if b.pushed()[n].IssuedAt != b.pushed()[n-1].IssuedAt {
			t.Fatalf("the push again signed anew")
		}
		if _, err := other.Issuer(ctx(t), iid(), 0, false); err != nil {
			t.Fatal(err)
		}
		n = len(b.pushed())
		if err := s.Repush(ctx(t), false); err != nil || b.pushed()[n].IssuedAt <= b.pushed()[n-1].IssuedAt {
			t.Fatalf("a push again after another replica signed: %v; want a new signing", err)
		}
	})
}

// TestARowLargerThanARequestBodyStillTakesInstances: the row holds every live instance, which
// passes a request body's size limit after some 1,400 of them: it is still read and added to.
func TestARowLargerThanARequestBodyStillTakesInstances(t *testing.T) {
	s, _, gates := newSet(t)
	s.Sign = nil // no broker round trips: the row alone
	live := map[string]int64{}
	for range 2000 {
		live[iid()] = time.Now().Unix()
	}
	o, err := s.fence().Update(ctx(t), func(*fence.Observed[row]) (row, error) {
		return row{V: 1, Account: s.Account, Live: live}, nil
	})
	if err != nil || len(o.Raw) <= fault.MaxBytes {
		t.Fatalf("a row of %d bytes (%v), want more than %d", len(o.Raw), err, fault.MaxBytes)
	}
	e, err := gates.Get(ctx(t), subjects.SignersKey(s.Account))
	if err != nil {
		t.Fatal(err)
	}
	r, err := s.fence().Observe(ctx(t))
	if err != nil || len(r.Row.Live) != 2000 || r.Revision != e.Revision {
		t.Fatalf("read back %d instances (%v), want 2000", len(r.Row.Live), err)
	}
}

// TestCapacityIsWhatOneBrokerMessageCarries: a JWT listing Capacity instance keys and holding
// MaxHolds keys out fits in the broker's message with the room the envelope needs, and two
// more instance keys would not.
func TestCapacityIsWhatOneBrokerMessageCarries(t *testing.T) {
	s, _, _ := newSet(t)
	const maxPayload = 64 << 10
	n, err := Capacity(s.Sign, maxPayload)
	if err != nil {
		t.Fatal(err)
	}
	empty, _, _ := s.Sign(nil, nil)
	live := map[string]int64{}
	for range n {
		live[iid()] = 1
	}
	out := map[string]hold{}
	for range MaxHolds {
		out[userKey(t)] = hold{Owner: "u_owner", Until: time.Now().Add(time.Hour).Unix()}
	}
	full, _, err := s.sign(ctx(t), row{Live: live, Out: out})
	if err != nil {
		t.Fatal(err)
	}
	if len(full) > maxPayload-1024 || len(full) < maxPayload-1024-160 {
		t.Fatalf("%d keys make a JWT of %d bytes (%d empty), want at most %d and within two keys of it", n, len(full), len(empty), maxPayload-1024)
	}
}

// listings is a broker whose connection listings are given in turn (the last one repeats),
// each as the keys it lists, and which counts the kicks.
type listings struct {
	resolver
	mu     sync.Mutex
	polls  [][]string
	asked  int
	kicked int
}

func (l *listings) ListConnections(context.Context, int) ([]broker.Connection, map[string]bool, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	var conns []broker.Connection
	for i, k := range l.polls[min(l.asked, len(l.polls)-1)] {
		conns = append(conns, broker.Connection{Server: "s", CID: uint64(i + 1), User: k})
	}
	l.asked++
	return conns, map[string]bool{"s": true}, nil
}

func (l *listings) Kick(context.Context, string, uint64) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.kicked++
	return nil
}

// An eviction counts a key gone only once a second listing agrees with the first that found
// none of them left (one listing can miss a connection that moved between two of its pages),
// and kicks every connection of the keys it lists: one whose authentication was under way as
// the key left got in after the broker closed the others.
func TestAnEvictionKicksWhatItListsAndCountsAKeyGoneOnlyWhenTwoListingsAgree(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := &listings{polls: [][]string{
			{"B", "C"}, // A gone; C is not asked after
			{},         // B gone too: listed again at once
			{"A"},      // the second listing finds A, which the first missed
			{},         // none again
			{},         // and a second listing agrees
			{"A"},      // never asked
		}}
		s := evicting(t, &Set{Broker: b})
		if got := s.Evict(ctx(t), []string{"A", "B"}); got != 2 || b.asked != 5 || b.kicked != 2 {
			t.Fatalf("Evict: %d keys gone after %d listings and %d kicks, want 2 after 5 listings and 2 kicks", got, b.asked, b.kicked)
		}
		stuck := &listings{polls: [][]string{{}, {"A"}}}
		c, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if got := evicting(t, &Set{Broker: stuck}).Evict(c, []string{"A", "B"}); got != 1 {
			t.Fatalf("Evict with A listed until the deadline: %d keys gone, want 1 (B)", got)
		}
	})
}

// evicting runs s's evictions until t ends, as the plane runs them until it closes.
func evicting(t *testing.T, s *Set) *Set {
	stop, ran := serving(s.ServeEvictions)
	t.Cleanup(func() { stop(); <-ran })
	return s
}

// serving runs serve on a context of its own, as the plane runs its background work until it
// closes: stop ends that context, and done is closed once serve has returned.
func serving(serve func(context.Context)) (stop context.CancelFunc, done <-chan struct{}) {
	life, stop := context.WithCancel(context.Background())
	ran := make(chan struct{})
	go func() {
		defer close(ran)
		serve(life)
	}()
	return stop, ran
}

// The evictions' listings are the plane's: when the plane closes (ServeEvictions' context
// ends), a listing under way ends, the runner returns, the Evicts under way return, and a later
// Evict returns at once without a listing. A runner that outlived the plane would still list a
// closed broker for as long as the latest Evict's deadline (a minute without one).
func TestTheEvictionsListingsEndWhenThePlaneCloses(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := &hung{}
		s := &Set{Broker: b}
		stop, ran := serving(s.ServeEvictions)
		evicted := make(chan int, 1)
		go func() { evicted <- s.Evict(context.Background(), []string{"A"}) }()
		synctest.Wait()
		if n := b.under.Load(); n != 1 {
			t.Fatalf("%d listings under way for an Evict, want 1", n)
		}
		stop()
		synctest.Wait()
		select {
		case <-ran:
		default:
			t.Fatal("ServeEvictions still runs after its context ended")
		}
		if n := b.under.Load(); n != 0 {
			t.Fatalf("%d listings still under way after ServeEvictions returned, want none", n)
		}
		select {
		case n := <-evicted:
			if n != 0 {
				t.Errorf("the Evict under way: %d keys gone, want 0 (no listing found A gone)", n)
			}
		default:
			t.Fatal("the Evict under way still waits after ServeEvictions returned")
		}
		asked := b.asked.Load()
		if got := s.Evict(context.Background(), []string{"A"}); got != 0 || b.asked.Load() != asked {
			t.Errorf("an Evict after the close: %d keys gone after %d more listings, want 0 at once", got, b.asked.Load()-asked)
		}
	})
}

// hung is a broker of one server whose connection listings never answer: each waits for its
// context to end.
type hung struct {
	resolver
	under, asked atomic.Int32
}

func (h *hung) ListConnections(ctx context.Context, _ int) ([]broker.Connection, map[string]bool, error) {
	h.asked.Add(1)
	h.under.Add(1)
	defer h.under.Add(-1)
	<-ctx.Done()
	return nil, nil, ctx.Err()
}

// TestAKickOfStaleConnectionsClosesOnlyThoseOfKeysOffTheSet: connections signed by a key off
// the set are kicked; those of a live instance's key, of the account's own key, and of the
// callout (no JWT of their own) are not.
func TestAKickOfStaleConnectionsClosesOnlyThoseOfKeysOffTheSet(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s, _, _ := newSet(t)
		live, ended := iid(), iid()
		for _, id := range []string{live, ended} {
			if _, err := s.Issuer(ctx(t), id, 0, false); err != nil {
				t.Fatal(err)
			}
		}
		if out, err := s.Remove(ctx(t), ended); err != nil || !out.Done {
			t.Fatal(out, err)
		}
		livePub, _ := s.Keys.Public(live)
		endedPub, _ := s.Keys.Public(ended)
		b := &kicks{resolver: s.Broker.(*resolver), conns: []broker.Connection{
			{Server: "s", CID: 1, User: "U1", Signer: livePub},
			{Server: "s", CID: 2, User: "U2", Signer: endedPub},
			{Server: "s", CID: 3, User: "U3", Signer: mainOf(t, s)},
			{Server: "s", CID: 4, Callout: true},
			{Server: "s", CID: 5, User: "U5", Signer: endedPub},
		}}
		s.Broker = b
		if n, err := s.KickStale(ctx(t)); err != nil || n != 2 || !slices.Equal(b.kicked, []uint64{2, 5}) {
			t.Fatalf("KickStale: %d, %v, kicked %v; want connections 2 and 5", n, err, b.kicked)
		}
	})
}

// kicks is a broker of one server listing conns and noting each kick.
type kicks struct {
	*resolver
	conns  []broker.Connection
	kicked []uint64
}

func (k *kicks) ListConnections(context.Context, int) ([]broker.Connection, map[string]bool, error) {
	return k.conns, map[string]bool{"s": true}, nil
}

func (k *kicks) Kick(_ context.Context, _ string, cid uint64) error {
	k.kicked = append(k.kicked, cid)
	return nil
}

// mainOf is generation 0's own key of s: the data account's own signing key.
func mainOf(t *testing.T, s *Set) string {
	t.Helper()
	iss, err := s.Keys.Main(0)
	if err != nil {
		t.Fatal(err)
	}
	return iss.Signer()
}
