package conns

import (
	"errors"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/cotal-ai/authplane/internal/platform/broker"
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
		out = append(out, k.Principal+"#"+strconv.FormatUint(k.CID, 10)+":"+k.Budget)
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

// A listing that finds a bearer connection before its connect event (which the plane's system
// connection, renewed by reconnecting, can miss) counts it and ends its slot: the event then
// finds it known. The slot once stayed too until it expired, and the principal's connection
// was counted twice for 3 s, refusing a connection within its cap.
func TestAListedCalloutConnectionEndsItsSlot(t *testing.T) {
	l, c := newLedger(2, 10)
	if _, err := l.Admit("a"); err != nil {
		t.Fatal(err)
	}
	c.now = c.now.Add(time.Second)
	asked := c.now
	l.Reconcile(asked, []broker.Connection{calloutConn("a", 1)})
	l.Connected(calloutConn("a", 1)) // its event, late
	if _, err := l.Admit("a"); err != nil {
		t.Fatalf("a's second connection, with one live and no slot held: %v", err)
	}
	if got := l.Counts().Tenants; got != 1 {
		t.Fatalf("tenants: got %d, want a's one connection", got)
	}
}

// An owner's principals together hold at most its cap: the callout refuses a slot past it,
// a JWT user past it loses the owner's newest connection (whichever principal's), a principal's
// excess counts for neither, and another owner still connects. (One owner once held the whole
// tenants' share through many principals, each within its cap.)
func TestAnOwnersPrincipalsTogetherHoldAtMostItsCap(t *testing.T) {
	c := &clock{now: t0}
	l := New(Budgets{PerPrincipal: 2, PerOwner: 3, Tenants: 10, Reserved: 2}, c.Now)
	want := func(what string, got, want []string) {
		t.Helper()
		if !slices.Equal(got, want) {
			t.Fatalf("%s: got kicks %v, want %v", what, got, want)
		}
	}
	want("o.a#1", cids(l.Connected(jwtConn("o.a", 1))), nil)
	want("o.a#2", cids(l.Connected(jwtConn("o.a", 2))), nil)
	want("o.a#3, past o.a's cap", cids(l.Connected(jwtConn("o.a", 3))), []string{"o.a#3:principal"})
	want("o.b#4, o's third", cids(l.Connected(jwtConn("o.b", 4))), nil)
	if _, err := l.Admit("o.c"); !errors.Is(err, ErrOwnerFull) {
		t.Fatalf("a slot for o's fourth connection: got %v, want ErrOwnerFull", err)
	}
	want("o.c#5, past o's cap", cids(l.Connected(jwtConn("o.c", 5))), []string{"o.c#5:owner"})
	// An older connection heard late still leaves the owner its oldest three.
	want("o.d#0, older than every other", cids(l.Connected(jwtConn("o.d", 0))), []string{"o.b#4:owner"})
	if _, err := l.Admit("p.a"); err != nil {
		t.Fatalf("another owner's slot: %v", err)
	}
	want("p.a#6", cids(l.Connected(calloutConn("p.a", 6))), nil)
	if got := l.Counts().Tenants; got != 4 {
		t.Fatalf("tenants: got %d, want o's three and p's one", got)
	}
	// A disconnect gives the owner a slot back.
	l.Disconnected("s1", 1)
	if _, err := l.Admit("o.c"); err != nil {
		t.Fatalf("o's slot after one of its connections closed: %v", err)
	}
	// A listing finds o over its cap (events lost): its newest go.
	c.now = c.now.Add(time.Second)
	asked := c.now
	kicks := l.Reconcile(asked, []broker.Connection{jwtConn("o.a", 2), jwtConn("o.d", 0), jwtConn("o.e", 7), jwtConn("o.e", 8), jwtConn("p.a", 6)})
	want("the listing", cids(kicks), []string{"o.e#8:owner"})
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

// A principal kicked past its cap, or an owner past its own, is kept out for its back-off: the
// callout refuses it and each new connection of it is kicked, even one within its cap; another
// principal of the owner (for a principal's back-off) and another owner are not; once the
// back-off is over it is admitted again.
func TestAConnectionKickedPastItsCapBacksOffItsPrincipalOrOwner(t *testing.T) {
	c := &clock{now: t0}
	l := New(Budgets{PerPrincipal: 2, PerOwner: 3, Tenants: 20, Reserved: 2, Backoff: 10 * time.Second}, c.Now)
	admit := func(p string) error {
		release, err := l.Admit(p)
		if err == nil {
			release()
		}
		return err
	}
	l.Connected(jwtConn("o.a", 1))
	l.Connected(jwtConn("o.a", 2))
	if got := cids(l.Connected(jwtConn("o.a", 3))); !slices.Equal(got, []string{"o.a#3:principal"}) {
		t.Fatalf("past the principal's cap: got kicks %v", got)
	}
	l.Disconnected("s1", 2) // back within its cap, and still backing off
	if got := cids(l.Connected(jwtConn("o.a", 4))); !slices.Equal(got, []string{"o.a#4:backoff"}) {
		t.Fatalf("a connection within the cap during the back-off: got kicks %v, want it kicked", got)
	}
	if err := admit("o.a"); !errors.Is(err, ErrBackingOff) {
		t.Fatalf("the callout during the back-off: got %v, want ErrBackingOff", err)
	}
	for _, p := range []string{"o.b", "p.x"} {
		if err := admit(p); err != nil {
			t.Errorf("%s during another principal's back-off: %v", p, err)
		}
	}
	c.now = c.now.Add(10 * time.Second)
	if err := admit("o.a"); err != nil {
		t.Fatalf("after the back-off: %v", err)
	}
	if got := cids(l.Connected(jwtConn("o.a", 5))); got != nil {
		t.Fatalf("a connection after the back-off: got kicks %v, want none", got)
	}

	// The owner holds o.a#1, o.a#5; o.b#6 is its third; o.c#7 is past the owner's cap.
	l.Connected(jwtConn("o.b", 6))
	if got := cids(l.Connected(jwtConn("o.c", 7))); !slices.Equal(got, []string{"o.c#7:owner"}) {
		t.Fatalf("past the owner's cap: got kicks %v", got)
	}
	l.Disconnected("s1", 6)
	if err := admit("o.d"); !errors.Is(err, ErrBackingOff) {
		t.Fatalf("another principal of the owner during its back-off: got %v, want ErrBackingOff", err)
	}
	if got := cids(l.Connected(jwtConn("o.d", 8))); !slices.Equal(got, []string{"o.d#8:backoff"}) {
		t.Fatalf("another principal of the owner connecting during its back-off: got kicks %v", got)
	}
	if err := admit("p.x"); err != nil {
		t.Errorf("another owner during the back-off: %v", err)
	}
	c.now = c.now.Add(10 * time.Second)
	if err := admit("o.d"); err != nil {
		t.Errorf("the owner after its back-off: %v", err)
	}
}

// A JWT user's key that keeps connecting in its back-off is asked to be held out at the
// broker once, at its ChurnKicks-th kick there, until Hold from then; a callout user's (the
// callout refuses it) and a key kicked fewer times are not; past the back-off the count starts
// again.
func TestAKeyThatKeepsConnectingInItsBackoffIsHeldOut(t *testing.T) {
	c := &clock{now: t0}
	l := New(Budgets{PerPrincipal: 1, Tenants: 1000, Reserved: 2, Backoff: 10 * time.Second, Hold: time.Minute}, c.Now)
	cid := uint64(0)
	connect := func(principal, user string, callout bool) Kick {
		t.Helper()
		cid++
		conn := jwtConn(principal, cid)
		conn.User, conn.Callout = user, callout
		kicks := l.Connected(conn)
		if len(kicks) != 1 {
			t.Fatalf("connection %d of %s: got kicks %v, want it kicked", cid, principal, cids(kicks))
		}
		l.Disconnected("s1", cid)
		return kicks[0]
	}
	l.Connected(broker.Connection{Server: "s1", CID: 1000, Principal: "o.a", User: "UA", Start: t0})
	l.Connected(broker.Connection{Server: "s1", CID: 1001, Principal: "o.b", Start: t0})
	var held []int
	for i := 1; i <= 3*ChurnKicks; i++ {
		if k := connect("o.a", "UA", false); !k.HoldUntil.IsZero() {
			if want := c.now.Add(time.Minute); !k.HoldUntil.Equal(want) {
				t.Errorf("held until %v, want %v", k.HoldUntil, want)
			}
			held = append(held, i)
		}
		if k := connect("o.b", "", true); !k.HoldUntil.IsZero() {
			t.Fatal("a callout user's connection asked for a hold: its key is the callout's to refuse")
		}
		c.now = c.now.Add(100 * time.Millisecond)
	}
	// The first kick is past the cap (no back-off yet), so the ChurnKicks-th in the back-off is
	// the ChurnKicks+1-th in all.
	if !slices.Equal(held, []int{ChurnKicks + 1}) {
		t.Fatalf("holds asked at kicks %v, want one, at the %d-th", held, ChurnKicks+1)
	}
	c.now = c.now.Add(20 * time.Second)
	l.Reconcile(c.now, []broker.Connection{{Server: "s1", CID: 1000, Principal: "o.a", User: "UA", Start: t0}})
	for range ChurnKicks - 1 {
		if k := connect("o.a", "UA", false); !k.HoldUntil.IsZero() {
			t.Fatal("a key kicked fewer than ChurnKicks times in a new back-off was held out")
		}
	}

	// A principal within its cap (its connection gone, its back-off still on) is kicked at
	// every connection of its back-off, but never held out: it is not past its cap.
	l.Disconnected("s1", 1000)
	for i := range 3 * ChurnKicks {
		if k := connect("o.a", "UA", false); !k.HoldUntil.IsZero() {
			t.Fatalf("kick %d of a principal within its cap in its back-off asked for a hold", i+1)
		}
	}
}

// A cap read past is judged when the grace has passed: a client at its cap that closed a
// connection and opened another, its disconnect event heard after the connect, is neither
// kicked nor backed off, as principal or as owner; a connection still past a cap then is
// kicked, the newest, and its principal or owner backs off. Judged at once, the late
// disconnect's client was kicked and kept out for the back-off although it never held more
// than its cap.
func TestACapIsJudgedWhenTheGraceHasPassed(t *testing.T) {
	const grace = 250 * time.Millisecond
	c := &clock{now: t0}
	b := Budgets{PerPrincipal: 2, PerOwner: 3, Tenants: 20, Reserved: 2, Backoff: 10 * time.Second, Grace: grace}
	l := New(b, c.Now)
	want := func(what string, got, want []string) {
		t.Helper()
		if !slices.Equal(got, want) {
			t.Fatalf("%s: got kicks %v, want %v", what, got, want)
		}
	}
	due := func(what string, kicks []string, next time.Time) {
		t.Helper()
		got, gotNext := l.Due()
		want(what, cids(got), kicks)
		if !gotNext.Equal(next) {
			t.Fatalf("%s: next judged at %v, want %v", what, gotNext, next)
		}
	}
	admit := func(p string) error {
		release, err := l.Admit(p)
		if err == nil {
			release()
		}
		return err
	}
	woken := func(what string) {
		t.Helper()
		select {
		case <-l.Judging():
		default:
			t.Fatalf("%s: no cap to judge signalled", what)
		}
	}

	// p.a at its cap of 2 replaces #1 with #3: #3's connect is heard first.
	want("p.a#1", cids(l.Connected(jwtConn("p.a", 1))), nil)
	want("p.a#2", cids(l.Connected(jwtConn("p.a", 2))), nil)
	want("p.a#3, read past p.a's cap", cids(l.Connected(jwtConn("p.a", 3))), nil)
	woken("p.a#3")
	c.now = c.now.Add(grace / 2)
	l.Disconnected("s1", 1)
	c.now = c.now.Add(grace / 2)
	due("p.a when the grace has passed", nil, time.Time{})
	if err := admit("p.a"); !errors.Is(err, ErrPrincipalFull) {
		t.Fatalf("p.a at its cap after a late disconnect: got %v, want ErrPrincipalFull, not a back-off", err)
	}

	// o at its cap of 3 (o.a, o.b, o.c) replaces o.b#5 with o.d#7.
	for _, cid := range []uint64{4, 5, 6} {
		l.Connected(jwtConn("o."+string(rune('a'+cid-4)), cid))
	}
	want("o.d#7, read past o's cap", cids(l.Connected(jwtConn("o.d", 7))), nil)
	woken("o.d#7")
	c.now = c.now.Add(grace - time.Millisecond)
	l.Disconnected("s1", 5)
	c.now = c.now.Add(time.Millisecond)
	due("o when the grace has passed", nil, time.Time{})
	if err := admit("o.e"); !errors.Is(err, ErrOwnerFull) {
		t.Fatalf("o at its cap after a late disconnect: got %v, want ErrOwnerFull, not a back-off", err)
	}

	// A real excess, of a principal and of an owner, is kicked once the grace has passed, not
	// before, and backs off.
	judged := c.now.Add(grace)
	want("p.a#8, past p.a's cap", cids(l.Connected(jwtConn("p.a", 8))), nil)
	want("o.b#9, past o's cap", cids(l.Connected(jwtConn("o.b", 9))), nil)
	c.now = c.now.Add(grace - time.Millisecond)
	due("within the grace", nil, judged)
	c.now = judged
	due("the grace passed", []string{"p.a#8:principal", "o.b#9:owner"}, time.Time{})
	for _, p := range []string{"p.a", "o.e"} {
		if err := admit(p); !errors.Is(err, ErrBackingOff) {
			t.Errorf("%s after its kick: got %v, want ErrBackingOff", p, err)
		}
	}
	if got := l.Counts().Tenants; got != 5 {
		t.Fatalf("tenants: got %d, want p.a's 2 and o's 3", got)
	}

	// A listing that finds a principal past its cap waits the grace too.
	c.now = c.now.Add(time.Second)
	listed := []broker.Connection{jwtConn("p.a", 2), jwtConn("p.a", 3), jwtConn("o.a", 4), jwtConn("o.c", 6),
		jwtConn("o.d", 7), jwtConn("q.a", 10), jwtConn("q.a", 11), jwtConn("q.a", 12)}
	want("a listing with q.a past its cap", cids(l.Reconcile(c.now, listed)), nil)
	c.now = c.now.Add(grace)
	due("the listing's grace passed", []string{"q.a#12:principal"}, time.Time{})
}

// A count past a cap is judged at once when the ledger's connections, the excess with them,
// fill the tenants' share: an excess let wait the grace would take another tenant's room in
// the account, or the plane's.
func TestACapPastWhenTheTenantsShareIsFullIsJudgedAtOnce(t *testing.T) {
	c := &clock{now: t0}
	l := New(Budgets{PerPrincipal: 2, Tenants: 5, Reserved: 2, Backoff: 10 * time.Second, Grace: time.Second}, c.Now)
	for _, conn := range []broker.Connection{jwtConn("p.a", 1), jwtConn("p.a", 2), jwtConn("q.a", 3)} {
		l.Connected(conn)
	}
	if got := cids(l.Connected(jwtConn("p.a", 4))); got != nil {
		t.Fatalf("p.a#4, past p.a's cap with room in the share: got kicks %v, want none yet", got)
	}
	if got := cids(l.Connected(jwtConn("p.a", 5))); !slices.Equal(got, []string{"p.a#5:principal", "p.a#4:principal"}) {
		t.Fatalf("p.a#5, its excess filling the share: got kicks %v, want p.a's two past its cap", got)
	}
	if _, err := l.Admit("p.a"); !errors.Is(err, ErrBackingOff) {
		t.Fatalf("p.a after its kicks: got %v, want ErrBackingOff", err)
	}
}

// A key's connections past its cap judged together when the grace has passed count towards its
// hold as they would have judged one by one: the oldest starts the back-off, and each of the
// others is a kick in it. So a client that opened eleven connections at once past a cap of one
// is held at its next connection, as it was with no grace.
func TestAnExcessJudgedTogetherCountsTowardsAHold(t *testing.T) {
	c := &clock{now: t0}
	b := Budgets{PerPrincipal: 1, Tenants: 1000, Reserved: 2, Backoff: 10 * time.Second, Hold: time.Minute,
		Grace: time.Second}
	l := New(b, c.Now)
	conn := func(cid uint64) broker.Connection {
		x := jwtConn("o.a", cid)
		x.User = "UA"
		return x
	}
	for cid := uint64(1); cid <= 11; cid++ {
		if got := cids(l.Connected(conn(cid))); got != nil {
			t.Fatalf("o.a#%d in the grace: got kicks %v, want none yet", cid, got)
		}
	}
	c.now = c.now.Add(time.Second)
	kicks, _ := l.Due()
	if len(kicks) != 10 {
		t.Fatalf("the grace passed: got kicks %v, want o.a's 10 past its cap", cids(kicks))
	}
	for _, k := range kicks {
		if !k.HoldUntil.IsZero() {
			t.Fatalf("kick %v asked for a hold: %d of the 10 count, the oldest starting the back-off",
				cids([]Kick{k}), ChurnKicks-1)
		}
	}
	kicks = l.Connected(conn(12))
	if len(kicks) != 1 || kicks[0].Budget != BudgetBackoff || !kicks[0].HoldUntil.Equal(c.now.Add(time.Minute)) {
		t.Fatalf("o.a#12 in the back-off: got %+v, want it kicked and its key held until %v",
			kicks, c.now.Add(time.Minute))
	}
}
