package fence_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cotal-ai/authplane/internal/core/fence"
	"github.com/cotal-ai/authplane/internal/testkit"
)

// grouped returns a bucket holding r at "k", grouped, with the fence there observed.
func grouped(t *testing.T, r row) (*testkit.KV, *fence.Grouped, *fence.Fence[row], *fence.Observed[row]) {
	t.Helper()
	kv := testkit.NewKV()
	put(t, kv, r)
	g := fence.Group(kv)
	f := fence.New(g, "k", parse, nil)
	o, err := f.Observe(ctx(t))
	if err != nil {
		t.Fatal(err)
	}
	return kv, g, f, o
}

// waitFor polls cond until it holds, failing after a few seconds: never sleep and hope.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	testkit.CheckFor(t, 5*time.Second, time.Millisecond, func() error {
		if !cond() {
			return fmt.Errorf("not yet: %s", what)
		}
		return nil
	})
}

// holdFirstWrite makes the bucket's first write wait until release is closed, and counts every
// write; entered is closed once the first write waits.
func holdFirstWrite(kv *testkit.KV) (writes *atomic.Int64, entered, release chan struct{}) {
	writes = &atomic.Int64{}
	entered, release = make(chan struct{}), make(chan struct{})
	kv.Fault = func(string) (error, bool) {
		if writes.Add(1) == 1 {
			close(entered)
			<-release
		}
		return nil, true
	}
	return writes, entered, release
}

// A grouped commit alone is a commit: it lands on an unchanged row, again after another commit
// rewrote the same bytes, settles an unknown outcome, and is refused once a fence writer
// changed the row.
func TestAGroupedCommitAloneIsACommit(t *testing.T) {
	t.Run("lands, and again after another commit", func(t *testing.T) {
		_, _, _, o := grouped(t, fresh("open", 0))
		first, err := o.Commit(ctx(t))
		if err != nil || first.Revision <= o.Revision || string(first.Raw) != string(o.Raw) {
			t.Fatalf("got %+v, %v; want a new revision with the bytes as read", first, err)
		}
		if second, err := o.Commit(ctx(t)); err != nil || second.Revision <= first.Revision {
			t.Fatalf("from the first observation again: got %+v, %v; want it to land after the first", second, err)
		}
	})
	t.Run("settles an unknown outcome", func(t *testing.T) {
		for _, lands := range []bool{true, false} {
			kv, _, _, o := grouped(t, fresh("open", 0))
			kv.Fault = testkit.FailOnce(lands)
			if _, err := o.Commit(ctx(t)); err != nil {
				t.Fatalf("the first write landed %v: got %v, want the commit to land", lands, err)
			}
		}
	})
	t.Run("refused after a fence write", func(t *testing.T) {
		_, _, _, o := grouped(t, fresh("open", 0))
		if _, err := o.Write(ctx(t), fresh("frozen", 0)); err != nil {
			t.Fatal(err)
		}
		if _, err := o.Commit(ctx(t)); !errors.Is(err, fence.ErrMoved) {
			t.Fatalf("got %v, want ErrMoved", err)
		}
	})
}

// Sixteen commits of one observation: the first CAS is held while the fifteen others queue;
// they then commit together, with one CAS and no read, at the revision after the first's.
func TestConcurrentCommitsOfTheSameBytesShareOneCAS(t *testing.T) {
	kv, g, _, o := grouped(t, fresh("open", 0))
	writes, entered, release := holdFirstWrite(kv)
	const n = 16
	revs := make([]uint64, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	wg.Go(func() {
		c, err := o.Commit(ctx(t))
		if err == nil {
			revs[0] = c.Revision
		}
		errs[0] = err
	})
	<-entered
	for i := 1; i < n; i++ {
		wg.Go(func() {
			c, err := o.Commit(ctx(t))
			if err == nil {
				revs[i] = c.Revision
			}
			errs[i] = err
		})
	}
	waitFor(t, "fifteen commits queued behind the first", func() bool { return g.Waiting("k") == n-1 })
	close(release)
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatalf("got %v, want every commit to land", err)
	}
	if got := writes.Load(); got != 2 {
		t.Fatalf("got %d writes, want 2: the first commit's, and one for the fifteen queued behind it", got)
	}
	for i := 1; i < n; i++ {
		if revs[i] != revs[1] || revs[i] <= revs[0] {
			t.Fatalf("commit %d landed at %d: want every queued commit at one revision after the first's %d", i, revs[i], revs[0])
		}
	}
}

// A commit whose request ends while it waits for its group is withdrawn: it fails, saying
// nothing was sent for it, and the group that follows does not carry it.
func TestAGroupedCommitWithdrawnBeforeItsGroupIsSentWritesNothing(t *testing.T) {
	kv, g, _, o := grouped(t, fresh("open", 0))
	writes, entered, release := holdFirstWrite(kv)
	done := make(chan error, 1)
	go func() {
		_, err := o.Commit(ctx(t))
		done <- err
	}()
	<-entered
	short, cancel := context.WithCancel(context.Background())
	withdrawn := make(chan error, 1)
	go func() {
		_, err := o.Commit(short)
		withdrawn <- err
	}()
	waitFor(t, "the second commit queued", func() bool { return g.Waiting("k") == 1 })
	cancel()
	err := <-withdrawn
	if !errors.Is(err, context.Canceled) || errors.Is(err, fence.ErrUnknownOutcome) {
		t.Fatalf("got %v, want it withdrawn (canceled, outcome known: nothing sent)", err)
	}
	close(release)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if got := writes.Load(); got != 1 {
		t.Fatalf("got %d writes, want only the first commit's", got)
	}
}

// Round after round, eight commits of one observation race a fence write on the same row:
// every commit that lands does so before the fence write, and every other is refused moved.
func TestNoGroupedCommitLandsAfterAFenceWriteItRaced(t *testing.T) {
	_, _, f, _ := grouped(t, fresh("open", 0))
	var landed, refused int
	for round := range 200 {
		o, err := f.Observe(ctx(t))
		if err != nil {
			t.Fatal(err)
		}
		var wg sync.WaitGroup
		var mu sync.Mutex
		var commits []uint64
		var fenceRev uint64
		for range 8 {
			wg.Go(func() {
				c, err := o.Commit(ctx(t))
				mu.Lock()
				defer mu.Unlock()
				switch {
				case err == nil:
					commits = append(commits, c.Revision)
				case errors.Is(err, fence.ErrMoved):
					refused++
				default:
					t.Errorf("round %d: got %v, want a commit or ErrMoved", round, err)
				}
			})
		}
		wg.Go(func() {
			w, err := o.Write(ctx(t), fresh("open", round+1))
			if err != nil {
				t.Errorf("round %d: the fence write: %v", round, err)
				return
			}
			mu.Lock()
			fenceRev = w.Revision
			mu.Unlock()
		})
		wg.Wait()
		for _, rev := range commits {
			if rev >= fenceRev {
				t.Fatalf("round %d: a commit landed at %d, at or after the fence write at %d", round, rev, fenceRev)
			}
		}
		landed += len(commits)
	}
	t.Logf("200 rounds: %d commits landed before the fence write, %d refused", landed, refused)
}

// A fence write lands while renewals commit one group after another on its row, as a
// re-registration must while its instance's managers renew: it waits for the group in flight
// and goes before the commits waiting, rather than losing its CAS to each new group until its
// deadline. Every write here takes a millisecond, as a synced one does.
func TestAFenceWriteLandsThroughASteadyStreamOfCommits(t *testing.T) {
	kv, _, f, _ := grouped(t, fresh("open", 0))
	kv.Fault = func(string) (error, bool) {
		time.Sleep(time.Millisecond) // the disk's synced write, not a wait for an event
		return nil, true
	}
	var commits atomic.Int64
	var wg sync.WaitGroup
	stop := make(chan struct{})
	for range 16 {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				o, err := f.Observe(ctx(t))
				if err != nil || o.Row.Epoch != 0 {
					return // the write landed: the old registration renews nothing more
				}
				if _, err := o.Commit(ctx(t)); err == nil {
					commits.Add(1)
				}
			}
		})
	}
	defer func() { close(stop); wg.Wait() }()
	waitFor(t, "commits flowing", func() bool { return commits.Load() >= 50 })
	for round := range 20 {
		o, err := f.Observe(ctx(t))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := o.Write(ctx(t), fresh("open", 0)); err != nil {
			t.Fatalf("write %d, %d commits landed so far: %v", round, commits.Load(), err)
		}
	}
}

// Updates of one key by many goroutines of one process, on a grouped bucket, each read, decide
// and write alone: none loses a CAS to another, so sixteen updates are sixteen writes, and every
// one of them is in the row (an owner's registrations taking slots of its quota at once).
func TestUpdatesOfOneKeyOnAGroupedBucketNeverLoseACASToEachOther(t *testing.T) {
	kv, _, f, _ := grouped(t, fresh("open", 0))
	var writes atomic.Int64
	kv.Fault = func(string) (error, bool) {
		writes.Add(1)
		time.Sleep(time.Millisecond) // the disk's synced write, not a wait for an event
		return nil, true
	}
	const n = 16
	var wg sync.WaitGroup
	for range n {
		wg.Go(func() {
			_, err := f.Update(ctx(t), func(cur *fence.Observed[row]) (row, error) {
				next := fresh(cur.Row.State, cur.Row.Epoch+1)
				return next, nil
			})
			if err != nil {
				t.Errorf("update: %v", err)
			}
		})
	}
	wg.Wait()
	o, err := f.Observe(ctx(t))
	if err != nil {
		t.Fatal(err)
	}
	if o.Row.Epoch != n || writes.Load() != n {
		t.Errorf("got epoch %d after %d writes, want %d updates in %d writes", o.Row.Epoch, writes.Load(), n, n)
	}
}
