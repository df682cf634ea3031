package fence_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cotal-ai/authplane/internal/core/fence"
	"github.com/cotal-ai/authplane/internal/core/store"
	"github.com/cotal-ai/authplane/internal/testkit"
	"github.com/cotal-ai/authplane/subjects"
)

// row is a fence row as the plane's are: content and a writer-unique nonce.
type row struct {
	State string `json:"state"`
	Epoch int    `json:"epoch"`
	Nonce string `json:"nonce"`
}

func parse(data []byte) (row, error) {
	var r row
	if err := json.Unmarshal(data, &r); err != nil {
		return row{}, err
	}
	if r.State == "" {
		return row{}, errors.New("no state")
	}
	return r, nil
}

func fresh(state string, epoch int) row {
	return row{State: state, Epoch: epoch, Nonce: subjects.NewNonce()}
}

func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	t.Cleanup(cancel)
	return c
}

// setup returns a bucket holding r at key "k" and the fence there, observed.
func setup(t *testing.T, r row) (*testkit.KV, *fence.Fence[row], *fence.Observed[row]) {
	t.Helper()
	kv := testkit.NewKV()
	put(t, kv, r)
	f := fence.New(kv, "k", parse, nil)
	o, err := f.Observe(ctx(t))
	if err != nil {
		t.Fatal(err)
	}
	return kv, f, o
}

// countingKV is a bucket that counts the writes fences retry on it.
type countingKV struct {
	*testkit.KV
	retries atomic.Int64
}

func (c *countingKV) Retried() { c.retries.Add(1) }

// put writes r at "k" unconditionally, as another writer would.
func put(t *testing.T, kv *testkit.KV, r row) {
	t.Helper()
	data, err := json.Marshal(r)
	if err != nil {
		t.Fatal(err)
	}
	kv.Put("k", data)
}

func TestObserveTellsAbsentFromPresentAndRefusesMarkersAndJunk(t *testing.T) {
	kv := testkit.NewKV()
	f := fence.New(kv, "k", parse, nil)
	o, err := f.Observe(ctx(t))
	if err != nil || !o.Absent() {
		t.Fatalf("never written: got %+v, %v; want an absent observation", o, err)
	}
	put(t, kv, fresh("open", 0))
	if o, err = f.Observe(ctx(t)); err != nil || o.Absent() || o.Row.State != "open" {
		t.Fatalf("written: got %+v, %v; want the row", o, err)
	}
	kv.Put("k", []byte(`{"state":""}`))
	if _, err := f.Observe(ctx(t)); !errors.Is(err, fence.ErrMalformed) {
		t.Fatalf("junk: got %v, want ErrMalformed", err)
	}
	kv.Delete("k")
	if _, err := f.Observe(ctx(t)); !errors.Is(err, fence.ErrGone) {
		t.Fatalf("marker: got %v, want ErrGone", err)
	}
}

func TestCommitLandsOnAnUnchangedRowWithTheBytesAsRead(t *testing.T) {
	_, f, o := setup(t, fresh("open", 0))
	if _, err := o.Commit(ctx(t)); err != nil {
		t.Fatalf("got %v, want the commit to land", err)
	}
	now, err := f.Observe(ctx(t))
	if err != nil {
		t.Fatal(err)
	}
	if now.Revision == o.Revision || string(now.Raw) != string(o.Raw) {
		t.Fatalf("got revision %d bytes %s, want a new revision with the bytes as read", now.Revision, now.Raw)
	}
}

func TestCommitRetriesWhenAnotherCommitRewroteTheSameBytes(t *testing.T) {
	kv := &countingKV{KV: testkit.NewKV()}
	put(t, kv.KV, fresh("open", 0))
	o, err := fence.New(kv, "k", parse, nil).Observe(ctx(t))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := o.Commit(ctx(t)); err != nil {
		t.Fatal(err)
	}
	before := kv.retries.Load()
	if _, err := o.Commit(ctx(t)); err != nil {
		t.Fatalf("got %v, want a retry at the new revision to land", err)
	}
	// The retry is sent at once, without a pause, and still counted for the metrics.
	if n := kv.retries.Load() - before; n != 1 {
		t.Fatalf("the bucket's retries grew by %d, want 1 (the one retry)", n)
	}
}

func TestCommitIsRefusedOnceAFenceWriterChangedTheRow(t *testing.T) {
	_, _, o := setup(t, fresh("open", 0))
	if _, err := o.Write(ctx(t), fresh("frozen", 0)); err != nil {
		t.Fatal(err)
	}
	if _, err := o.Commit(ctx(t)); !errors.Is(err, fence.ErrMoved) {
		t.Fatalf("got %v, want ErrMoved", err)
	}
}

func TestCommitOnAnAbsentObservationIsRefused(t *testing.T) {
	o, err := fence.New(testkit.NewKV(), "k", parse, nil).Observe(ctx(t))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := o.Commit(ctx(t)); !errors.Is(err, fence.ErrMoved) {
		t.Fatalf("got %v, want ErrMoved: a commit needs a row to pin", err)
	}
}

func TestCommitSettlesAnUnknownOutcomeByRereading(t *testing.T) {
	for _, lands := range []bool{true, false} {
		t.Run(fmt.Sprintf("write landed %v", lands), func(t *testing.T) {
			kv, _, o := setup(t, fresh("open", 0))
			kv.Fault = testkit.FailOnce(lands)
			if _, err := o.Commit(ctx(t)); err != nil {
				t.Fatalf("got %v, want the commit settled and landed", err)
			}
		})
	}
}

func TestWriteRecognisesItsOwnWriteAfterAnUnknownOutcome(t *testing.T) {
	kv, f, o := setup(t, fresh("open", 0))
	kv.Fault = testkit.FailOnce(true)
	next := fresh("open", 1)
	n, err := o.Write(ctx(t), next)
	if err != nil {
		t.Fatalf("got %v, want the write recognised as landed", err)
	}
	now, err := f.Observe(ctx(t))
	if err != nil {
		t.Fatal(err)
	}
	if now.Revision != n.Revision || now.Row != next || kv.Revision() != o.Revision+1 {
		t.Fatalf("got %+v at %d after %d writes, want exactly one write of %+v", now.Row, now.Revision, kv.Revision()-o.Revision, next)
	}
}

func TestWriteRetriesAFirstCreateWhoseUnknownOutcomeDidNotLand(t *testing.T) {
	kv := testkit.NewKV()
	kv.Fault = testkit.FailOnce(false)
	o, err := fence.New(kv, "k", parse, nil).Observe(ctx(t))
	if err != nil {
		t.Fatal(err)
	}
	n, err := o.Write(ctx(t), fresh("open", 0))
	if err != nil {
		t.Fatalf("got %v, want the create retried and landed", err)
	}
	if n.Revision != 1 || kv.Revision() != 1 {
		t.Fatalf("got revision %d after %d writes, want one write", n.Revision, kv.Revision())
	}
}

func TestWriteFromAbsentLosesToAConcurrentCreate(t *testing.T) {
	kv := testkit.NewKV()
	f := fence.New(kv, "k", parse, nil)
	o, err := f.Observe(ctx(t))
	if err != nil {
		t.Fatal(err)
	}
	put(t, kv, fresh("open", 0)) // created by someone else after we observed nothing
	if _, err := o.Write(ctx(t), fresh("open", 0)); !errors.Is(err, fence.ErrMoved) {
		t.Fatalf("got %v, want ErrMoved", err)
	}
}

func TestWriteRetriesPastACommitAndLosesToAFenceWriter(t *testing.T) {
	_, _, o := setup(t, fresh("open", 0))
	// A mint commits (same bytes): the write still lands.
	if _, err := o.Commit(ctx(t)); err != nil {
		t.Fatal(err)
	}
	n, err := o.Write(ctx(t), fresh("open", 1))
	if err != nil {
		t.Fatalf("after a commit: got %v, want the write to land", err)
	}
	// A fence writer moved it: a write from the old observation is refused.
	if _, err := o.Write(ctx(t), fresh("frozen", 0)); !errors.Is(err, fence.ErrMoved) {
		t.Fatalf("after a fence write: got %v, want ErrMoved", err)
	}
	if n.Row.Epoch != 1 {
		t.Fatalf("got epoch %d, want 1", n.Row.Epoch)
	}
}

func TestAMarkerIsFinalForEveryVerb(t *testing.T) {
	kv, f, o := setup(t, fresh("open", 0))
	kv.Delete("k")
	start := time.Now()
	if _, err := o.Commit(ctx(t)); !errors.Is(err, fence.ErrGone) {
		t.Fatalf("commit: got %v, want ErrGone", err)
	}
	absent := testkit.NewKV()
	ao, err := fence.New(absent, "k", parse, nil).Observe(ctx(t))
	if err != nil {
		t.Fatal(err)
	}
	absent.Delete("k")
	if _, err := ao.Write(ctx(t), fresh("open", 0)); !errors.Is(err, fence.ErrGone) {
		t.Fatalf("create over a marker: got %v, want ErrGone", err)
	}
	if _, err := f.Update(ctx(t), func(*fence.Observed[row]) (row, error) { return fresh("open", 9), nil }); !errors.Is(err, fence.ErrGone) {
		t.Fatalf("update: got %v, want ErrGone", err)
	}
	if time.Since(start) > time.Second {
		t.Fatalf("took %s; a delete marker is final, not something to retry", time.Since(start))
	}
}

func TestUpdateDecidesAgainFromEachNewObservation(t *testing.T) {
	kv, f, _ := setup(t, fresh("open", 0))
	var seen []int
	n, err := f.Update(ctx(t), func(o *fence.Observed[row]) (row, error) {
		seen = append(seen, o.Row.Epoch)
		if len(seen) == 1 {
			put(t, kv, fresh("open", 5)) // a concurrent writer lands between read and write
		}
		return fresh("open", o.Row.Epoch+1), nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(seen) != 2 || seen[1] != 5 || n.Row.Epoch != 6 {
		t.Fatalf("got decisions on epochs %v and a row at epoch %d, want [0 5] and 6", seen, n.Row.Epoch)
	}
}

func TestUpdateReturnsTheRefusalOfDecide(t *testing.T) {
	kv, f, _ := setup(t, fresh("retired", 0))
	before := kv.Revision()
	no := errors.New("retired is terminal")
	if _, err := f.Update(ctx(t), func(*fence.Observed[row]) (row, error) { return row{}, no }); !errors.Is(err, no) {
		t.Fatalf("got %v, want decide's refusal", err)
	}
	if kv.Revision() != before {
		t.Fatal("a refused update wrote")
	}
}

func TestUpdateWritesNothingWhenDecideKeepsTheRow(t *testing.T) {
	kv, f, o := setup(t, fresh("retired", 0))
	before := kv.Revision()
	n, err := f.Update(ctx(t), func(*fence.Observed[row]) (row, error) {
		return row{}, fmt.Errorf("already retired: %w", fence.ErrKeep)
	})
	if err != nil {
		t.Fatalf("got %v, want the observation kept", err)
	}
	if kv.Revision() != before || n.Revision != o.Revision || n.Row != o.Row {
		t.Fatalf("got revision %d (bucket %d → %d), want the row as observed at %d and nothing written", n.Revision, before, kv.Revision(), o.Revision)
	}
}

func TestARetryLoopEndsAtItsDeadlineSayingWhy(t *testing.T) {
	for _, c := range []struct {
		name  string
		cause error
		want  error
	}{
		// Every CAS loses but the row reads unchanged: contention, retried until the deadline.
		{"contention", store.ErrCASLost, context.DeadlineExceeded},
		// Every write times out and lands nowhere: the outcome stays unknown.
		{"unknown outcome", store.ErrUnknownOutcome, fence.ErrUnknownOutcome},
	} {
		t.Run(c.name, func(t *testing.T) {
			kv, _, o := setup(t, fresh("open", 0))
			before := kv.Revision()
			kv.Fault = func(key string) (error, bool) { return fmt.Errorf("%s: %w", key, c.cause), false }
			dl, cancel := context.WithTimeout(context.Background(), 150*time.Millisecond)
			defer cancel()
			_, err := o.Write(dl, fresh("open", 1))
			if !errors.Is(err, c.want) || !strings.Contains(err.Error(), "gave up") {
				t.Fatalf("got %v, want %v after giving up", err, c.want)
			}
			if kv.Revision() != before {
				t.Fatal("a write that never landed changed the bucket")
			}
		})
	}
}

func TestWriteStampsEveryRowAndNeverWritesOneThatDoesNotParse(t *testing.T) {
	kv := testkit.NewKV()
	stamps := 0
	f := fence.New(kv, "k", parse, func(r *row) {
		stamps++
		r.Nonce = fmt.Sprintf("n%d", stamps)
	})
	o, err := f.Observe(ctx(t))
	if err != nil {
		t.Fatal(err)
	}
	a, err := o.Write(ctx(t), row{State: "open"})
	if err != nil {
		t.Fatal(err)
	}
	b, err := a.Write(ctx(t), a.Row) // the same row again
	if err != nil {
		t.Fatal(err)
	}
	if string(a.Raw) == string(b.Raw) || b.Row.Nonce != "n2" {
		t.Fatalf("got %s then %s, want a fresh stamp on each write", a.Raw, b.Raw)
	}
	before := kv.Revision()
	if _, err := b.Write(ctx(t), row{State: ""}); !errors.Is(err, fence.ErrMalformed) {
		t.Fatalf("a row that does not parse: got %v, want ErrMalformed", err)
	}
	if kv.Revision() != before {
		t.Fatal("a row that does not parse was written")
	}
}

// UpdateFrom decides on the observation it is handed and writes at its revision; when another
// writer moved the row since, it decides again on the row as read, and the write lands on that.
func TestUpdateFromDecidesOnWhatItHoldsAndRereadsARowThatMoved(t *testing.T) {
	kv, f, o := setup(t, fresh("open", 1))
	var seen []int
	bump := func(cur *fence.Observed[row]) (row, error) {
		seen = append(seen, cur.Row.Epoch)
		return fresh("open", cur.Row.Epoch+1), nil
	}
	o2, err := f.UpdateFrom(ctx(t), o, bump)
	if err != nil || o2.Row.Epoch != 2 || fmt.Sprint(seen) != "[1]" {
		t.Fatalf("on an unmoved row: got %+v, %v, decided on %v; want epoch 2, decided once on 1", o2, err, seen)
	}
	put(t, kv, fresh("open", 7)) // another writer
	seen = nil
	o3, err := f.UpdateFrom(ctx(t), o2, bump)
	if err != nil || o3.Row.Epoch != 8 || fmt.Sprint(seen) != "[2 7]" {
		t.Fatalf("on a row that moved: got %+v, %v, decided on %v; want epoch 8, decided on 2 then 7", o3, err, seen)
	}
	seen = nil
	if o4, err := f.UpdateFrom(ctx(t), nil, bump); err != nil || o4.Row.Epoch != 9 || fmt.Sprint(seen) != "[8]" {
		t.Fatalf("with nothing held: got %+v, %v, decided on %v; want epoch 9 from a read of 8", o4, err, seen)
	}
}
