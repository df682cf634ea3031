package broker

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/cotal-ai/authplane/internal/core/issue"
	"github.com/cotal-ai/authplane/internal/platform/space"
	"github.com/cotal-ai/authplane/subjects"
)

// TestTheEmbeddedServerSyncsEveryWriteUnlessTold starts the embedded server as a user gets it
// and with Unsynced, and reads each one's setting the way the plane does: VARZ through a
// system user with the plane's permissions.
func TestTheEmbeddedServerSyncsEveryWriteUnlessTold(t *testing.T) {
	for _, tt := range []struct {
		name     string
		unsynced bool
		want     string
	}{
		{"by default", false, "server s: sync_interval always"},
		{"unsynced", true, "server s: sync_interval 2m0s"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			m, err := space.Create(filepath.Join(dir, "space"), "default")
			if err != nil {
				t.Fatal(err)
			}
			b, err := Start(m, Options{Dir: dir, Name: "s", Unsynced: tt.unsynced})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(b.Shutdown)
			if got := b.Server().JetStreamConfig().SyncAlways; got == tt.unsynced {
				t.Errorf("the server's JetStream config: got SyncAlways %v, want %v", got, !tt.unsynced)
			}
			nc := systemConn(t, m, b, "sync-test")
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			syncs, err := Syncs(ctx, nc)
			if err != nil {
				t.Fatal(err)
			}
			if len(syncs) != 1 || syncs[0].String() != tt.want || syncs[0].Synced() == tt.unsynced {
				t.Errorf("got %v, want one server: %s", syncs, tt.want)
			}
		})
	}
}

func TestAVarzAnswerSaysWhetherItsServerSyncsEveryWrite(t *testing.T) {
	tests := []struct {
		name, answer string
		want         Sync
		bad          bool
	}{
		{"always", `{"server":{"name":"n1"},"data":{"jetstream":{"config":{"sync_interval":120000000000,"sync_always":true}}}}`,
			Sync{Server: "n1", JetStream: true, Always: true, Interval: 2 * time.Minute}, false},
		{"every two minutes", `{"server":{"name":"n2"},"data":{"jetstream":{"config":{"sync_interval":120000000000}}}}`,
			Sync{Server: "n2", JetStream: true, Interval: 2 * time.Minute}, false},
		{"no JetStream", `{"server":{"name":"n3"},"data":{"jetstream":{}}}`, Sync{Server: "n3"}, false},
		{"no name", `{"server":{},"data":{}}`, Sync{}, true},
		{"an error", `{"server":{"name":"n4"},"error":{"code":500,"description":"boom"}}`, Sync{}, true},
		{"not JSON", `nope`, Sync{}, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := parseVarz([]byte(tt.answer))
			if (err != nil) != tt.bad || got != tt.want {
				t.Errorf("got %+v, %v; want %+v, error %v", got, err, tt.want, tt.bad)
			}
		})
	}
	if s := (Sync{Server: "n3"}); !s.Synced() {
		t.Errorf("a server without JetStream: got unsynced, want synced (it stores nothing)")
	}
}

// systemConn connects to b as a system-account user of m named name, with the plane's system
// permissions.
func systemConn(t *testing.T, m *space.Keys, b *Broker, name string) *nats.Conn {
	t.Helper()
	iss, err := issue.NewIssuer(m.System.Public(), m.System.Signer, time.Now)
	if err != nil {
		t.Fatal(err)
	}
	auth, err := iss.Connect(name, subjects.SystemPermissions(m.Data.Public(), m.Plane.Public()), time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	nc, err := nats.Connect(b.ClientURL(), auth)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	return nc
}
