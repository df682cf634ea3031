package admin

import (
	"context"
	"testing"
	"testing/synctest"
	"time"

	"github.com/cotal-ai/authplane/internal/platform/broker"
)

// listings answers each listing with the next of polls (none once they run out), and
// records the kicks.
type listings struct {
	polls  [][]broker.Connection
	asked  int
	kicked []uint64
}

func (l *listings) CalloutConnections(context.Context, string, int) ([]broker.Connection, error) {
	l.asked++
	if len(l.polls) == 0 {
		return nil, nil
	}
	next := l.polls[0]
	l.polls = l.polls[1:]
	return next, nil
}

func (l *listings) Kick(_ context.Context, _ string, cid uint64) error {
	l.kicked = append(l.kicked, cid)
	return nil
}

// A revoke's kicks end only once two listings in a row after the window show none: a
// connection one listing missed (listed again by the next) is kicked too.
func TestKicksEndOnlyWhenTwoListingsAfterTheWindowShowNone(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		conn := func(cid uint64) []broker.Connection {
			return []broker.Connection{{Server: "S", CID: cid, Principal: "o.worker", Callout: true}}
		}
		l := &listings{polls: [][]broker.Connection{
			conn(1), // kicked
			nil,     // within the window: not yet settled
			nil,     // after it
			conn(2), // the next listing finds one the last one missed
			nil,     // none again
			nil,     // and a second listing agrees
			conn(3), // never asked
		}}
		until := time.Now().Add(150 * time.Millisecond)
		closed, err := kickUntil(context.Background(), l, "o.worker", 1, until)
		if err != nil || closed != 2 || l.asked != 6 || len(l.kicked) != 2 || l.kicked[0] != 1 || l.kicked[1] != 2 {
			t.Fatalf("got %d closed (%v) after %d listings, kicks %v; want 2 after 6, kicks [1 2]", closed, err, l.asked, l.kicked)
		}
	})
}
