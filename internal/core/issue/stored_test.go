package issue_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cotal-ai/authplane/internal/core/issue"
	"github.com/cotal-ai/authplane/internal/testkit"
	"github.com/cotal-ai/authplane/subjects"
)

// clock is a settable clock.
type clock struct{ at atomic.Int64 }

func (c *clock) now() time.Time          { return time.Unix(0, c.at.Load()) }
func (c *clock) advance(d time.Duration) { c.at.Add(int64(d)) }

func newClock() *clock {
	c := &clock{}
	c.at.Store(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC).UnixNano())
	return c
}

func take(t *testing.T, s *issue.StoredBudget, name string, n int) bool {
	t.Helper()
	had, err := s.Take(context.Background(), name, n)
	if err != nil {
		t.Fatalf("take %d of %s: %v", n, name, err)
	}
	return had
}

// A stored bucket is the store's: a budget used up stays used up for another Stored on the
// same bucket (a restarted plane, another replica), comes back at its rate, and one name's
// use leaves another's alone. A refused take writes nothing.
func TestAStoredBudgetIsTheStoresNotTheReplicas(t *testing.T) {
	kv := testkit.NewKV()
	c := newClock()
	one := &issue.StoredBudget{KV: kv, Budget: issue.NewKeysOwner, PerSecond: 1, Burst: 10, Now: c.now}
	other := *one // another replica, or the plane after a restart

	if !take(t, one, "u_a", 6) || !take(t, &other, "u_a", 4) {
		t.Fatal("10 of a burst of 10, taken on two replicas: got a refusal, want both taken")
	}
	rev := kv.Revision()
	if take(t, one, "u_a", 1) || take(t, &other, "u_a", 1) {
		t.Error("the 11th key: got it, want refused on both replicas")
	}
	if kv.Revision() != rev {
		t.Errorf("refused takes wrote the bucket: revision %d, want %d", kv.Revision(), rev)
	}
	if !take(t, &other, "u_b", 10) {
		t.Error("another owner's burst: got refused, want it whole")
	}
	if take(t, one, "u_a", 11) {
		t.Error("a take past the burst: got it, want refused")
	}
	c.advance(2500 * time.Millisecond)
	if !take(t, &other, "u_a", 2) || take(t, one, "u_a", 1) {
		t.Error("after 2.5 s at 1 a second: want 2 tokens back, not 3")
	}
	c.advance(time.Hour)
	if !take(t, one, "u_a", 10) || take(t, one, "u_a", 1) {
		t.Error("after an hour: want the burst back, and no more")
	}
	if _, err := kv.Get(context.Background(), subjects.BudgetKey(issue.NewKeysOwner, "u_a")); err != nil {
		t.Errorf("the row: %v, want it at issue.%s.u_a", err, issue.NewKeysOwner)
	}
}

// Takes racing on two replicas grant exactly the burst, never more: each is a CAS at the
// revision read, and a lost one decides again on what the other wrote.
func TestStoredBudgetTakesRacingGrantTheBurstOnly(t *testing.T) {
	kv := testkit.NewKV()
	c := newClock()
	replicas := []*issue.StoredBudget{
		{KV: kv, Budget: issue.ConnectionKeysOwner, PerSecond: 0.001, Burst: 25, Now: c.now},
		{KV: kv, Budget: issue.ConnectionKeysOwner, PerSecond: 0.001, Burst: 25, Now: c.now},
	}
	var granted atomic.Int64
	var wg sync.WaitGroup
	for i := range 60 {
		wg.Go(func() {
			had, err := replicas[i%2].Take(context.Background(), "u_a", 1)
			if err != nil {
				t.Error(err)
			}
			if had {
				granted.Add(1)
			}
		})
	}
	wg.Wait()
	if granted.Load() != 25 {
		t.Errorf("60 racing takes of a burst of 25: %d granted, want 25", granted.Load())
	}
}

// A write whose outcome was unknown and that did land is not taken twice.
func TestAStoredTakeOfUnknownOutcomeIsSettledByReading(t *testing.T) {
	for _, lands := range []bool{true, false} {
		kv := testkit.NewKV()
		c := newClock()
		s := &issue.StoredBudget{KV: kv, Budget: issue.NewKeysOwner, PerSecond: 0.001, Burst: 3, Now: c.now}
		kv.Fault = testkit.FailOnce(lands)
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		if had, err := s.Take(ctx, "u_a", 2); err != nil || !had {
			t.Fatalf("lands %v: a take of unknown outcome: %v %v, want taken", lands, had, err)
		}
		cancel()
		if !take(t, s, "u_a", 1) || take(t, s, "u_a", 1) {
			t.Errorf("lands %v: after 2 of 3 taken once: want 1 left", lands)
		}
	}
}

// TakeAll takes nothing, and writes nothing, when any of its wants lacks: a re-registration
// with fresh keys refused by its owner's new keys leaves its owner's re-registrations alone.
func TestTakeAllTakesNothingWhenOneLacks(t *testing.T) {
	kv := testkit.NewKV()
	c := newClock()
	reregs := &issue.StoredBudget{KV: kv, Budget: issue.ReregistrationsOwner, PerSecond: 0.001, Burst: 5, Now: c.now}
	keys := &issue.StoredBudget{KV: kv, Budget: issue.NewKeysOwner, PerSecond: 0.001, Burst: 10, Now: c.now}
	both := func(n int) int {
		t.Helper()
		short, err := issue.TakeAll(context.Background(), issue.Want{From: reregs, Name: "u_a", N: 1}, issue.Want{From: keys, Name: "u_a", N: n})
		if err != nil {
			t.Fatal(err)
		}
		return short
	}
	for i, tc := range []struct{ keys, short int }{{5, -1}, {5, -1}, {1, 1}, {0, -1}, {0, -1}, {0, -1}, {0, 0}} {
		rev := kv.Revision()
		if got := both(tc.keys); got != tc.short {
			t.Fatalf("take %d (%d keys): short %d, want %d", i+1, tc.keys, got, tc.short)
		}
		if tc.short >= 0 && kv.Revision() != rev {
			t.Errorf("take %d was refused and wrote the bucket", i+1)
		}
	}
}
