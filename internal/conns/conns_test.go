package conns

import (
	"errors"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/cotal-ai/authplane/internal/broker"
)

var t0 = time.Unix(1_700_000_000, 0)

// clock is a ledger's clock that a test moves.
type clock struct{ now time.Time }

func (c *clock) Now() time.Time { return c.now }

func newLedger(perPrincipal, tenants int) (*Ledger, *clock) {
	c := &clock{now: t0}
	return New(Budgets{PerPrincipal: perPrincipal, Tenants: tenants, Reserved: 2}, c.Now), c
}

// jwtConn is connection cid of principal on server s1, started at t0 plus cid seconds.
func jwtConn(principal string, cid uint64) broker.Connection {
	return broker.Connection{Server: "s1", CID: cid, Principal: principal, Start: t0.Add(time.Duration(cid) * time.Second)}
}

func calloutConn(principal string, cid uint64) broker.Connection {
	c := jwtConn(principal, cid)
	c.Callout = true
	return c
}

// cids lists the connections kicks name, and the budget each is past.
func cids(kicks []Kick) []string {
	var out []string
	for _, k := range kicks {
		out = append(out, k.Principal+"#"+string(rune('0'+k.CID))+":"+k.Budget)
	}
	return out
}

func TestConnectedKicksWhatIsPastItsBudget(t *testing.T) {
	type step struct {
		conn broker.Connection
		want []string // kicks, as cids names them
	}
	for _, tt := range []struct {
		name               string
		perPrincipal, tens int
		steps              []step
	}{
		{"a principal's connections up to its cap stay", 2, 10, []step{
			{jwtConn("a", 1), nil}, {jwtConn("a", 2), nil}, {jwtConn("b", 3), nil},
		}},
		{"a principal past its cap loses its newest", 2, 10, []step{
			{jwtConn("a", 1), nil}, {jwtConn("a", 2), nil}, {jwtConn("a", 3), []string{"a#3:principal"}},
		}},
		{"the newest by start time, whichever event comes last", 1, 10, []step{
			{jwtConn("a", 2), nil}, {jwtConn("a", 1), []string{"a#2:principal"}},
		}},
		{"a connection past the tenants' share is kicked, not an older one", 3, 3, []step{
			{jwtConn("a", 1), nil}, {jwtConn("b", 2), nil}, {jwtConn("c", 3), nil}, {jwtConn("d", 4), []string{"d#4:tenants"}},
		}},
		{"a principal's excess never pushes another principal out", 2, 3, []step{
			{jwtConn("hog", 1), nil}, {jwtConn("hog", 2), nil}, {jwtConn("hog", 3), []string{"hog#3:principal"}},
			{jwtConn("hog", 4), []string{"hog#4:principal"}}, {jwtConn("b", 5), nil},
		}},
		{"the plane's own connections are neither counted nor kicked", 1, 1, []step{
			{jwtConn("plane.serving_x", 1), nil}, {jwtConn("plane.serving_x", 2), nil}, {jwtConn("plane.serving_y", 3), nil}, {jwtConn("a", 4), nil},
		}},
		{"an event heard twice counts once", 1, 10, []step{
			{jwtConn("a", 1), nil}, {jwtConn("a", 1), nil},
		}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			l, _ := newLedger(tt.perPrincipal, tt.tens)
			for i, s := range tt.steps {
				if got := cids(l.Connected(s.conn)); !slices.Equal(got, s.want) {
					t.Fatalf("step %d (%s #%d): got kicks %v, want %v", i, s.conn.Principal, s.conn.CID, got, s.want)
				}
			}
		})
	}
}

func TestDisconnectedAndKickFailedKeepTheCount(t *testing.T) {
	l, _ := newLedger(1, 10)
	l.Connected(jwtConn("a", 1))
	if got := cids(l.Connected(jwtConn("a", 2))); len(got) != 1 {
		t.Fatalf("got kicks %v, want a#2", got)
	}
	// The kick did not happen: a#2 counts again, and the next connection is past the cap too.
	l.KickFailed(jwtConn("a", 2))
	if got := l.Counts().Tenants; got != 2 {
		t.Fatalf("tenants after a failed kick: got %d, want 2", got)
	}
	l.Disconnected("s1", 2)
	l.Disconnected("s1", 1)
	if got := l.Counts().Tenants; got != 0 {
		t.Fatalf("tenants after both disconnected: got %d, want 0", got)
	}
	if got := cids(l.Connected(jwtConn("a", 3))); got != nil {
		t.Fatalf("a fresh connection after the disconnects: got kicks %v, want none", got)
	}
	// A connect event for a connection whose disconnect was heard is stale.
	l.Connected(jwtConn("b", 1))
	if got := l.Counts().Tenants; got != 1 {
		t.Fatalf("tenants after a stale connect event: got %d, want 1", got)
	}
}

func TestAdmitHoldsSlotsUntilTheyConnectOrExpire(t *testing.T) {
	l, c := newLedger(2, 3)
	admit := func(p string) error { _, err := l.Admit(p); return err }
	if err := admit("a"); err != nil {
		t.Fatal(err)
	}
	if err := admit("a"); err != nil {
		t.Fatal(err)
	}
	if err := admit("a"); !errors.Is(err, ErrPrincipalFull) {
		t.Fatalf("a third slot of a: got %v, want ErrPrincipalFull", err)
	}
	// a's first slot connects: it is a live connection now, not a slot; still two held.
	l.Connected(calloutConn("a", 1))
	if err := admit("a"); !errors.Is(err, ErrPrincipalFull) {
		t.Fatalf("after a slot connected: got %v, want ErrPrincipalFull", err)
	}
	release, err := l.Admit("b")
	if err != nil {
		t.Fatal(err)
	}
	if err := admit("c"); !errors.Is(err, ErrTenantsFull) {
		t.Fatalf("past the tenants' 3 (a's connection and slot, b's slot): got %v, want ErrTenantsFull", err)
	}
	release()
	release() // a second release gives nothing more back
	if err := admit("c"); err != nil {
		t.Fatalf("after b's slot was given back: %v", err)
	}
	// a's slot that never connected expires.
	c.now = c.now.Add(PendingFor)
	if err := admit("a"); err != nil {
		t.Fatalf("after a's unused slot expired: %v", err)
	}
}

func TestReconcilePutsTheLedgerRight(t *testing.T) {
	l, c := newLedger(2, 4)
	l.Connected(jwtConn("a", 1))
	l.Connected(jwtConn("lost", 2)) // its disconnect event will be lost
	l.Connected(jwtConn("gone", 3))
	l.Disconnected("s1", 3) // heard; a listing asked before it still has it
	c.now = c.now.Add(time.Second)
	asked := c.now
	c.now = c.now.Add(time.Second)
	l.Connected(jwtConn("late", 4)) // connected after the listing was asked for

	kicks := l.Reconcile(asked, []broker.Connection{
		jwtConn("a", 1), jwtConn("gone", 3),
		jwtConn("missed", 5), jwtConn("missed", 6), jwtConn("missed", 7), // connect events lost
	})
	// missed#7 is past missed's cap of 2; then a, late and missed's two are the tenants' 4.
	if got := cids(kicks); !slices.Equal(got, []string{"missed#7:principal"}) {
		t.Fatalf("got kicks %v, want missed#7 past its cap", got)
	}
	if got := l.Counts().Tenants; got != 4 {
		t.Fatalf("tenants: got %d, want a, late and missed's two", got)
	}
	// One more listing that still has missed#7 (its kick did not land) kicks it again; one
	// more tenant that the listing adds is past the share.
	c.now = c.now.Add(time.Second)
	asked = c.now
	c.now = c.now.Add(time.Second)
	kicks = l.Reconcile(asked, []broker.Connection{
		jwtConn("a", 1), jwtConn("late", 4), jwtConn("missed", 5), jwtConn("missed", 6), jwtConn("missed", 7), jwtConn("b", 8),
	})
	if got := cids(kicks); !slices.Equal(got, []string{"missed#7:principal", "b#8:tenants"}) {
		t.Fatalf("got kicks %v, want missed#7 again and the newest tenant, b#8", got)
	}
}

// BenchmarkAdmitConnectDisconnect is the ledger's cost of one bearer connection's life in a
// space of 10,000 connections over 5,000 principals: the callout's Admit, then its connect and
// disconnect events.
func BenchmarkAdmitConnectDisconnect(b *testing.B) {
	l, _ := newLedger(64, 1_000_000)
	for i := range 10_000 {
		l.Connected(jwtConn("p"+strconv.Itoa(i%5000), uint64(i+1)))
	}
	cid := uint64(1_000_000)
	for b.Loop() {
		cid++
		principal := "p" + strconv.Itoa(int(cid%5000))
		if _, err := l.Admit(principal); err != nil {
			b.Fatal(err)
		}
		l.Connected(calloutConn(principal, cid))
		l.Disconnected("s1", cid)
	}
}
