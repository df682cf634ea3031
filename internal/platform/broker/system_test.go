package broker

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/cotal-ai/authplane/internal/platform/space"
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
	nc := systemConn(t, m, b, "push-test")
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
