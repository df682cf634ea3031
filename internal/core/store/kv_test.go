package store_test

import (
	"context"
	"errors"
	"log/slog"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/cotal-ai/authplane/internal/core/store"
	"github.com/cotal-ai/authplane/internal/testkit"
)

// bucket is what the conformance suite needs of a backend: the verbs, and a way to leave a
// delete marker as an outside writer could.
type bucket interface {
	Get(ctx context.Context, key string) (store.Entry, error)
	Create(ctx context.Context, key string, value []byte) (uint64, error)
	Update(ctx context.Context, key string, value []byte, rev uint64) (uint64, error)
}

// backends returns each backend the plane's code may run on, fresh for one test.
func backends(t *testing.T) map[string]func(t *testing.T) (bucket, func(key string)) {
	return map[string]func(t *testing.T) (bucket, func(key string)){
		"memory": func(t *testing.T) (bucket, func(string)) {
			kv := testkit.NewKV()
			return kv, kv.Delete
		},
		"jetstream": func(t *testing.T) (bucket, func(string)) {
			return jetStreamBucket(t)
		},
	}
}

// jetStreamBucket makes a fence bucket by hand, as the plane does, on an embedded server.
func jetStreamBucket(t *testing.T) (bucket, func(string)) {
	t.Helper()
	nc, js := embeddedJetStream(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	spec := store.Specs("t", store.Options{DirectReads: true})[0] // the fence bucket, on a lone server
	if err := store.Ensure(ctx, js, []store.Spec{spec}, slog.New(slog.DiscardHandler)); err != nil {
		t.Fatal(err)
	}
	kv, err := store.OpenBucket(ctx, nc, spec.Bucket)
	if err != nil {
		t.Fatal(err)
	}
	raw, err := js.KeyValue(ctx, spec.Bucket)
	if err != nil {
		t.Fatal(err)
	}
	return kv, func(key string) {
		if err := raw.Delete(context.Background(), key); err != nil {
			t.Fatalf("delete %s: %v", key, err)
		}
	}
}

// embeddedJetStream starts a JetStream server for the test and connects to it.
func embeddedJetStream(t *testing.T) (*nats.Conn, jetstream.JetStream) {
	t.Helper()
	srv, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: -1, NoLog: true, NoSigs: true, JetStream: true, StoreDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	go srv.Start()
	if !srv.ReadyForConnections(10 * time.Second) {
		t.Fatal("nats-server not ready")
	}
	t.Cleanup(srv.Shutdown)
	nc, err := nats.Connect(srv.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	return nc, js
}

// A fence bucket of one replica on a lone server made without direct gets (by a release before
// them) gets them at the next start, and its reads go to the direct get: the stream's one
// server answers them.
func TestEnsureAllowsDirectGetsOnABucketOfOneReplicaMadeWithout(t *testing.T) {
	nc, js := embeddedJetStream(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	spec := store.Specs("t", store.Options{DirectReads: true})[0]
	old := spec.Config
	old.AllowDirect = false
	if _, err := js.CreateStream(ctx, old); err != nil {
		t.Fatal(err)
	}
	if err := store.Ensure(ctx, js, []store.Spec{spec}, slog.New(slog.DiscardHandler)); err != nil {
		t.Fatalf("Ensure on a bucket made without direct gets: %v", err)
	}
	st, err := js.Stream(ctx, old.Name)
	if err != nil {
		t.Fatal(err)
	}
	if !st.CachedInfo().Config.AllowDirect {
		t.Fatalf("after Ensure: allow_direct false, want true")
	}
	direct, err := nc.SubscribeSync("$JS.API.DIRECT.GET." + old.Name + ".>")
	if err != nil {
		t.Fatal(err)
	}
	kv, err := store.OpenBucket(ctx, nc, spec.Bucket)
	if err != nil {
		t.Fatal(err)
	}
	rev, err := kv.Create(ctx, "k", []byte("v"))
	if err != nil {
		t.Fatal(err)
	}
	if e, err := kv.Get(ctx, "k"); err != nil || string(e.Value) != "v" || e.Revision != rev {
		t.Fatalf("Get after Create: %+v, %v; want v at revision %d", e, err, rev)
	}
	if _, err := direct.NextMsg(5 * time.Second); err != nil {
		t.Errorf("the read: no direct get seen (%v), want the stream's direct get, not the API's message get", err)
	}
}

// TestKVConformance runs one suite of the KV verbs' rules on every backend.
func TestKVConformance(t *testing.T) {
	for name, open := range backends(t) {
		t.Run(name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()

			t.Run("a key never written is ErrNotFound", func(t *testing.T) {
				kv, _ := open(t)
				if _, err := kv.Get(ctx, "k"); !errors.Is(err, store.ErrNotFound) {
					t.Fatalf("got %v, want ErrNotFound", err)
				}
			})
			t.Run("create once, then the key exists", func(t *testing.T) {
				kv, _ := open(t)
				rev, err := kv.Create(ctx, "k", []byte("a"))
				if err != nil {
					t.Fatal(err)
				}
				e, err := kv.Get(ctx, "k")
				if err != nil || string(e.Value) != "a" || e.Revision != rev {
					t.Fatalf("got %q@%d %v, want a@%d", e.Value, e.Revision, err, rev)
				}
				if _, err := kv.Create(ctx, "k", []byte("b")); !errors.Is(err, store.ErrCASLost) {
					t.Fatalf("second create: got %v, want ErrCASLost", err)
				}
			})
			t.Run("update needs the latest revision", func(t *testing.T) {
				kv, _ := open(t)
				rev, err := kv.Create(ctx, "k", []byte("a"))
				if err != nil {
					t.Fatal(err)
				}
				rev2, err := kv.Update(ctx, "k", []byte("b"), rev)
				if err != nil {
					t.Fatal(err)
				}
				if _, err := kv.Update(ctx, "k", []byte("c"), rev); !errors.Is(err, store.ErrCASLost) {
					t.Fatalf("stale update: got %v, want ErrCASLost", err)
				}
				e, err := kv.Get(ctx, "k")
				if err != nil || string(e.Value) != "b" || e.Revision != rev2 {
					t.Fatalf("got %q@%d %v, want b@%d", e.Value, e.Revision, err, rev2)
				}
			})
			t.Run("a delete marker is ErrDeleted and create does not write over it", func(t *testing.T) {
				kv, del := open(t)
				if _, err := kv.Create(ctx, "k", []byte("a")); err != nil {
					t.Fatal(err)
				}
				del("k")
				e, err := kv.Get(ctx, "k")
				if !errors.Is(err, store.ErrDeleted) || e.Revision == 0 {
					t.Fatalf("got %v at revision %d, want ErrDeleted with the marker's revision", err, e.Revision)
				}
				if _, err := kv.Create(ctx, "k", []byte("b")); !errors.Is(err, store.ErrDeleted) {
					t.Fatalf("create over a marker: got %v, want ErrDeleted", err)
				}
				if _, err := kv.Get(ctx, "k"); !errors.Is(err, store.ErrDeleted) {
					t.Fatalf("after the refused create: got %v, want the marker still there", err)
				}
			})
		})
	}
}

// A bucket is sole, and its fences commit by reading (fence.Sole), exactly when it allows
// direct gets: one replica on a lone server. A bucket made for a broker the plane does not
// run commits by CAS.
func TestABucketIsSoleExactlyWhenItAllowsDirectGets(t *testing.T) {
	for _, direct := range []bool{true, false} {
		nc, js := embeddedJetStream(t)
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		spec := store.Specs("t", store.Options{DirectReads: direct})[0]
		if err := store.Ensure(ctx, js, []store.Spec{spec}, slog.New(slog.DiscardHandler)); err != nil {
			t.Fatal(err)
		}
		kv, err := store.OpenBucket(ctx, nc, spec.Bucket)
		if err != nil {
			t.Fatal(err)
		}
		if kv.Sole() != direct {
			t.Errorf("made with direct reads %v: Sole() %v, want %v", direct, kv.Sole(), direct)
		}
	}
}
