package signers

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/cotal-ai/authplane/internal/gate"
)

// RecheckGrace is how old the set's last signing must be before Recheck signs it again: its own
// round is reading it back until then.
const RecheckGrace = 10 * time.Second

// Sweep takes off the set the keys of instances that can mint nothing more: a gate frozen or
// retired (an end that stopped before its step took the key off), or still absent Settle after
// the key was added (a first registration that never committed). A gate this replica saw
// registered and open is not read again (an end takes its key off). It returns how many keys
// it took off.
func (s *Set) Sweep(ctx context.Context) (int, error) {
	if s.Sign == nil {
		return 0, nil
	}
	s.rounds()
	cur, err := s.fence().Observe(ctx)
	if err != nil {
		return 0, fmt.Errorf("read the data account's signing keys: %w", err)
	}
	s.mu.Lock()
	var iids []string
	for iid := range cur.Row.Live {
		if !s.settled[iid] {
			iids = append(iids, iid)
		}
	}
	s.mu.Unlock()
	slices.Sort(iids)
	states, err := s.gateStates(ctx, iids)
	if err != nil {
		return 0, err
	}
	now := s.Now()
	stale := map[string]int64{}
	s.mu.Lock()
	for i, iid := range iids {
		at := cur.Row.Live[iid]
		switch states[i] {
		case gate.Open:
			s.settled[iid] = true
		case "":
			if now.Sub(time.Unix(at, 0)) > s.Settle {
				stale[iid] = at
			}
		default: // frozen, retired, or a delete marker
			stale[iid] = at
		}
	}
	s.mu.Unlock()
	if len(stale) == 0 {
		return 0, nil
	}
	w := &waiter{op: opRemove, iids: slices.Sorted(maps.Keys(stale)), only: stale}
	s.await(ctx, w)
	s.mu.Lock()
	defer s.mu.Unlock()
	if !w.confirmed {
		return 0, fmt.Errorf("take the keys of %d instances that mint nothing more off the data account: %w", len(stale), s.cause())
	}
	return len(w.iids), nil
}

// Recheck sweeps the set, then reads it and what every server's resolver holds, and when a
// server holds an older JWT or lists other keys, has a round sign and push the set again and
// waits for it to be read back, reporting that it did. That undoes what a push of an older
// account JWT did: one from something else that pushes the data account (nsc, a tool on the
// side), one of a replica's that reached a server after a later one, or a server that came back
// with what it held before. A set whose last signing is younger than RecheckGrace is left to
// the round that made it, which reads it back itself.
func (s *Set) Recheck(ctx context.Context) (repushed bool, err error) {
	if s.Sign == nil {
		return false, nil
	}
	if _, err := s.Sweep(ctx); err != nil {
		return false, err
	}
	cur, err := s.fence().Observe(ctx)
	if err != nil {
		return false, fmt.Errorf("read the data account's signing keys: %w", err)
	}
	if s.wall().Sub(time.Unix(cur.Row.IssuedAt, 0)) < RecheckGrace {
		return false, nil
	}
	pubs, err := s.pubs(ctx, cur.Row)
	if err != nil {
		return false, err
	}
	// A reading of its own: the rounds' state is their run's.
	held, err := (&rounds{s: s, reach: &reach{Broker: s.Broker}}).view(ctx)
	if err != nil {
		return false, err
	}
	if held.oldest >= cur.Row.IssuedAt && held.holds(pubs) {
		return false, nil
	}
	return true, s.Repush(ctx, true)
}
