package signers

import (
	"context"
	"fmt"
	"time"

	"github.com/nats-io/nkeys"

	"github.com/cotal-ai/authplane/internal/core/fault"
)

// The data account's JWT holds a few JWT users' keys out: a client whose connections the plane
// kicks past its cap and that keeps connecting takes the account's slots until each kick lands
// (the broker lets a JWT user in on its JWT alone), and only a revocation in the account JWT
// refuses it before it takes one. MaxHolds bounds them all (their room is kept off the
// instances' capacity), HoldsPerOwner one owner's, so no owner's churn uses up the room
// another's needs.
const (
	MaxHolds      = 64
	HoldsPerOwner = 8
)

// hold is one key held out: the owner of its principal, and the unix second it is held out
// until. The JWT revokes the key's credentials issued up to then.
type hold struct {
	Owner string `json:"owner"`
	Until int64  `json:"until"`
}

// Hold asks for user, a JWT user's public key of owner, to be held out at the broker until
// until: the data account's JWT revokes its credentials, so every server closes its
// connections and refuses it at connect, before it counts against the account's limit. It does
// not wait; the round that makes it signs and pushes at once. A hold past MaxHolds or
// HoldsPerOwner is dropped (the plane's kicks still close the key's connections). Past until,
// ReleaseHolds or the next recheck signs the account without it. It reports whether it asked
// for the hold: not without the operator signing key, nor for what is no user's key.
func (s *Set) Hold(user, owner string, until time.Time) bool {
	if s.Sign == nil || !nkeys.IsValidPublicUserKey(user) {
		return false
	}
	s.queue(&waiter{op: opHold, iids: []string{user}, owner: owner, until: until.Unix(), deadline: time.Now().Add(time.Minute)})
	return true
}

// ReleaseHolds has a round sign the account again when a hold this replica knows of has
// passed: the key's credentials are let in once more. Holds another replica made are released
// by the recheck (Recheck) when this replica does not know of them.
func (s *Set) ReleaseHolds(ctx context.Context) error {
	s.mu.Lock()
	next := s.nextRelease
	s.mu.Unlock()
	if next == 0 || s.Now().Unix() < next {
		return nil
	}
	return s.Repush(ctx, true)
}

// holdsPast reports whether r holds a key out past its time at now.
func holdsPast(r row, now int64) bool {
	for _, h := range r.Out {
		if h.Until <= now {
			return true
		}
	}
	return false
}

// applyHolds drops from next the holds past now, and adds those of fresh within the bounds,
// with their verdicts. It reports whether next changed.
func applyHolds(next *row, fresh []*waiter, v map[*waiter]verdict, now int64) bool {
	write := false
	for k, h := range next.Out {
		if h.Until <= now {
			delete(next.Out, k)
			write = true
		}
	}
	for _, w := range fresh {
		if w.op != opHold {
			continue
		}
		user := w.iids[0]
		if h, ok := next.Out[user]; ok {
			if h.Until < w.until {
				next.Out[user] = hold{Owner: h.Owner, Until: w.until}
				write = true
			}
			continue
		}
		owned := 0
		for _, h := range next.Out {
			if h.Owner == w.owner {
				owned++
			}
		}
		switch {
		case w.until <= now:
		case len(next.Out) >= MaxHolds:
			v[w] = verdict{refused: fault.New(fault.ResourceExhausted, "the data account holds %d keys out already", len(next.Out))}
		case owned >= HoldsPerOwner:
			v[w] = verdict{refused: fault.New(fault.ResourceExhausted, "owner %s has %d keys held out already", w.owner, owned)}
		default:
			if next.Out == nil {
				next.Out = map[string]hold{}
			}
			next.Out[user] = hold{Owner: w.owner, Until: w.until}
			write = true
		}
	}
	if len(next.Out) == 0 {
		next.Out = nil
	}
	return write
}

// revoked is the revocation list of r's holds: each key's credentials issued up to its time.
func revoked(r row) map[string]int64 {
	if len(r.Out) == 0 {
		return nil
	}
	out := make(map[string]int64, len(r.Out))
	for k, h := range r.Out {
		out[k] = h.Until
	}
	return out
}

// learnHolds keeps the earliest time a hold of o passes, for ReleaseHolds; it holds s.mu.
func (s *Set) learnHolds(o row) {
	s.nextRelease = 0
	for _, h := range o.Out {
		if s.nextRelease == 0 || h.Until < s.nextRelease {
			s.nextRelease = h.Until
		}
	}
}

// validHolds checks the holds of a stored row.
func validHolds(r row) error {
	for k, h := range r.Out {
		if !nkeys.IsValidPublicUserKey(k) || h.Until <= 0 {
			return fmt.Errorf("a held key %q is not a user's public key held until a time", k)
		}
	}
	if len(r.Out) > MaxHolds {
		return fmt.Errorf("%d keys held out, past %d", len(r.Out), MaxHolds)
	}
	return nil
}
