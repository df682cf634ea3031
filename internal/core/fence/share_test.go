package fence_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cotal-ai/authplane/internal/core/fence"
	"github.com/cotal-ai/authplane/internal/core/store"
	"github.com/cotal-ai/authplane/internal/testkit"
)

// counted is a bucket that counts its gets; hold, when set, runs after a get read its entry
// and before it answers (the answer in flight).
type counted struct {
	*testkit.KV
	gets atomic.Int64
	hold func(n int64)
}

func (c *counted) Get(ctx context.Context, key string) (store.Entry, error) {
	e, err := c.KV.Get(ctx, key)
	n := c.gets.Add(1)
	if c.hold != nil {
		c.hold(n)
	}
	return e, err
}

// holdFirstGet makes the bucket's first get wait, its entry already read, until release is
// closed; entered is closed once it waits.
func holdFirstGet(c *counted) (entered, release chan struct{}) {
	entered, release = make(chan struct{}), make(chan struct{})
	c.hold = func(n int64) {
		if n == 1 {
			close(entered)
			<-release
		}
	}
	return entered, release
}

func epochOf(t *testing.T, e store.Entry, err error) int {
	t.Helper()
	if err != nil {
		t.Error(err)
		return -1
	}
	r, err := parse(e.Value)
	if err != nil {
		t.Error(err)
		return -1
	}
	return r.Epoch
}

// readEpoch is the epoch a Get of "k" reads.
func readEpoch(t *testing.T, s *fence.Shared) int {
	e, err := s.Get(ctx(t), "k")
	return epochOf(t, e, err)
}

// Gets that come while a get is in flight never take its answer: they share the next get,
// sent after they came, so a write acknowledged before they began is in what they read; and
// however many they are, they cost one get.
func TestSharedReadsNeverAnswerWithAGetSentBeforeThem(t *testing.T) {
	c := &counted{KV: testkit.NewKV()}
	put(t, c.KV, row{State: "live", Epoch: 1})
	entered, release := holdFirstGet(c)
	s := fence.Share(c)

	first := make(chan int, 1)
	go func() { e, err := s.Get(ctx(t), "k"); first <- epochOf(t, e, err) }()
	<-entered
	put(t, c.KV, row{State: "live", Epoch: 2}) // acknowledged while the first get's answer is on its way

	const readers = 10
	var wg sync.WaitGroup
	epochs := make([]int, readers)
	for i := range readers {
		wg.Go(func() { e, err := s.Get(ctx(t), "k"); epochs[i] = epochOf(t, e, err) })
	}
	waitFor(t, "every reader waits for the next get", func() bool { return s.Sharing("k") == readers })
	close(release)
	wg.Wait()

	if got := <-first; got != 1 {
		t.Errorf("the first get read epoch %d, want 1 (it was sent before the write)", got)
	}
	for i, got := range epochs {
		if got != 2 {
			t.Errorf("reader %d read epoch %d, want 2: it took an answer sent before it came", i, got)
		}
	}
	if n := c.gets.Load(); n != 2 {
		t.Errorf("%d gets for 1 + %d reads, want 2 (one in flight, one shared)", n, readers)
	}
	// Nothing in flight any more: the next Get sends its own.
	if got := readEpoch(t, s); got != 2 || c.gets.Load() != 3 {
		t.Errorf("a Get alone read epoch %d with %d gets in all, want 2 and 3", got, c.gets.Load())
	}
}

// A Get that gives up waiting answers store.ErrUnknownOutcome at once, and leaves the others
// their answer; a shared get that nobody waits for any more is not sent.
func TestASharedReadThatGivesUpLeavesTheOthersTheirAnswer(t *testing.T) {
	c := &counted{KV: testkit.NewKV()}
	put(t, c.KV, row{State: "live", Epoch: 1})
	entered, release := holdFirstGet(c)
	s := fence.Share(c)
	go func() { _, _ = s.Get(ctx(t), "k") }()
	<-entered

	short, cancel := context.WithCancel(context.Background())
	gaveUp := make(chan error, 1)
	go func() { _, err := s.Get(short, "k"); gaveUp <- err }()
	stays := make(chan int, 1)
	go func() { e, err := s.Get(ctx(t), "k"); stays <- epochOf(t, e, err) }()
	waitFor(t, "two readers wait", func() bool { return s.Sharing("k") == 2 })
	cancel()
	if err := <-gaveUp; !errors.Is(err, store.ErrUnknownOutcome) || !errors.Is(err, context.Canceled) {
		t.Errorf("a reader that gave up got %v, want store.ErrUnknownOutcome and its context's error", err)
	}
	close(release)
	if got := <-stays; got != 1 {
		t.Errorf("the reader that stayed read epoch %d, want 1", got)
	}

	t.Run("nobody waits any more", func(t *testing.T) {
		c := &counted{KV: testkit.NewKV()}
		put(t, c.KV, row{State: "live", Epoch: 1})
		entered, release := holdFirstGet(c)
		s := fence.Share(c)
		done := make(chan struct{})
		go func() { defer close(done); _, _ = s.Get(ctx(t), "k") }()
		<-entered
		short, cancel := context.WithCancel(context.Background())
		gaveUp := make(chan error, 1)
		go func() { _, err := s.Get(short, "k"); gaveUp <- err }()
		waitFor(t, "a reader waits", func() bool { return s.Sharing("k") == 1 })
		cancel()
		<-gaveUp
		close(release)
		<-done
		if got := readEpoch(t, s); got != 1 || c.gets.Load() != 2 {
			t.Errorf("read epoch %d with %d gets in all, want 1 and 2: a shared get nobody waited for was sent", got, c.gets.Load())
		}
	})
}

// Readers racing a writer never read a row older than the last write acknowledged before their
// read began, whether they share a get or send their own.
func TestSharedReadsSeeEveryWriteAcknowledgedBeforeThem(t *testing.T) {
	c := &counted{KV: testkit.NewKV()}
	put(t, c.KV, row{State: "live", Epoch: 0})
	c.hold = func(int64) { time.Sleep(50 * time.Microsecond) } // answers in flight long enough to share
	s := fence.Share(c)
	var acked atomic.Int64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		for epoch := 1; ; epoch++ {
			select {
			case <-stop:
				return
			default:
			}
			put(t, c.KV, row{State: "live", Epoch: epoch})
			acked.Store(int64(epoch))
		}
	})
	var reads atomic.Int64
	for range 8 {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				before := acked.Load()
				got := readEpoch(t, s)
				if int64(got) < before {
					t.Errorf("read epoch %d after epoch %d was acknowledged", got, before)
					return
				}
				reads.Add(1)
			}
		})
	}
	time.Sleep(300 * time.Millisecond) // the race's budget, not a wait for a condition
	close(stop)
	wg.Wait()
	t.Logf("%d reads in %d gets", reads.Load(), c.gets.Load())
	if reads.Load() == 0 {
		t.Fatal("no read completed")
	}
}
