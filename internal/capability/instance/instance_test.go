package instance

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/cotal-ai/authplane/internal/core/issue"
	"github.com/cotal-ai/authplane/internal/core/store"
	"github.com/cotal-ai/authplane/internal/testkit"
	"github.com/cotal-ai/authplane/subjects"
)

func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	t.Cleanup(cancel)
	return c
}

func TestRegisterStartsAtEpochZeroAndAdvancesOnEveryRestart(t *testing.T) {
	kv, iid := testkit.NewKV(), subjects.NewUID()
	for want := uint64(0); want < 3; want++ {
		g, err := Register(ctx(t), kv, iid, false)
		if err != nil {
			t.Fatal(err)
		}
		if g.Row.ProcessEpoch != want || g.Row.State != issue.GateOpen || g.Row.Principal != planePrincipal(iid) {
			t.Fatalf("registration %d: got %+v, want open at epoch %d", want, g.Row, want)
		}
	}
}

func TestRegisterRefusesAGateThatWasLostAndWritesNothing(t *testing.T) {
	kv, iid := testkit.NewKV(), subjects.NewUID()
	if _, err := Register(ctx(t), kv, iid, true); !errors.Is(err, store.ErrLost) || !strings.Contains(err.Error(), "epgate.auth."+iid) {
		t.Fatalf("an identity that registered before, its gate absent: got %v, want store.ErrLost naming the gate", err)
	}
	if kv.Revision() != 0 {
		t.Fatalf("the refused registration wrote %d times, want none", kv.Revision())
	}
	g, err := Register(ctx(t), kv, iid, false)
	if err != nil {
		t.Fatal(err)
	}
	if again, err := Register(ctx(t), kv, iid, true); err != nil || again.Row.ProcessEpoch != g.Row.ProcessEpoch+1 {
		t.Fatalf("a registered identity, its gate present: got %+v %v, want the next epoch", again, err)
	}
}

func TestRegisterSettlesAnUnknownOutcomeAndRefusesAClosedGate(t *testing.T) {
	kv, iid := testkit.NewKV(), subjects.NewUID()
	kv.Fault = testkit.FailOnce(true)
	g, err := Register(ctx(t), kv, iid, false)
	if err != nil || g.Row.ProcessEpoch != 0 || kv.Revision() != 1 {
		t.Fatalf("got %+v %v after %d writes, want one registration at epoch 0", g, err, kv.Revision())
	}
	retired := g.Row
	retired.State, retired.Op = issue.GateRetired, &issue.GateOp{OpID: "x", Kind: issue.OpRetirement}
	if _, err := g.Write(ctx(t), retired); err != nil {
		t.Fatal(err)
	}
	if _, err := Register(ctx(t), kv, iid, false); err == nil {
		t.Fatal("got a registration on a retired gate, want a refusal")
	}
}

func TestWatchReturnsErrFencedWhenANewerRegistrationLands(t *testing.T) {
	kv, iid := testkit.NewKV(), subjects.NewUID()
	g, err := Register(ctx(t), kv, iid, false)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- Watch(ctx(t), kv, g, nil) }()
	// A mint's commit (the same bytes) does not fence.
	if _, err := g.Commit(ctx(t)); err != nil {
		t.Fatal(err)
	}
	if _, err := Register(ctx(t), kv, iid, false); err != nil {
		t.Fatal(err)
	}
	wantFenced(t, done, "the watch did not see the newer registration")
}

func TestWatchFencesOnADeleteAndEndsQuietlyWithItsContext(t *testing.T) {
	kv, iid := testkit.NewKV(), subjects.NewUID()
	g, err := Register(ctx(t), kv, iid, false)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- Watch(ctx(t), kv, g, nil) }()
	kv.Delete(subjects.GateKey(subjects.GateEndpointAuth, iid))
	if err := <-done; !errors.Is(err, ErrFenced) {
		t.Fatalf("a delete: got %v, want ErrFenced", err)
	}

	kv2 := testkit.NewKV()
	g2, err := Register(ctx(t), kv2, iid, false)
	if err != nil {
		t.Fatal(err)
	}
	c, cancel := context.WithCancel(context.Background())
	go func() { done <- Watch(c, kv2, g2, nil) }()
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("a context that ends: got %v, want nil", err)
	}
}

func TestAnEpochThatMovedBeforeTheWatchFencesAtOnce(t *testing.T) {
	kv, iid := testkit.NewKV(), subjects.NewUID()
	g, err := Register(ctx(t), kv, iid, false)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := Register(ctx(t), kv, iid, false); err != nil {
		t.Fatal(err)
	}
	if err := Watch(ctx(t), kv, g, nil); !errors.Is(err, ErrFenced) {
		t.Fatalf("got %v, want ErrFenced from the watch's first value", err)
	}
}

// flakyWatcher is a bucket whose first watch goes deaf (its consumer went with the broker)
// and whose next `fail` watches cannot start, as right after the broker came back.
type flakyWatcher struct {
	*testkit.KV
	fail    atomic.Int32
	watches atomic.Int32
}

func (f *flakyWatcher) Watch(ctx context.Context, key string) (jetstream.KeyWatcher, error) {
	switch n := f.watches.Add(1); {
	case n == 1:
		return deafWatcher{make(chan jetstream.KeyValueEntry, 1)}, nil
	case f.fail.Add(-1) >= 0:
		return nil, errors.New("jetstream not ready")
	}
	return f.KV.Watch(ctx, key)
}

// A first watch the store cannot start yet (a stream still electing its leader after the
// cluster lost power) is retried, not taken for a fence: the plane stopped on it once, in a
// power-cut test under load. The watch, once it starts, still fences on a newer registration.
func TestAFirstWatchTheStoreCannotStartYetIsRetried(t *testing.T) {
	kv := &flakyWatcher{KV: testkit.NewKV()}
	kv.watches.Store(1) // no deaf first watch: the first one fails
	kv.fail.Store(3)
	iid := subjects.NewUID()
	g, err := Register(ctx(t), kv, iid, false)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- Watch(ctx(t), kv, g, nil) }()
	testkit.CheckFor(t, 5*time.Second, 5*time.Millisecond, func() error {
		if n := kv.watches.Load(); n < 5 {
			return fmt.Errorf("%d watches asked for, want three that could not start and one that did", n-1)
		}
		return nil
	})
	select {
	case err := <-done:
		t.Fatalf("Watch returned %v while the gate had not moved", err)
	default:
	}
	if _, err := Register(ctx(t), kv, iid, false); err != nil {
		t.Fatal(err)
	}
	wantFenced(t, done, "the watch that started did not fence")
}

// wantFenced fails t unless a Watch's outcome on done is ErrFenced within 2 s; late says what
// did not happen.
func wantFenced(t *testing.T, done <-chan error, late string) {
	t.Helper()
	select {
	case err := <-done:
		if !errors.Is(err, ErrFenced) {
			t.Fatalf("got %v, want ErrFenced", err)
		}
	case <-time.After(2 * time.Second):
		t.Fatal(late)
	}
}

// deafWatcher ends its initial values and then hears nothing.
type deafWatcher struct{ updates chan jetstream.KeyValueEntry }

func (d deafWatcher) Updates() <-chan jetstream.KeyValueEntry {
	select {
	case d.updates <- nil:
	default:
	}
	return d.updates
}
func (d deafWatcher) Stop() error { return nil }

// After a reconnection the watch starts again, retrying while the store cannot watch yet, and
// an epoch that moved while the old watch heard nothing fences at once.
func TestARewatchStartsTheWatchAgainAndSeesWhatMovedMeanwhile(t *testing.T) {
	kv := &flakyWatcher{KV: testkit.NewKV()}
	kv.fail.Store(3)
	iid := subjects.NewUID()
	g, err := Register(ctx(t), kv, iid, false)
	if err != nil {
		t.Fatal(err)
	}
	rewatch := make(chan struct{}, 1)
	done := make(chan error, 1)
	go func() { done <- Watch(ctx(t), kv, g, rewatch) }()
	if _, err := Register(ctx(t), kv, iid, false); err != nil {
		t.Fatal(err)
	}
	rewatch <- struct{}{}
	wantFenced(t, done, "the restarted watch did not fence")
	if n := kv.watches.Load(); n != 5 {
		t.Errorf("got %d watches, want the deaf one, three that could not start, and the one that fenced", n)
	}
}

// A released lock is free at once, even while another descriptor of its open file lives on, as
// in a child forked at that moment until its exec: Release unlocks before it closes. Closing
// alone left the lock to that copy, and a plane started again in this process was refused.
func TestAReleasedLockIsFreeWhileACopyOfItsFileLivesOn(t *testing.T) {
	dir := t.TempDir()
	lock, err := Acquire(dir)
	if err != nil {
		t.Fatal(err)
	}
	child, err := syscall.Dup(int(lock.f.Fd()))
	if err != nil {
		t.Fatal(err)
	}
	defer syscall.Close(child)
	if err := lock.Release(); err != nil {
		t.Fatal(err)
	}
	again, err := Acquire(dir)
	if err != nil {
		t.Fatalf("acquire after release, a copy of the file still open: %v", err)
	}
	if err := again.Release(); err != nil {
		t.Fatal(err)
	}
	held, err := Acquire(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer held.Release()
	if _, err := Acquire(dir); !errors.Is(err, ErrLocked) {
		t.Fatalf("acquire of a held lock: got %v, want ErrLocked", err)
	}
}
