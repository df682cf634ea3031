package conns

import (
	"fmt"
	"slices"
	"time"

	"github.com/cotal-ai/authplane/internal/platform/broker"
)

// pending is a slot Admit gave a bearer user that has not connected yet.
type pending struct {
	principal string
	until     time.Time
	done      bool
}

// Admit takes a slot for a connection of principal that the auth callout is about to let in,
// or refuses it past any of its budgets, or while it or its owner is in its back-off. The slot is the principal's until its connect event
// arrives or PendingFor has passed; release gives it back at once, for an answer that was not
// sent.
func (l *Ledger) Admit(principal string) (release func(), err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	now := l.now()
	l.expire(now)
	owner := OwnerOf(principal)
	held, heldByOwner := len(l.pendingOf[principal]), l.pendingOwner[owner]
	if h := l.holders[principal]; h != nil {
		held += h.live
	}
	if o := l.owners[owner]; o != nil {
		heldByOwner += o.capped
	}
	switch {
	case l.backingOff(principal, now):
		return nil, ErrBackingOff
	case held >= l.budgets.PerPrincipal:
		return nil, fmt.Errorf("%w (%d of %d)", ErrPrincipalFull, held, l.budgets.PerPrincipal)
	case heldByOwner >= l.budgets.PerOwner:
		return nil, fmt.Errorf("%w (%d of %d)", ErrOwnerFull, heldByOwner, l.budgets.PerOwner)
	case l.capped+l.nPending >= l.budgets.Tenants:
		return nil, fmt.Errorf("%w (%d)", ErrTenantsFull, l.budgets.Tenants)
	}
	p := &pending{principal: principal, until: now.Add(PendingFor)}
	l.pending = append(l.pending, p)
	l.pendingOf[principal] = append(l.pendingOf[principal], p)
	l.pendingOwner[owner]++
	l.nPending++
	return func() {
		l.mu.Lock()
		defer l.mu.Unlock()
		l.settle(p)
	}, nil
}

// settle ends a pending slot: it connected, expired or was given back.
func (l *Ledger) settle(p *pending) {
	if p.done {
		return
	}
	p.done = true
	l.nPending--
	if owner := OwnerOf(p.principal); l.pendingOwner[owner] <= 1 {
		delete(l.pendingOwner, owner)
	} else {
		l.pendingOwner[owner]--
	}
	q := slices.DeleteFunc(l.pendingOf[p.principal], func(x *pending) bool { return x == p })
	if len(q) == 0 {
		delete(l.pendingOf, p.principal)
	} else {
		l.pendingOf[p.principal] = q
	}
}

// expire ends the pending slots whose time has passed, and drops settled ones from the queue.
func (l *Ledger) expire(now time.Time) {
	i := 0
	for ; i < len(l.pending); i++ {
		p := l.pending[i]
		if !p.done && now.Before(p.until) {
			break
		}
		l.settle(p)
	}
	l.pending = l.pending[i:]
}

// connectedSlot ends the slot Admit gave c, a tenant's connection now counted, if the auth
// callout let it in: on whichever replica that was, the principal's oldest slot is this one's.
func (l *Ledger) connectedSlot(c broker.Connection) {
	if !c.Callout {
		return
	}
	if q := l.pendingOf[c.Principal]; len(q) > 0 {
		l.settle(q[0])
	}
}
