package instance

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/cotal-ai/authplane/internal/gate"
	"github.com/cotal-ai/authplane/internal/ids"
	"github.com/cotal-ai/authplane/internal/store/storetest"
	"github.com/cotal-ai/authplane/subjects"
)

func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	t.Cleanup(cancel)
	return c
}

func TestRegisterStartsAtEpochZeroAndAdvancesOnEveryRestart(t *testing.T) {
	kv, iid := storetest.New(), ids.UID()
	for want := uint64(0); want < 3; want++ {
		g, err := Register(ctx(t), kv, iid)
		if err != nil {
			t.Fatal(err)
		}
		if g.Row.ProcessEpoch != want || g.Row.State != gate.Open || g.Row.Principal != Principal(iid) {
			t.Fatalf("registration %d: got %+v, want open at epoch %d", want, g.Row, want)
		}
	}
}

func TestRegisterSettlesAnUnknownOutcomeAndRefusesAClosedGate(t *testing.T) {
	kv, iid := storetest.New(), ids.UID()
	kv.Fault = storetest.FailOnce(true)
	g, err := Register(ctx(t), kv, iid)
	if err != nil || g.Row.ProcessEpoch != 0 || kv.Revision() != 1 {
		t.Fatalf("got %+v %v after %d writes, want one registration at epoch 0", g, err, kv.Revision())
	}
	retired := g.Row
	retired.State, retired.Op = gate.Retired, &gate.Op{OpID: "x", Kind: gate.OpRetirement}
	if _, err := g.Write(ctx(t), retired); err != nil {
		t.Fatal(err)
	}
	if _, err := Register(ctx(t), kv, iid); err == nil {
		t.Fatal("got a registration on a retired gate, want a refusal")
	}
}

func TestWatchReturnsErrFencedWhenANewerRegistrationLands(t *testing.T) {
	kv, iid := storetest.New(), ids.UID()
	g, err := Register(ctx(t), kv, iid)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- Watch(ctx(t), kv, g) }()
	// A mint's commit (the same bytes) does not fence.
	if _, err := g.Commit(ctx(t)); err != nil {
		t.Fatal(err)
	}
	if _, err := Register(ctx(t), kv, iid); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if !errors.Is(err, ErrFenced) {
			t.Fatalf("got %v, want ErrFenced", err)
		}
	case <-time.After(2 * time.Second):
		t.Fatal("the watch did not see the newer registration")
	}
}

func TestWatchFencesOnADeleteAndEndsQuietlyWithItsContext(t *testing.T) {
	kv, iid := storetest.New(), ids.UID()
	g, err := Register(ctx(t), kv, iid)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- Watch(ctx(t), kv, g) }()
	kv.Delete(subjects.GateKey(subjects.GateEndpointAuth, iid))
	if err := <-done; !errors.Is(err, ErrFenced) {
		t.Fatalf("a delete: got %v, want ErrFenced", err)
	}

	kv2 := storetest.New()
	g2, err := Register(ctx(t), kv2, iid)
	if err != nil {
		t.Fatal(err)
	}
	c, cancel := context.WithCancel(context.Background())
	go func() { done <- Watch(c, kv2, g2) }()
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("a context that ends: got %v, want nil", err)
	}
}

func TestAnEpochThatMovedBeforeTheWatchFencesAtOnce(t *testing.T) {
	kv, iid := storetest.New(), ids.UID()
	g, err := Register(ctx(t), kv, iid)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := Register(ctx(t), kv, iid); err != nil {
		t.Fatal(err)
	}
	if err := Watch(ctx(t), kv, g); !errors.Is(err, ErrFenced) {
		t.Fatalf("got %v, want ErrFenced from the watch's first value", err)
	}
}
