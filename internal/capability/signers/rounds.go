package signers

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/cotal-ai/authplane/internal/core/fault"
	"github.com/cotal-ai/authplane/internal/core/fence"
	"github.com/cotal-ai/authplane/internal/core/issue"
	"github.com/cotal-ai/authplane/internal/core/store"
)

// rounds is the state of a Set's run across its rounds.
type rounds struct {
	s     *Set
	reach *reach
	// last is the newest issue time known to be signed (the row's or a server's): the next
	// signing must be later.
	last int64
	// force makes the next round sign even with nothing to change: a push did not land, or a
	// server does not hold what the set says.
	force   bool
	attempt int
	decoded []decoded // the account JWTs read back last
	// known is the set as this plane last wrote or read it.
	known *fence.Observed[row]
	// token is the newest JWT this plane signed, issued at tokenAt.
	token   string
	tokenAt int64
}

// errTooSoon: the wall clock is still in the second of the last signing.
var errTooSoon = errors.New("too soon to sign again")

// serve runs one round: wait out the second of the last signing, holding nothing, so everyone
// who arrives meanwhile joins; then one write makes everyone's change and reserves the signing
// that carries them, and one push and one read-back confirm them all.
func (r *rounds) serve(ctx context.Context) {
	s := r.s
	if r.again(ctx) {
		return
	}
	if err := s.waitPast(ctx, r.last); err != nil {
		return // the deadline: run closes whoever waited
	}
	ws, _ := s.open()
	if len(ws) == 0 {
		return
	}
	force := r.force || slices.ContainsFunc(ws, func(w *waiter) bool { return w.op == opPush && !w.written })
	if force {
		r.reach.forget() // a start, a server that came or went, a push that did not land
	}
	o, token, err := s.change(ctx, ws, r.last, force, r.known)
	r.known = nil
	if err == nil || errors.Is(err, errTooSoon) {
		r.known = o
	}
	switch {
	case errors.Is(err, errTooSoon):
		r.last = max(r.last, o.Row.IssuedAt) // another replica signed in this second
		return
	case err != nil:
		r.note(err)
		s.mu.Lock()
		for _, w := range ws {
			if !w.written || errors.Is(err, ErrNoSigner) { // the change may not be in the row
				w.err = err
				if !errors.Is(err, ErrNoSigner) {
					w.err = fault.Store(err, "changing the data account's signing keys")
				}
				s.close(w)
			}
		}
		s.mu.Unlock()
		r.pause(ctx)
		return
	}
	r.last = max(r.last, o.Row.IssuedAt)
	if token == "" {
		// Nothing to sign: the row holds every change already. The broker may too; where it
		// does not, the next round signs.
		held, err := r.view(ctx)
		if err != nil {
			r.note(err)
			r.force = true
			r.pause(ctx)
			return
		}
		r.last = max(r.last, held.newest)
		if !r.release(ws, held, o.Row.IssuedAt) {
			r.force = true
		}
		return
	}
	r.force, r.token, r.tokenAt = false, token, o.Row.IssuedAt
	if s.Keep != nil {
		if err := s.Keep(token); err != nil {
			r.note(fmt.Errorf("keep the account JWT: %w", err))
			r.force = true
			r.pause(ctx)
			return
		}
	}
	if err := s.Broker.Push(ctx, token); err != nil {
		r.note(fmt.Errorf("the broker did not take the account JWT: %w", err))
		r.force = true
		r.pause(ctx)
		return
	}
	if err := r.confirm(ctx, ws, o.Row.IssuedAt); err != nil {
		r.note(err)
		r.force = true
	}
}

// again serves a round of pushes of the newest JWT alone, when this plane signed it: no
// signing, so no wait for the next second. A push through one server's own connection (via) is
// done once that server took it; a push to every server is read back from each. It reports
// whether it served the round.
func (r *rounds) again(ctx context.Context) bool {
	s := r.s
	ws, _ := s.open()
	if r.token == "" || r.force || len(ws) == 0 || slices.ContainsFunc(ws, func(w *waiter) bool { return w.op != opPush || w.resign }) {
		return false
	}
	r.reach.forget() // a server came or went: count them again
	cur, err := s.fence().Observe(ctx)
	if err != nil || cur.Row.IssuedAt != r.tokenAt {
		return false // another replica signed since: a round signs anew
	}
	all, failed := r.pushVia(ctx, ws)
	if len(all) == 0 {
		if failed {
			r.pause(ctx)
		}
		return true
	}
	if err := s.Broker.Push(ctx, r.token); err != nil {
		r.note(fmt.Errorf("the broker did not take the account JWT: %w", err))
		r.force = true
		return true
	}
	if err := r.confirm(ctx, all, r.tokenAt); err != nil {
		r.note(err)
		r.force = true
	}
	return true
}

// verdict is what a round's write made of one waiter's change: the keys a remove took off (or
// found off), or why an add was refused.
type verdict struct {
	gone    []string
	refused *fault.Error
}

// change makes the changes of the waiters of ws not yet written, and signs the set that
// results with an issue time later than last and than the row's, reserving it in the same
// write: the JWT carries every change made before it. It never waits: when the wall clock is
// still in the second of the newest signing it is errTooSoon (the row as seen comes back, for
// its issue time). With no key to add or remove and no force, it signs nothing and returns no
// token.
func (s *Set) change(ctx context.Context, ws []*waiter, last int64, force bool, known *fence.Observed[row]) (*fence.Observed[row], string, error) {
	var fresh []*waiter
	for _, w := range ws {
		if !w.written {
			fresh = append(fresh, w)
		}
	}
	var token string
	var seen *fence.Observed[row]
	var verdicts map[*waiter]verdict
	decide := func(cur *fence.Observed[row]) (row, error) {
		seen, token = cur, ""
		next, write, v, err := s.apply(ctx, cur, fresh)
		if err != nil {
			return row{}, err
		}
		verdicts = v
		switch {
		case !write && !force:
			return row{}, fence.ErrKeep
		case !force && sameKeys(cur.Row.Live, next.Live) && slices.Equal(cur.Row.gens(), next.gens()) && maps.Equal(cur.Row.Out, next.Out):
			return next, nil // a write that changes no key: nothing to sign
		}
		t, issued, err := s.sign(ctx, next)
		if err != nil {
			return row{}, err
		}
		if issued <= max(last, cur.Row.IssuedAt) {
			return row{}, errTooSoon
		}
		next.IssuedAt, token = issued, t
		return next, nil
	}
	// The row as this plane last wrote or read it is tried first, at its revision: when no
	// other replica wrote since, that saves the read. A row that moved is read again.
	o, err := s.fence().UpdateFrom(ctx, known, decide)
	if errors.Is(err, errTooSoon) {
		return seen, "", err
	} else if err != nil {
		return nil, "", err
	}
	s.learn(fresh, verdicts)
	s.mu.Lock()
	s.learnHolds(o.Row)
	s.mu.Unlock()
	return o, token, nil
}

// apply is the set observed with the changes of fresh: removes first (unconditionally, or,
// for the sweep's, only of keys still added when it judged them), then adds, each only while
// its instance's gate is absent or open (read now, after the row: an end freezes the gate
// before it removes the key, and the removal moves the row, so an add that read the gate
// before the freeze fails its CAS and reads it again) and while the set has room. An add by a
// registration still to commit (its gate not seen registered) of a key added long ago renews
// when it was added, so the sweep leaves it alone until the registration's deadline. write
// says the row must be written: every remove writes it, even of a key not on it.
func (s *Set) apply(ctx context.Context, cur *fence.Observed[row], fresh []*waiter) (row, bool, map[*waiter]verdict, error) {
	now := s.Now().Unix()
	next := row{V: 1, Account: s.Account, Live: maps.Clone(cur.Row.Live), Gens: cur.Row.Gens, Out: maps.Clone(cur.Row.Out), IssuedAt: cur.Row.IssuedAt}
	if next.Live == nil {
		next.Live = map[string]int64{}
	}
	v := map[*waiter]verdict{}
	write := applyHolds(&next, fresh, v, now)
	for _, w := range fresh {
		if w.op != opRemove {
			continue
		}
		write = true
		for _, iid := range w.iids {
			if at, ok := next.Live[iid]; ok && w.only != nil && at != w.only[iid] {
				continue // added again, or renewed, since the sweep judged it
			}
			delete(next.Live, iid)
		}
	}
	for _, w := range fresh {
		if w.op != opGens || slices.Equal(next.gens(), w.gens) {
			continue
		}
		if w.fit && !room(len(w.gens), len(next.Live), s.Capacity) {
			v[w] = verdict{refused: fault.New(fault.ResourceExhausted, "the data account's JWT cannot list %d generations of signing keys for the %d live manager instances (it holds %d keys, in one broker message); retire instances, or raise the broker's max_payload", len(w.gens), len(next.Live), s.Capacity+1)}
			continue
		}
		next.Gens = slices.Clone(w.gens)
		if slices.Equal(next.Gens, []uint64{0}) {
			next.Gens = nil
		}
		write = true
	}
	var check []*waiter
	for _, w := range fresh {
		if w.op == opWithdraw {
			check = append(check, w) // read before the adds, taken off before them
		}
	}
	for _, w := range fresh {
		if w.op != opAdd {
			continue
		}
		iid := w.iids[0]
		if at, ok := next.Live[iid]; !ok {
			check = append(check, w)
		} else if !w.registered && time.Duration(now-at)*time.Second > s.Settle/2 {
			next.Live[iid] = now
			write = true
		}
	}
	states, err := s.gates(ctx, check)
	if err != nil {
		return row{}, false, nil, err
	}
	for i, w := range check {
		if _, ok := next.Live[w.iids[0]]; ok && w.op == opWithdraw && states[i] == "" {
			delete(next.Live, w.iids[0])
			write = true
		}
	}
	for i, w := range check {
		iid := w.iids[0]
		if w.op == opWithdraw {
			continue
		}
		switch _, ok := next.Live[iid]; {
		case ok: // another waiter of the round added it
		case states[i] != "" && states[i] != issue.GateOpen:
			v[w] = verdict{refused: fault.New(fault.FailedPrecondition, "the gate of instance %s is %s; it issues nothing", iid, states[i])}
		case !room(len(next.gens()), len(next.Live)+1, s.Capacity):
			v[w] = verdict{refused: full(len(next.Live))}
		default:
			next.Live[iid] = now
			write = true
		}
	}
	// A remove is of the keys off the set once the round's adds are made (the sweep's of an
	// instance whose registration came back meanwhile is not).
	for _, w := range fresh {
		if w.op == opRemove || w.op == opWithdraw {
			v[w] = verdict{gone: slices.DeleteFunc(slices.Clone(w.iids), func(iid string) bool { _, ok := next.Live[iid]; return ok })}
		}
	}
	return next, write, v, nil
}

// gates reads the state of each instance's gate of ws ("" for one never written; "gone" for a
// delete marker), a bounded number at a time.
func (s *Set) gates(ctx context.Context, ws []*waiter) ([]string, error) {
	iids := make([]string, len(ws))
	for i, w := range ws {
		iids[i] = w.iids[0]
	}
	return s.gateStates(ctx, iids)
}

// learn tells each waiter of fresh what the write made of it: refused, or written (and, for a
// remove, which keys it took off: this replica no longer takes them to be live).
func (s *Set) learn(fresh []*waiter, verdicts map[*waiter]verdict) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, w := range fresh {
		v := verdicts[w]
		if v.refused != nil {
			w.refused = v.refused
			s.close(w)
			continue
		}
		w.written = true
		if w.op == opRemove || w.op == opWithdraw {
			w.iids = v.gone
			for _, iid := range v.gone {
				delete(s.live, iid)
				delete(s.settled, iid)
			}
		}
	}
}

// sameKeys reports whether a and b hold the same instances.
func sameKeys(a, b map[string]int64) bool {
	return maps.EqualFunc(a, b, func(int64, int64) bool { return true })
}

// release closes the waiters of ws whose change every server holds in held (with a JWT issued
// at issued or later), and reports whether it closed all of them.
func (r *rounds) release(ws []*waiter, held view, issued int64) bool {
	s := r.s
	s.mu.Lock()
	defer s.mu.Unlock()
	all := true
	for _, w := range ws {
		switch {
		case w.closed:
		case held.oldest >= issued && held.shows(s.Keys, w):
			w.confirmed = true
			if w.op == opAdd && w.registered { // a first registration's is live once it commits
				s.live[w.iids[0]], s.settled[w.iids[0]] = true, true
			}
			s.close(w)
		default:
			all = false
		}
	}
	if all {
		r.attempt = 0
	}
	return all
}

// note keeps err as what the waiters say if their deadline comes before a confirmation.
func (r *rounds) note(err error) {
	r.s.mu.Lock()
	r.s.lastErr = err
	r.s.mu.Unlock()
}

func (r *rounds) pause(ctx context.Context) {
	if store.Pause(ctx, r.attempt) == nil { // a deadline ends the round; run sees who is left
		r.attempt++
	}
}

// waitPast waits until the wall clock's second is after last.
func (s *Set) waitPast(ctx context.Context, last int64) error {
	d := time.Unix(last+1, 0).Sub(s.wall())
	if d <= 0 {
		return nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return fmt.Errorf("waiting to sign after the last account JWT (issued %d): %w", last, ctx.Err())
	case <-t.C:
		return nil
	}
}

// confirm reads the account back from every server until each holds a JWT issued at issued or
// later, and releases the waiters of ws whose change it shows; or until ctx ends.
func (r *rounds) confirm(ctx context.Context, ws []*waiter, issued int64) error {
	for attempt := 0; ; attempt++ {
		v, err := r.view(ctx)
		if err == nil && v.oldest >= issued {
			if !r.release(ws, v, issued) {
				r.last = max(r.last, v.newest)
				return errors.New("a server holds a later account JWT without every change")
			}
			return nil
		}
		if err == nil {
			err = errors.New("a server's resolver does not hold the account JWT yet")
		}
		if perr := store.Pause(ctx, attempt); perr != nil {
			return fmt.Errorf("the broker did not confirm the account JWT: %w", err)
		}
	}
}
