package conns

import (
	"time"

	"github.com/cotal-ai/authplane/internal/platform/broker"
)

// backOff starts the back-off of name, a principal or an owner, from now.
func (l *Ledger) backOff(name string) {
	if l.budgets.Backoff > 0 {
		l.backoff[name] = l.now().Add(l.budgets.Backoff)
	}
}

// backingOff reports whether principal, or its owner, is in its back-off at now.
func (l *Ledger) backingOff(principal string, now time.Time) bool {
	for _, name := range []string{principal, OwnerOf(principal)} {
		if until, ok := l.backoff[name]; ok {
			if now.Before(until) {
				return true
			}
			delete(l.backoff, name)
		}
	}
	return false
}

// churning counts c, a connection kicked in its back-off, against its user key when its
// principal still holds its cap without it, or its owner the owner's, and returns until when to
// hold the key out when this is its ChurnKicks-th such kick in the back-off (zero otherwise,
// and for a callout user, which the callout refuses itself). A kick of one within its caps is
// not counted: the count may be high for a moment because a disconnect event is late (a
// client that closes a connection and opens another), and that must not hold an owner out.
func (l *Ledger) churning(c broker.Connection, now time.Time) time.Time {
	if c.Callout || c.User == "" || l.budgets.Hold <= 0 {
		return time.Time{}
	}
	if h := l.holders[c.Principal]; h.live < l.budgets.PerPrincipal && h.owner.capped < l.budgets.PerOwner {
		return time.Time{}
	}
	ch := l.churn[c.User]
	if !now.Before(ch.until) {
		ch = churned{until: now.Add(l.budgets.Backoff)}
	}
	ch.kicks++
	l.churn[c.User] = ch
	if ch.kicks != ChurnKicks {
		return time.Time{}
	}
	return now.Add(l.budgets.Hold)
}

// churned is how many connections of one JWT user key were kicked in a back-off ending at
// until.
type churned struct {
	kicks int
	until time.Time
}
