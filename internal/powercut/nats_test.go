package powercut

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// An embedded nats-server cannot be killed apart from the test that runs it. Its cut is
// modelled by what the test can do: Cut turns every operation on the mount into EIO, so nothing
// the server does after it reaches the disk, and the server is then shut down. Only the
// acknowledgements received before Cut began count as acknowledged.

// startJetStream starts a JetStream server whose store is dir.
func startJetStream(t *testing.T, dir string, syncAlways bool) (*server.Server, jetstream.JetStream) {
	t.Helper()
	srv, err := server.NewServer(&server.Options{
		Host: "127.0.0.1", Port: server.RANDOM_PORT, NoLog: true, NoSigs: true,
		JetStream: true, StoreDir: dir, SyncAlways: syncAlways, SyncInterval: time.Hour,
	})
	if err != nil {
		t.Fatal(err)
	}
	srv.Start()
	t.Cleanup(srv.Shutdown)
	if !srv.ReadyForConnections(10 * time.Second) {
		t.Fatal("nats-server is not ready")
	}
	nc, err := nats.Connect(srv.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	return srv, js
}

// publishThenCut publishes to a stream on the mount until 200 publishes are acknowledged, cuts
// the power while it goes on, and restarts the server on a new mount of the same disk. It
// returns the acknowledged messages, and those of them the restarted server still has.
func publishThenCut(t *testing.T, syncAlways bool) (acked, kept map[uint64]string) {
	backing := t.TempDir()
	f := Mount(t, backing)
	srv, js := startJetStream(t, f.Dir(), syncAlways)
	ctx := t.Context()
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "CUT", Subjects: []string{"cut"}}); err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	acked = map[uint64]string{}
	var cutting atomic.Bool
	pubCtx, stop := context.WithCancel(ctx)
	var done sync.WaitGroup
	done.Go(func() {
		for i := 0; pubCtx.Err() == nil; i++ {
			data := fmt.Sprint("message ", i)
			ack, err := js.Publish(pubCtx, "cut", []byte(data))
			if err == nil && !cutting.Load() { // received before the cut began
				mu.Lock()
				acked[ack.Sequence] = data
				mu.Unlock()
			}
		}
	})
	checkFor(t, 30*time.Second, time.Millisecond, func() error {
		mu.Lock()
		defer mu.Unlock()
		if len(acked) < 200 {
			return fmt.Errorf("%d publishes acknowledged, want 200", len(acked))
		}
		return nil
	})
	cutting.Store(true)
	cut(t, f)
	stop()
	done.Wait()
	srv.Shutdown()

	_, js = startJetStream(t, Mount(t, backing).Dir(), syncAlways)
	kept = map[uint64]string{}
	stream, err := js.Stream(ctx, "CUT")
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		return acked, kept
	}
	if err != nil {
		t.Fatal(err)
	}
	for seq := range acked {
		msg, err := stream.GetMsg(ctx, seq)
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		kept[seq] = string(msg.Data)
	}
	return acked, kept
}

func TestNATSSyncAlwaysKeepsEveryAcknowledgedPublishAcrossACut(t *testing.T) {
	acked, kept := publishThenCut(t, true)
	for seq, data := range acked {
		if kept[seq] != data {
			t.Errorf("message %d after the cut: got %q, want %q", seq, kept[seq], data)
		}
	}
	t.Logf("SyncAlways: %d publishes acknowledged before the cut, %d kept", len(acked), len(kept))
}

func TestNATSWithoutSyncLosesAcknowledgedPublishesInACut(t *testing.T) {
	acked, kept := publishThenCut(t, false)
	if len(kept) == len(acked) {
		t.Errorf("with a sync every hour: all %d acknowledged publishes kept, want some lost", len(acked))
	}
	t.Logf("sync every hour: %d publishes acknowledged before the cut, %d kept", len(acked), len(kept))
}
