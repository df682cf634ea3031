package durable

import (
	"errors"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/cotal-ai/authplane/admin"
	"github.com/cotal-ai/authplane/integration/internal/harness"
	"github.com/cotal-ai/authplane/internal/core/store"
	"github.com/cotal-ai/authplane/service"
	"github.com/cotal-ai/authplane/subjects"
)

// TestAStartOnStoresThatLostAStreamRefusesToServeUntilToldToStartOver: a plane starts, writes,
// and stops; its stores then lose streams while it is down. The next start refuses
// (service.ErrLost) naming every stream that is gone, serves nothing and re-creates nothing (a
// second start is refused the same way); with --recreate-stores it starts over, on empty ones.
func TestAStartOnStoresThatLostAStreamRefusesToServeUntilToldToStartOver(t *testing.T) {
	t.Parallel()
	every := func() []string {
		var names []string
		for _, spec := range store.Specs(harness.TestSpace, store.Options{}) {
			names = append(names, spec.Config.Name)
		}
		return names
	}()
	ledger := "KV_" + subjects.ActorsBucket(harness.TestSpace)
	tests := []struct {
		name string
		// standalone: the stores are on a server the plane does not run; else the embedded one.
		standalone bool
		// fresh starts again on a new state directory: only the stores say they existed.
		fresh bool
		// lose takes the streams away while the plane is down (streams: the embedded store's).
		lose func(t *testing.T, streams string, js jetstream.JetStream)
		gone []string
	}{
		{"a stream's directory removed while the embedded broker was down", false, false, func(t *testing.T, streams string, _ jetstream.JetStream) {
			if err := os.RemoveAll(filepath.Join(streams, ledger)); err != nil {
				t.Fatal(err)
			}
		}, []string{ledger}},
		// What a power cut seconds after a first start left on a file system that keeps only
		// synced writes: every stream's metadata empty, so nats-server drops them all.
		{"every stream's meta.inf emptied", false, false, func(t *testing.T, streams string, _ jetstream.JetStream) {
			for _, name := range every {
				if err := os.Truncate(filepath.Join(streams, name, "meta.inf"), 0); err != nil {
					t.Fatal(err)
				}
			}
		}, every},
		{"a stream deleted through JetStream, seen from a new state directory", true, true, func(t *testing.T, _ string, js jetstream.JetStream) {
			if err := js.DeleteStream(t.Context(), subjects.MintedStream(harness.TestSpace)); err != nil {
				t.Fatal(err)
			}
		}, []string{subjects.MintedStream(harness.TestSpace)}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			var on func(*service.Config)
			var s *harness.Standalone
			if tt.standalone {
				s = harness.StartStandalone(t, harness.TestSpace)
				on = harness.AgainstStandalone(s)
			}
			dir := t.TempDir()
			first := harness.StartPlane(t, func(c *service.Config) {
				if on != nil {
					on(c)
				}
				c.Dir = dir
			})
			harness.Grant(t, first, harness.OwnerA, "cli", "supervise")
			keys := first.Keys()
			harness.ClosePlane(t, first.Plane)
			var js jetstream.JetStream
			if s != nil {
				_, js = harness.PlaneConn(t, keys, s.URL())
			}
			// nats-server keeps a store under jetstream/ of the store dir it is given.
			tt.lose(t, filepath.Join(dir, "nats", "jetstream", "jetstream", keys.Plane.Public(), "streams"), js)

			cfg := harness.PlaneConfig(t)
			if on != nil {
				on(&cfg)
			}
			if !tt.fresh {
				cfg.Dir = dir
			}
			for attempt := range 2 { // the second is refused too: nothing was re-created
				p, err := harness.TryStart(t, cfg)
				if err == nil {
					harness.ClosePlane(t, p)
					t.Fatalf("start %d on stores that lost %v: got a running plane, want a refusal", attempt+1, tt.gone)
				}
				if !errors.Is(err, service.ErrLost) || !strings.Contains(err.Error(), "--recreate-stores") {
					t.Errorf("start %d: got %v, want errors.Is service.ErrLost pointing at --recreate-stores", attempt+1, err)
				}
				for _, name := range tt.gone {
					if !strings.Contains(err.Error(), name) {
						t.Errorf("start %d: got %q, want it to name %s", attempt+1, err, name)
					}
				}
				if _, err := os.Stat(filepath.Join(cfg.Dir, admin.ServiceInfoFile)); !errors.Is(err, fs.ErrNotExist) {
					t.Errorf("after the refused start: stat %s: %v, want no readiness file", admin.ServiceInfoFile, err)
				}
			}

			cfg.RecreateStores = true
			again := harness.StartPlane(t, func(c *service.Config) { *c = cfg })
			_, js = harness.PlaneConn(t, keys, again.NATSURL())
			for _, name := range tt.gone {
				if _, err := js.Stream(t.Context(), name); err != nil {
					t.Errorf("after --recreate-stores: stream %s: %v, want it made again", name, err)
				}
			}
			if status, body := harness.Health(t, again.HTTPURL()); status != http.StatusOK {
				t.Errorf("after --recreate-stores: /health got %d %v, want 200", status, body)
			}
		})
	}
}

// TestAStartOnAFenceBucketEmptiedByRecreationRefusesNamingThePlanesGate: the fence bucket is
// deleted and made again, empty, while the plane is down: every stream exists, but the plane's
// own gate, which its identity registered, does not. The start refuses (service.ErrLost) naming
// the gate and writes nothing there; with --recreate-stores it registers anew, at epoch 0.
func TestAStartOnAFenceBucketEmptiedByRecreationRefusesNamingThePlanesGate(t *testing.T) {
	t.Parallel()
	s := harness.StartStandalone(t, harness.TestSpace)
	dir := t.TempDir()
	on := func(c *service.Config) { harness.AgainstStandalone(s)(c); c.Dir = dir }
	first := harness.StartPlane(t, on)
	iid := first.InstanceID()
	harness.ClosePlane(t, first.Plane)

	fences := "KV_" + subjects.AuthBucket(harness.TestSpace)
	_, js := harness.PlaneConn(t, s.Material, s.URL())
	if err := js.DeleteStream(t.Context(), fences); err != nil {
		t.Fatal(err)
	}
	for _, spec := range store.Specs(harness.TestSpace, store.Options{}) {
		if spec.Config.Name == fences {
			if _, err := js.CreateStream(t.Context(), spec.Config); err != nil {
				t.Fatal(err)
			}
		}
	}
	cfg := harness.PlaneConfig(t)
	on(&cfg)
	p, err := harness.TryStart(t, cfg)
	if err == nil {
		harness.ClosePlane(t, p)
		t.Fatal("a start on an emptied fence bucket: got a running plane, want a refusal")
	}
	if !errors.Is(err, service.ErrLost) || !strings.Contains(err.Error(), subjects.GateKey(subjects.GateEndpointAuth, iid)) {
		t.Errorf("start: got %v, want errors.Is service.ErrLost naming the plane's gate", err)
	}
	st, err := js.Stream(t.Context(), fences)
	if err != nil {
		t.Fatal(err)
	}
	if info, err := st.Info(t.Context()); err != nil || info.State.Msgs != 0 {
		t.Errorf("the refused start: got %v messages in %s (%v), want none written", info.State.Msgs, fences, err)
	}

	again := harness.StartPlane(t, func(c *service.Config) { on(c); c.RecreateStores = true })
	if again.InstanceID() != iid || again.Epoch() != 0 {
		t.Errorf("after --recreate-stores: got instance %s at epoch %d, want %s registered anew at 0", again.InstanceID(), again.Epoch(), iid)
	}
}

// TestAFirstStartThatStoppedHalfWayIsCompletedByTheNext: a first start that made some streams
// and not the fence bucket (which it makes last) stopped; the next start, on a state directory
// with no identity yet, makes the rest and serves.
func TestAFirstStartThatStoppedHalfWayIsCompletedByTheNext(t *testing.T) {
	t.Parallel()
	s := harness.StartStandalone(t, harness.TestSpace)
	_, js := harness.PlaneConn(t, s.Material, s.URL())
	for _, spec := range store.Specs(harness.TestSpace, store.Options{})[1:4] {
		if _, err := js.CreateStream(t.Context(), spec.Config); err != nil {
			t.Fatal(err)
		}
	}
	p := harness.StartPlane(t, harness.AgainstStandalone(s))
	harness.Grant(t, p, harness.OwnerA, "cli", "supervise")
	if err := harness.PrepareOnce(t, p); err != nil {
		t.Fatalf("prepare on the completed stores: %v", err)
	}
}
