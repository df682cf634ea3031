// Package conns keeps the data account's connections to their budgets: each principal's cap,
// each owner's (over all its principals: its instances' duties, its runs, its people and
// agents), and the tenants' share of the account's limit, the rest being the plane's reserve
// for its own serving users. The broker knows no per-user connection limit, so the count is
// the plane's, in memory, from the servers' connect and disconnect events, put right by a
// listing now and then. A bearer user is refused before it connects (the auth callout asks
// Admit); a JWT user, which the broker lets in on its JWT alone, is kicked once its connect
// event arrives.
package conns

import (
	"errors"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/cotal-ai/authplane/internal/platform/broker"
	"github.com/cotal-ai/authplane/subjects"
)

// The budgets a refusal or a kick names, as the metrics label them. BudgetBackoff is a
// connection of a principal or an owner still in its back-off after a kick past its cap.
const (
	BudgetPrincipal = "principal"
	BudgetOwner     = "owner"
	BudgetTenants   = "tenants"
	BudgetBackoff   = "backoff"
)

// Refusals of Admit. Test them with errors.Is.
var (
	ErrPrincipalFull = errors.New("the principal's connection cap is reached")
	ErrOwnerFull     = errors.New("the owner's connection cap is reached")
	ErrTenantsFull   = errors.New("the tenants' share of the data account's connections is reached")
	ErrBackingOff    = errors.New("it was kicked past its connection cap a moment ago, and waits out its back-off")
)

// Budgets are what the ledger holds the connections to.
type Budgets struct {
	// PerPrincipal bounds one principal's connections.
	PerPrincipal int
	// PerOwner bounds one owner's connections, every principal of it together (0: as many as
	// Tenants).
	PerOwner int
	// Tenants bounds every principal's connections together: the account's limit less the
	// plane's reserve.
	Tenants int
	// Reserved is the plane's reserve, only to say when its own connections outgrow it.
	Reserved int
	// Backoff is how long a principal kicked past its cap, or an owner past its own, is kept
	// out: the callout refuses it and each new connection of it is kicked, so one that
	// reconnects as soon as it is kicked does not churn through the account's connections.
	Backoff time.Duration
	// Hold is how long a JWT user's key that keeps connecting in its back-off (ChurnKicks
	// kicks) is held out at the broker: the broker lets a JWT user in on its JWT alone, so its
	// kicked connections take the account's slots until their kicks land, and only the data
	// account's JWT can refuse it before it takes one (0: never).
	Hold time.Duration
	// Grace is how long a count past a principal's or an owner's cap waits to be judged while
	// the tenants' share has room (0: not at all): a disconnect event can come after the next
	// connect event, and a client at its cap that closes a connection and opens another is
	// then read one over it.
	Grace time.Duration
}

// ChurnKicks is how many connections of one JWT user's key the ledger kicks in its back-off
// before it asks for the key to be held out at the broker: a nats.go client of the default
// options, kicked, reconnects after 2 s, so this is some five such clients of one key over
// their cap, or one that reconnects as soon as it is kicked, within a few milliseconds.
const ChurnKicks = 10

// DefaultHold is the Hold of the plane's ledger: a key that churned is out for a minute, every
// connection of it closed, so its client's churn costs the account's slots a moment a minute.
const DefaultHold = time.Minute

// DefaultBackoff is the Backoff of the plane's ledger: longer than the 2 s a client of the
// default nats.go options waits before it reconnects, so a client that reconnects at once is
// kept out, and short enough that one that trimmed its connections is back soon.
const DefaultBackoff = 10 * time.Second

// PendingFor is how long a slot Admit gave waits for its connection: the broker waits 2 s
// for the callout's answer, and the connection registers as the answer arrives.
const PendingFor = 3 * time.Second

// key names one connection: its server and its id there.
type key struct {
	server string
	cid    uint64
}

// conn is one connection the ledger knows.
type conn struct {
	broker.Connection
	// seen is when the ledger learnt of it; kicked, that a kick of it was sent at kickedAt.
	seen     time.Time
	kicked   bool
	kickedAt time.Time
}

// holder is one principal's connections, oldest first, and how many are not kicked.
type holder struct {
	owner *owned
	conns []*conn
	live  int
}

// owned is one owner's principals that hold connections, and how many of their live ones
// count: each principal's up to its cap.
type owned struct {
	name    string
	holders map[string]*holder
	capped  int
}

// OwnerOf is the owner of principal (`<owner>.<actor>`: owners have no dot); a name with no
// dot is its own.
func OwnerOf(principal string) string {
	owner, _, _ := strings.Cut(principal, ".")
	return owner
}

// Ledger is the data account's connections as the plane knows them. It is safe for concurrent
// use; Admit, on the callout's path, costs a few map operations.
type Ledger struct {
	budgets Budgets
	now     func() time.Time

	mu      sync.Mutex
	conns   map[key]*conn
	holders map[string]*holder
	owners  map[string]*owned
	// capped is the tenants' connections against their budget: each principal's live ones up
	// to its cap, and each owner's of those up to its cap, so a principal's or an owner's
	// excess, kicked soon, never pushes another's connection out. live is all of them.
	capped, live int
	plane        map[key]time.Time // the plane's own, and when each was seen
	overReserve  bool
	// gone are the disconnects heard, so a listing taken before one does not bring it back.
	gone map[key]time.Time
	// backoff holds, by principal or owner (an owner has no dot), when its back-off ends;
	// churn, by JWT user key, its connections kicked in a back-off.
	backoff map[string]time.Time
	churn   map[string]churned
	// due holds when each cap read past is to be judged; wake tells Judging's reader.
	due  map[judged]time.Time
	wake chan struct{}
	// pending, oldest first (every slot waits PendingFor), and per principal.
	pending      []*pending
	pendingOf    map[string][]*pending
	pendingOwner map[string]int
	nPending     int
}

// New returns an empty ledger holding connections to b, on clock now.
func New(b Budgets, now func() time.Time) *Ledger {
	if b.PerOwner <= 0 {
		b.PerOwner = b.Tenants
	}
	return &Ledger{budgets: b, now: now, conns: map[key]*conn{}, holders: map[string]*holder{}, owners: map[string]*owned{},
		plane: map[key]time.Time{}, gone: map[key]time.Time{}, pendingOf: map[string][]*pending{}, pendingOwner: map[string]int{},
		backoff: map[string]time.Time{}, churn: map[string]churned{},
		due: map[judged]time.Time{}, wake: make(chan struct{}, 1)}
}

// Kick is a connection to close and the budget it is past. A non-zero HoldUntil asks for its
// user's key to be held out at the broker until then: it keeps connecting in its back-off.
type Kick struct {
	broker.Connection
	Budget    string
	HoldUntil time.Time
}

// setKicked marks c kicked or live again, keeping the counts.
func (l *Ledger) setKicked(c *conn, kicked bool) {
	if c.kicked == kicked {
		return
	}
	c.kicked, c.kickedAt = kicked, l.now()
	d := 1
	if kicked {
		d = -1
	}
	l.count(l.holders[c.Principal], d)
}

// count adds d to h's live connections and the totals.
func (l *Ledger) count(h *holder, d int) {
	o := h.owner
	before, ownerBefore := min(h.live, l.budgets.PerPrincipal), min(o.capped, l.budgets.PerOwner)
	h.live += d
	l.live += d
	o.capped += min(h.live, l.budgets.PerPrincipal) - before
	l.capped += min(o.capped, l.budgets.PerOwner) - ownerBefore
}

// Connected records a connection from its connect event and returns what to kick: this one in
// its principal's or owner's back-off, or past the tenants' budget; and, with no Grace, the
// principal's newest past its cap and its owner's newest past the owner's. With a Grace those
// caps are judged when it has passed (Due).
func (l *Ledger) Connected(c broker.Connection) []Kick {
	l.mu.Lock()
	defer l.mu.Unlock()
	k := key{c.Server, c.CID}
	if _, ok := l.conns[k]; ok {
		return nil
	}
	if _, ok := l.gone[k]; ok {
		return nil
	}
	if _, ok := l.plane[k]; ok {
		return nil
	}
	now := l.now()
	l.expire(now)
	if !l.add(c, now) {
		return nil
	}
	l.connectedSlot(c)
	if l.backingOff(c.Principal, now) {
		l.setKicked(l.conns[k], true)
		return []Kick{{Connection: c, Budget: BudgetBackoff, HoldUntil: l.churning(c, now)}}
	}
	h := l.holders[c.Principal]
	over := h.live > l.budgets.PerPrincipal || h.owner.capped > l.budgets.PerOwner
	kicks := l.judgePrincipal(c.Principal, now)
	kicks = append(kicks, l.judgeOwner(h.owner, now)...)
	if nc := l.conns[k]; !over && !nc.kicked && l.capped > l.budgets.Tenants {
		l.setKicked(nc, true)
		kicks = append(kicks, Kick{Connection: c, Budget: BudgetTenants})
	}
	return kicks
}

// add records c, seen at now, and reports whether it is a tenant's (not the plane's own).
func (l *Ledger) add(c broker.Connection, now time.Time) bool {
	k := key{c.Server, c.CID}
	if strings.HasPrefix(c.Principal, subjects.PlaneUserPrefix) {
		l.plane[k] = now
		l.overReserve = l.overReserve || len(l.plane) > l.budgets.Reserved
		return false
	}
	nc := &conn{Connection: c, seen: now}
	l.conns[k] = nc
	h := l.holders[c.Principal]
	if h == nil {
		name := OwnerOf(c.Principal)
		o := l.owners[name]
		if o == nil {
			o = &owned{name: name, holders: map[string]*holder{}}
			l.owners[name] = o
		}
		h = &holder{owner: o}
		l.holders[c.Principal] = h
		o.holders[c.Principal] = h
	}
	h.conns = append(h.conns, nc)
	slices.SortStableFunc(h.conns, func(a, b *conn) int { return a.Start.Compare(b.Start) })
	l.count(h, 1)
	return true
}

// remove forgets the connection k.
func (l *Ledger) remove(k key) {
	delete(l.plane, k)
	c, ok := l.conns[k]
	if !ok {
		return
	}
	delete(l.conns, k)
	h := l.holders[c.Principal]
	if !c.kicked {
		l.count(h, -1)
	}
	h.conns = slices.DeleteFunc(h.conns, func(x *conn) bool { return x == c })
	if len(h.conns) == 0 {
		delete(l.holders, c.Principal)
		delete(h.owner.holders, c.Principal)
		if len(h.owner.holders) == 0 {
			delete(l.owners, h.owner.name)
		}
	}
}

// enforce marks kicked, and returns, principal's newest connections past its cap.
func (l *Ledger) enforce(principal string) []Kick {
	h := l.holders[principal]
	var kicks []Kick
	for i := len(h.conns) - 1; i >= 0 && h.live > l.budgets.PerPrincipal; i-- {
		if c := h.conns[i]; !c.kicked {
			l.setKicked(c, true)
			kicks = append(kicks, Kick{Connection: c.Connection, Budget: BudgetPrincipal})
		}
	}
	if len(kicks) > 0 {
		l.backOff(principal)
	}
	return kicks
}

// enforceOwner marks kicked, and returns, o's newest connections past its cap, of whichever
// of its principals. Each principal is within its own cap already, so every kick counts.
func (l *Ledger) enforceOwner(o *owned) []Kick {
	if o.capped <= l.budgets.PerOwner {
		return nil
	}
	var live []*conn
	for _, h := range o.holders {
		for _, c := range h.conns {
			if !c.kicked {
				live = append(live, c)
			}
		}
	}
	l.backOff(o.name)
	return l.kickNewest(live, func() bool { return o.capped > l.budgets.PerOwner }, BudgetOwner)
}

// kickNewest marks kicked, and returns, the newest of live while over says they are past
// budget.
func (l *Ledger) kickNewest(live []*conn, over func() bool, budget string) []Kick {
	slices.SortFunc(live, func(a, b *conn) int { return b.Start.Compare(a.Start) })
	var kicks []Kick
	for _, c := range live {
		if !over() {
			break
		}
		l.setKicked(c, true)
		kicks = append(kicks, Kick{Connection: c.Connection, Budget: budget})
	}
	return kicks
}

// Disconnected forgets a connection from its disconnect event.
func (l *Ledger) Disconnected(server string, cid uint64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	k := key{server, cid}
	l.remove(k)
	l.gone[k] = l.now()
}

// KickFailed counts a connection whose kick did not happen as live again.
func (l *Ledger) KickFailed(c broker.Connection) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if x, ok := l.conns[key{c.Server, c.CID}]; ok {
		l.setKicked(x, false)
	}
}

// Reconcile puts the ledger right with a listing of the account's connections asked for at
// asked, and returns what to kick: every principal's newest past its cap and every owner's
// newest past its cap (or, with a Grace, those caps judged when it has passed: Due), then the
// newest tenants' past their budget. A connection the ledger learnt of
// before asked that the listing lacks is gone (its disconnect event was lost, or its server
// went); one the listing has that the ledger lacks is added unless its disconnect was heard;
// one kicked before asked that is still listed is kicked again.
func (l *Ledger) Reconcile(asked time.Time, listed []broker.Connection) []Kick {
	l.mu.Lock()
	defer l.mu.Unlock()
	now := l.now()
	in := make(map[key]bool, len(listed))
	for _, c := range listed {
		k := key{c.Server, c.CID}
		in[k] = true
		_, known := l.conns[k]
		_, heard := l.gone[k]
		_, own := l.plane[k]
		if !known && !heard && !own && l.add(c, now) {
			// Counted now, its slot ends here: its connect event, if it comes, finds it known.
			l.connectedSlot(c)
		}
	}
	for k, seen := range l.plane {
		if !in[k] && seen.Before(asked) {
			delete(l.plane, k)
		}
	}
	for k, c := range l.conns {
		switch {
		case !in[k] && c.seen.Before(asked):
			l.remove(k)
		case in[k] && c.kicked && c.kickedAt.Before(asked):
			l.setKicked(c, false)
		}
	}
	for name, until := range l.backoff {
		if !now.Before(until) {
			delete(l.backoff, name)
		}
	}
	for user, ch := range l.churn {
		if !now.Before(ch.until) {
			delete(l.churn, user)
		}
	}
	// A disconnect heard before this listing was asked for is reflected in it.
	for k, at := range l.gone {
		if at.Before(asked) {
			delete(l.gone, k)
		}
	}
	var kicks []Kick
	for p := range l.holders {
		kicks = append(kicks, l.judgePrincipal(p, now)...)
	}
	for _, o := range l.owners {
		kicks = append(kicks, l.judgeOwner(o, now)...)
	}
	if l.capped > l.budgets.Tenants {
		var all []*conn
		for _, c := range l.conns {
			if !c.kicked {
				all = append(all, c)
			}
		}
		kicks = append(kicks, l.kickNewest(all, func() bool { return l.capped > l.budgets.Tenants }, BudgetTenants)...)
	}
	return kicks
}

// Counts are the ledger's connections now: the tenants' (kicked ones aside), the plane's own,
// and whether the plane's have ever outgrown its reserve.
type Counts struct {
	Tenants, Plane int
	OverReserve    bool
}

// Counts returns the ledger's counts.
func (l *Ledger) Counts() Counts {
	l.mu.Lock()
	defer l.mu.Unlock()
	return Counts{Tenants: l.live, Plane: len(l.plane), OverReserve: l.overReserve}
}
