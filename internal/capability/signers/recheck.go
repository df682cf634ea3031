package signers

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/cotal-ai/authplane/internal/core/fence"
	"github.com/cotal-ai/authplane/internal/core/issue"
	"github.com/cotal-ai/authplane/subjects"
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
	for iid := range s.live { // taken off by another replica's withdraw or end
		if _, ok := cur.Row.Live[iid]; !ok {
			delete(s.live, iid)
			delete(s.settled, iid)
		}
	}
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
		case issue.GateOpen:
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

// Withdraw takes iid's key off the set, best effort and without waiting, when its first
// registration was refused after the key was listed: the round that takes it off reads the
// gate, after the set, and leaves a key whose gate exists (a registration of the instance that
// committed). A registration of the instance still in flight elsewhere may lose its key; its
// next mint lists it again once its gate is open. What this misses, the sweep takes off.
func (s *Set) Withdraw(iid string) {
	if s.Sign == nil {
		return
	}
	s.queue(&waiter{op: opWithdraw, iids: []string{iid}, deadline: time.Now().Add(time.Minute)})
}

// Committed marks iid, whose first registration committed, live on this replica when the
// stored set still lists its key: its next mints need no round. A key taken off meanwhile
// (a withdraw of a racing registration) is left for the next mint to list again.
func (s *Set) Committed(ctx context.Context, iid string) {
	cur, err := s.fence().Observe(ctx)
	if err != nil {
		return // the next mint's round decides
	}
	if _, ok := cur.Row.Live[iid]; ok {
		s.rounds()
		s.mu.Lock()
		s.live[iid] = true
		s.mu.Unlock()
	}
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
	if holdsPast(cur.Row, s.Now().Unix()) {
		return true, s.Repush(ctx, true) // a hold another replica made has passed
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

// gateStates reads the state of each instance's gate of iids ("" for one never written;
// "gone" for a delete marker), a bounded number at a time.
func (s *Set) gateStates(ctx context.Context, iids []string) ([]string, error) {
	states := make([]string, len(iids))
	errs := make([]error, len(iids))
	limit := make(chan struct{}, 32)
	var wg sync.WaitGroup
	for i, iid := range iids {
		limit <- struct{}{}
		wg.Go(func() {
			defer func() { <-limit }()
			g, err := issue.GateOf(s.Gates, subjects.GateEndpointManager, iid).Observe(ctx)
			switch {
			case errors.Is(err, fence.ErrGone):
				states[i] = "gone"
			case err != nil:
				errs[i] = fmt.Errorf("read the gate of instance %s: %w", iid, err)
			case !g.Absent():
				states[i] = g.Row.State
			}
		})
	}
	wg.Wait()
	return states, errors.Join(errs...)
}

// Serve ties the rounds to ctx (the plane's life): once it ends, every change waiting is
// closed unmade (or made and not confirmed), no new one is taken, and Serve returns when the
// round under way has ended. Without Serve, rounds end with their waiters' deadlines.
func (s *Set) Serve(ctx context.Context) {
	s.mu.Lock()
	s.life = ctx
	s.mu.Unlock()
	<-ctx.Done()
	s.mu.Lock()
	for _, w := range s.waiting {
		s.close(w)
	}
	s.mu.Unlock()
	s.runs.Wait()
}

// parent is the context the rounds run under: Serve's, or none.
func (s *Set) parent() context.Context {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.life == nil {
		return context.Background()
	}
	return s.life
}
