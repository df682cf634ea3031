package broker

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/cotal-ai/authplane/internal/mint"
	"github.com/cotal-ai/authplane/internal/space"
	"github.com/cotal-ai/authplane/subjects"
)

// An account JWT whose claims every server already holds is not pushed again, however often it
// is signed anew; one whose claims changed is, and then is held.
func TestPushIfChangedPushesOnlyClaimsTheServersDoNotHold(t *testing.T) {
	dir := t.TempDir()
	m, err := space.Create(filepath.Join(dir, "space"), "default")
	if err != nil {
		t.Fatal(err)
	}
	b, err := Start(m, Options{Dir: dir, Name: "s", Unsynced: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(b.Shutdown)
	iss, err := mint.NewIssuer(m.System.Public(), m.System.Signer, time.Now)
	if err != nil {
		t.Fatal(err)
	}
	auth, err := iss.Connect("push-test", subjects.SystemPermissions(m.Data.Public(), m.Plane.Public()), time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	nc, err := nats.Connect(b.ClientURL(), auth)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	data := Account{NC: nc, Public: m.Data.Public()}
	for i, tt := range []struct {
		maxConnections int64
		want           bool
	}{{7, true}, {7, false}, {7, false}, {9, true}, {9, false}} {
		token, _, err := m.DataAccountJWT(space.DataPolicy{MaxConnections: tt.maxConnections})
		if err != nil {
			t.Fatal(err)
		}
		pushed, err := data.PushIfChanged(ctx, token)
		if err != nil || pushed != tt.want {
			t.Errorf("push %d (max connections %d): got pushed %v, %v; want %v", i, tt.maxConnections, pushed, err, tt.want)
		}
	}
}
