package revocation

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nkeys"

	"github.com/cotal-ai/authplane/internal/body"
	"github.com/cotal-ai/authplane/internal/space"
	"github.com/cotal-ai/authplane/internal/store/storetest"
	"github.com/cotal-ai/authplane/subjects"
)

const testKey = "ADATAACCOUNTPUBLICKEYFORTESTSXXXXXXXXXXXXXXXXXXXXXXXXXXX"

func ctx(t testing.TB) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	return c
}

// noBroker is a broker whose resolvers cannot be read: a revoke then signs and pushes, and here
// signing fails first (no operator signing key), after the keys joined the set.
type noBroker struct{}

func (noBroker) Servers(context.Context) (int, error) { return 1, nil }
func (noBroker) Push(context.Context, string) error   { return errors.New("no broker") }
func (noBroker) Lookup(context.Context, int) ([]string, error) {
	return nil, errors.New("no broker")
}
func (noBroker) Connections(context.Context, []string, int) (map[string]int, error) {
	return nil, errors.New("no broker")
}

// A revocation set holds every key ended in the last day, which passes a request body's size
// limit after some 180 ended instances: it is still read and added to (the 200th end of a race
// test once failed here, as would every end and start after it).
func TestARevocationSetLargerThanARequestBodyStillTakesKeys(t *testing.T) {
	gates := storetest.New()
	s := &Set{Gates: gates, Account: testKey, Broker: noBroker{}, Capacity: 10_000, Now: func() time.Time { return time.Unix(1_800_000_000, 0) },
		Sign: func(map[string]int64) (string, int64, error) { return "", 0, space.ErrNoOperatorSigner }}
	var keys []string
	for i := range 1200 {
		keys = append(keys, fmt.Sprintf("U%055d", i)) // as long as a user nkey
	}
	for i := 0; i < len(keys); i += 5 { // one end's five keys at a time
		out, err := s.Revoke(ctx(t), keys[i:i+5])
		if err != nil || out.Done() || !errors.Is(out.Cause, ErrNoSigner) {
			t.Fatalf("end %d: got %+v, %v; want the keys on the set and a reason the broker was not told", i/5+1, out, err)
		}
	}
	e, err := gates.Get(ctx(t), subjects.RevocationsKey(testKey))
	if err != nil {
		t.Fatal(err)
	}
	var r row
	if err := decodeRow(e.Value, &r); err != nil || len(r.Revoked) != len(keys) || len(e.Value) <= body.MaxBytes {
		t.Fatalf("got a set of %d bytes with %d keys (%v), want all %d keys in more than %d bytes", len(e.Value), len(r.Revoked), err, len(keys), body.MaxBytes)
	}
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

func (r *resolver) Connections(context.Context, []string, int) (map[string]int, error) {
	return nil, nil
}

func (r *resolver) pushed() []*jwt.AccountClaims {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.pushes)
}

// newSet is a set on an in-memory bucket and a resolver, signing with a fresh operator key.
func newSet(t *testing.T) (*Set, *resolver) {
	t.Helper()
	op, err := nkeys.CreateOperator()
	if err != nil {
		t.Fatal(err)
	}
	acc, err := nkeys.CreateAccount()
	if err != nil {
		t.Fatal(err)
	}
	pub, _ := acc.PublicKey()
	b := &resolver{account: pub}
	s := &Set{Gates: storetest.New(), Account: pub, Broker: b, Capacity: 10_000, Now: time.Now,
		Sign: func(revoked map[string]int64) (string, int64, error) {
			c := jwt.NewAccountClaims(pub)
			for k, at := range revoked {
				c.RevokeAt(k, time.Unix(at, 0))
			}
			token, err := c.Encode(op)
			return token, c.IssuedAt, err
		}}
	return s, b
}

func userKeys(t *testing.T, n int) []string {
	t.Helper()
	var out []string
	for range n {
		kp, err := nkeys.CreateUser()
		if err != nil {
			t.Fatal(err)
		}
		pub, _ := kp.PublicKey()
		out = append(out, pub)
	}
	return out
}

// TestRevokesThatRunTogetherShareOneSigningAndPush: twenty ends revoking five keys each at once,
// right after another end signed, are served by one round: one signing, in the next second,
// one push, one read-back; every key of every end is confirmed and at the broker. A repeat of
// keys the broker revokes already signs nothing. (In a synctest bubble: the wait for the next
// second takes no wall time.)
func TestRevokesThatRunTogetherShareOneSigningAndPush(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s, b := newSet(t)
		if out, err := s.Revoke(ctx(t), userKeys(t, 5)); err != nil || !out.Done() {
			t.Fatalf("the first end: %+v, %v", out, err)
		}
		var wg sync.WaitGroup
		keys := make([][]string, 20)
		outs := make([]*Outcome, 20)
		for i := range keys {
			keys[i] = userKeys(t, 5)
			wg.Go(func() {
				var err error
				if outs[i], err = s.Revoke(ctx(t), keys[i]); err != nil {
					t.Errorf("end %d: %v", i, err)
				}
			})
		}
		wg.Wait()
		pushed := b.pushed()
		if len(pushed) != 2 {
			t.Fatalf("got %d pushes for one end and then twenty at once, want 2", len(pushed))
		}
		if pushed[1].IssuedAt <= pushed[0].IssuedAt {
			t.Errorf("the second signing is issued at %d, not after the first's %d", pushed[1].IssuedAt, pushed[0].IssuedAt)
		}
		for i, out := range outs {
			if out == nil || !out.Done() || len(out.Confirmed) != 5 {
				t.Fatalf("end %d: %+v, want its five keys confirmed", i, out)
			}
			for _, k := range keys[i] {
				if _, ok := pushed[1].Revocations[k]; !ok {
					t.Errorf("end %d's key %s is not in the account JWT pushed", i, k)
				}
			}
		}
		if out, err := s.Revoke(ctx(t), keys[3]); err != nil || !out.Done() || len(b.pushed()) != 2 {
			t.Errorf("a repeated end: %+v, %v, %d pushes; want it confirmed with no push", out, err, len(b.pushed()))
		}
	})
}

// TestEverySigningIsLaterThanTheLastAndCarriesEveryKeyBeforeIt: ends one after another sign at
// most once a second, each JWT issued later than the one before, revoking every key any earlier
// end put on the set.
func TestEverySigningIsLaterThanTheLastAndCarriesEveryKeyBeforeIt(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s, b := newSet(t)
		var all []string
		for i := range 5 {
			keys := userKeys(t, 3)
			all = append(all, keys...)
			if out, err := s.Revoke(ctx(t), keys); err != nil || !out.Done() {
				t.Fatalf("end %d: %+v, %v", i, out, err)
			}
		}
		pushed := b.pushed()
		for i, c := range pushed {
			if i > 0 && c.IssuedAt <= pushed[i-1].IssuedAt {
				t.Errorf("push %d issued at %d, not after %d", i, c.IssuedAt, pushed[i-1].IssuedAt)
			}
			for _, k := range all[:3*(i+1)] {
				if _, ok := c.Revocations[k]; !ok {
					t.Errorf("push %d lacks key %s added before it", i, k)
				}
			}
		}
	})
}

// TestARecheckSignsTheSetAgainWhenTheBrokerLostIt: something pushed the data account a JWT
// without the set's keys. A recheck within RecheckGrace of the set's last signing leaves it to
// that signing's round; after it, the recheck has a round sign and push the set again, and the
// next finds nothing to do. A revoke that comes while that round pushes is not held up by it:
// it is put on the set by the next round and confirmed.
func TestARecheckSignsTheSetAgainWhenTheBrokerLostIt(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s, b := newSet(t)
		keys := userKeys(t, 3)
		if out, err := s.Revoke(ctx(t), keys); err != nil || !out.Done() {
			t.Fatalf("the end: %+v, %v", out, err)
		}
		lost, _, err := s.Sign(nil)
		if err != nil {
			t.Fatal(err)
		}
		if err := b.Push(ctx(t), lost); err != nil {
			t.Fatal(err)
		}
		if again, err := s.Recheck(ctx(t)); again || err != nil {
			t.Fatalf("a recheck right after the signing: got %v, %v; want nothing done", again, err)
		}
		time.Sleep(RecheckGrace)

		pushing, release := make(chan struct{}), make(chan struct{})
		var first atomic.Bool
		b.onPush = func() {
			if first.CompareAndSwap(false, true) {
				close(pushing)
				<-release
			}
		}
		var again bool
		rechecked := make(chan struct{})
		go func() { defer close(rechecked); again, err = s.Recheck(ctx(t)) }()
		<-pushing
		more := userKeys(t, 2)
		var out *Outcome
		var rerr error
		revoked := make(chan struct{})
		go func() { defer close(revoked); out, rerr = s.Revoke(ctx(t), more) }()
		synctest.Wait() // the revoke waits for the round under way
		close(release)
		<-rechecked
		if !again || err != nil {
			t.Fatalf("a recheck past the grace with the broker missing the keys: got %v, %v; want the set signed again and confirmed", again, err)
		}
		<-revoked
		if rerr != nil || !out.Done() {
			t.Fatalf("the revoke during the recheck's round: %+v, %v; want it confirmed", out, rerr)
		}
		held, err := jwt.DecodeAccountClaims(b.held)
		if err != nil {
			t.Fatal(err)
		}
		for _, k := range append(keys, more...) {
			if _, ok := held.Revocations[k]; !ok {
				t.Errorf("the broker does not revoke %s after the recheck", k)
			}
		}
		time.Sleep(RecheckGrace)
		n := len(b.pushed())
		if again, err := s.Recheck(ctx(t)); again || err != nil || len(b.pushed()) != n {
			t.Fatalf("a recheck with the broker holding the set: got %v, %v, %d pushes more; want nothing done", again, err, len(b.pushed())-n)
		}

		// Past Keep, no key of the set need be revoked: a broker that lost them all is left so
		// (the next signing drops them), with nothing signed.
		if err := b.Push(ctx(t), lost); err != nil {
			t.Fatal(err)
		}
		s.Now = func() time.Time { return time.Now().Add(Keep + time.Minute) }
		n = len(b.pushed())
		if again, err := s.Recheck(ctx(t)); again || err != nil || len(b.pushed()) != n {
			t.Fatalf("a recheck of a set whose keys are past Keep: got %v, %v, %d pushes more; want nothing done", again, err, len(b.pushed())-n)
		}
	})
}

// listings is a broker whose connection listings are given in turn (the last one repeats).
type listings struct {
	noBroker
	mu    sync.Mutex
	polls []map[string]int
	asked int
}

func (l *listings) Servers(context.Context) (int, error) { return 1, nil }

func (l *listings) Connections(context.Context, []string, int) (map[string]int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := l.polls[min(l.asked, len(l.polls)-1)]
	l.asked++
	return n, nil
}

// An eviction counts a key gone only once a second listing agrees with the first that found
// none of them left: one listing can miss a connection that moved between two of its pages.
func TestAnEvictionCountsAKeyGoneOnlyWhenTwoListingsAgree(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := &listings{polls: []map[string]int{
			{"B": 1},  // A gone
			{},        // B gone too: listed again at once
			{"A": 1},  // the second listing finds A, which the first missed
			{},        // none again
			{},        // and a second listing agrees
			{"A": 99}, // never asked
		}}
		s := &Set{Broker: b}
		if got := s.Evict(ctx(t), []string{"A", "B"}); got != 2 || b.asked != 5 {
			t.Fatalf("Evict: %d keys gone after %d listings, want 2 after 5", got, b.asked)
		}
		stuck := &listings{polls: []map[string]int{{}, {"A": 1}}}
		c, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if got := (&Set{Broker: stuck}).Evict(c, []string{"A", "B"}); got != 1 {
			t.Fatalf("Evict with A listed until the deadline: %d keys gone, want 1 (B)", got)
		}
	})
}
