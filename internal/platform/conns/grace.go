package conns

import (
	"slices"
	"time"
)

// DefaultGrace is the Grace of the plane's ledger. A client that closes a connection and opens
// another at once has the two events sent by one server a few milliseconds apart, on two
// subscriptions of the plane that may hand them over in either order; 250 ms is well past that
// under load, and keeps a real excess's life (the grace and one kick) well within the 2 s the
// connection tests allow it, and short of the 2 s a nats.go client waits to reconnect.
const DefaultGrace = 250 * time.Millisecond

// judged names a cap to judge: a principal's, or an owner's.
type judged struct {
	name  string
	owner bool
}

// judgePrincipal returns principal's newest connections past its cap to kick at once when the
// ledger has no grace, or when its connections fill the tenants' share (atOnce); else it judges
// the cap when the grace has passed (Due), the first time the count reads it past since it was
// last judged.
func (l *Ledger) judgePrincipal(principal string, now time.Time) []Kick {
	if l.holders[principal].live <= l.budgets.PerPrincipal {
		return nil
	}
	if l.atOnce() {
		return l.enforce(principal)
	}
	l.judgeAt(judged{name: principal}, now)
	return nil
}

// judgeOwner is judgePrincipal for o's cap.
func (l *Ledger) judgeOwner(o *owned, now time.Time) []Kick {
	if o.capped <= l.budgets.PerOwner {
		return nil
	}
	if l.atOnce() {
		return l.enforceOwner(o)
	}
	l.judgeAt(judged{name: o.name, owner: true}, now)
	return nil
}

// atOnce reports whether a cap read past is judged at once: the ledger has no grace, or its
// connections (every excess, those kicked and not yet gone, and the callout's slots) fill the
// tenants' share. An excess let wait then would take the room of another tenant, whose
// connect the broker would refuse, or of the plane's own.
func (l *Ledger) atOnce() bool {
	return l.budgets.Grace <= 0 || len(l.conns)+l.nPending >= l.budgets.Tenants
}

// judgeAt has j judged a grace from now, unless it is already to be, and wakes Due's caller.
func (l *Ledger) judgeAt(j judged, now time.Time) {
	if _, ok := l.due[j]; ok {
		return
	}
	l.due[j] = now.Add(l.budgets.Grace)
	select {
	case l.wake <- struct{}{}:
	default:
	}
}

// Judging signals that a cap is to be judged when the grace has passed: call Due then.
func (l *Ledger) Judging() <-chan struct{} { return l.wake }

// Due judges the caps whose grace has passed, and returns what to kick: each principal's newest
// connections still past its cap, then each owner's past the owner's, each backing off as a
// kick at once does. A count read past a cap only because a disconnect event came after the
// next connect event is within the cap again by then. next is when the next cap is to be
// judged (zero: none is).
func (l *Ledger) Due() (kicks []Kick, next time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	now := l.now()
	var principals, owners []string
	for j, at := range l.due {
		if now.Before(at) {
			if next.IsZero() || at.Before(next) {
				next = at
			}
			continue
		}
		delete(l.due, j)
		if j.owner {
			owners = append(owners, j.name)
		} else {
			principals = append(principals, j.name)
		}
	}
	slices.Sort(principals)
	slices.Sort(owners)
	for _, p := range principals {
		if l.holders[p] != nil {
			kicks = append(kicks, l.churned(l.enforce(p), now)...)
		}
	}
	for _, name := range owners {
		if o := l.owners[name]; o != nil {
			kicks = append(kicks, l.churned(l.enforceOwner(o), now)...)
		}
	}
	return kicks, next
}

// churned counts kicks, one cap's excess judged together (newest first), towards their keys'
// holds as a kick in the back-off counts, all but the oldest: judged one by one, the oldest
// would have started the back-off and each of the others been kicked in it. So a client that
// opened many connections past its cap in the grace is held as soon as it was before.
func (l *Ledger) churned(kicks []Kick, now time.Time) []Kick {
	for i := range len(kicks) - 1 {
		kicks[i].HoldUntil = l.churning(kicks[i].Connection, now)
	}
	return kicks
}
