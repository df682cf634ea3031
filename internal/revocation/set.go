// Package revocation is the data account's revocation set: every user nkey an end revoked and
// when, kept in one fence row (`revocations.<account>` in the fence bucket) only while a
// credential it revokes can still be live, signed into the data account's JWT with the operator
// signing key and pushed to every server of the broker, then read back from each. Ends that run
// together share their work: one add of everyone's keys, one signing, one push and one
// confirmation cover every end waiting, so throughput is bounded by the broker and by one
// signing a second, not by one end a second.
//
// A push replaces the account JWT a server's resolver holds, whatever its issue time; servers
// that sync their resolvers (one that missed a push catching up) keep the newer of two JWTs by
// issue time, in whole seconds. So every signing reserves an issue time later than the last one
// in the row, by CAS on the row it signed: the newest JWT any replica pushes carries every key
// added before it, and it is the one the servers converge on. No CAS decides while it
// waits: the wait for the next second comes before the row is read for the reservation.
package revocation

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/cotal-ai/authplane/internal/fault"
	"github.com/cotal-ai/authplane/internal/fence"
	"github.com/cotal-ai/authplane/internal/ids"
	"github.com/cotal-ai/authplane/internal/space"
	"github.com/cotal-ai/authplane/internal/store"
	"github.com/cotal-ai/authplane/subjects"
)

// Skew is how far past the ending plane's own clock a key is revoked: credentials a replica
// with a clock that far ahead signed before the end froze the instance are revoked too. It is
// also how much later than that a key is forgotten, for a replica whose clock is behind.
const Skew = time.Minute

// LongestLife is the longest life of any credential whose key an end revokes: a standing
// credential at --standing-ttl's maximum. Every other is shorter (an executor's 5 minutes, a
// run credential's standing life clamped to its assignment, a callout user's bearer, at most
// 15 minutes). It is the bound whatever --standing-ttl says now: a plane restarted with a
// shorter one still has credentials of the longer life out.
const LongestLife = 24 * time.Hour

// Keep is how long past its revocation time a key stays on the set: the broker revokes a key's
// credentials issued at or before that time, none of them lives longer than LongestLife, and a
// replica's clock may be Skew behind. Past it the key revokes nothing still live.
const Keep = LongestLife + Skew

// PerKey bounds the bytes one revoked key adds to the signed account JWT: `"<56-character
// nkey>":<10-digit time>,` is 70 bytes of JSON, 94 once base64url-encoded.
const PerKey = 94

// Broker is the data account as the broker holds it, reached through the plane's system user:
// every server of a cluster answers.
type Broker interface {
	// Servers counts the cluster's servers.
	Servers(ctx context.Context) (int, error)
	// Push sends the account JWT token to every server's resolver.
	Push(ctx context.Context, token string) error
	// Lookup returns the account JWT each of the n servers' resolvers holds.
	Lookup(ctx context.Context, n int) ([]string, error)
	// Connections counts the account's connections authenticated as each of the user keys
	// nkeys on the n servers (a key with none may be absent).
	Connections(ctx context.Context, nkeys []string, n int) (map[string]int, error)
}

// Set is the data account's revocation set and the broker it is applied to. Its zero value is
// not usable; fill every field but Wall.
type Set struct {
	// Gates is the fence bucket the set lives in; Account the data account's public key.
	Gates   fence.KV
	Account string
	// Sign signs the data account's JWT (its limits, and revoked: nkey → unix seconds) with the
	// operator signing key and returns it with its issue time; space.ErrNoOperatorSigner when
	// the operator keeps the key elsewhere.
	Sign   Signer
	Broker Broker
	// Now is the clock of revocation times and of forgetting.
	Now func() time.Time
	// Wall is the clock the JWT library stamps issue times with (it reads time.Now, whatever
	// Now says): the next second is waited for on it. Nil means time.Now.
	Wall func() time.Time
	// Capacity is the most keys the set holds: the account JWT that carries them must fit in
	// one message of the broker (see Capacity).
	Capacity int

	mu      sync.Mutex
	waiting []*waiter
	running bool
	lastErr error // the last failure of a round: what a waiter whose deadline came says
	// state is the rounds' own, used by one run at a time (or by Reapply, before any).
	once  sync.Once
	state *rounds
}

// Signer signs the data account's JWT revoking revoked (nkey → unix seconds), and returns it
// with its issue time.
type Signer func(revoked map[string]int64) (token string, issuedAt int64, err error)

// Capacity is how many keys an account JWT signed by sign can carry within maxPayload bytes
// (the broker's largest message, which a push and a read-back both are), leaving a KiB for the
// envelope of a push or of a resolver's exchange.
func Capacity(sign Signer, maxPayload int64) (int, error) {
	empty, _, err := sign(map[string]int64{})
	if err != nil {
		return 0, err
	}
	room := maxPayload - int64(len(empty)) - 1024
	if room < PerKey {
		return 0, fmt.Errorf("an account JWT of %d bytes leaves no room for a revocation within the broker's %d-byte messages", len(empty), maxPayload)
	}
	return int(room / PerKey), nil
}

// row is the stored set.
type row struct {
	V        int              `json:"v"`
	Account  string           `json:"account"`
	Revoked  map[string]int64 `json:"revoked"`
	IssuedAt int64            `json:"issuedAt"`
	Nonce    string           `json:"nonce"`
}

func (s *Set) fence() *fence.Fence[row] {
	return fence.New(s.Gates, subjects.RevocationsKey(s.Account), func(data []byte) (row, error) {
		var r row
		if err := decodeRow(data, &r); err != nil {
			return row{}, err
		}
		if r.V != 1 || r.Account != s.Account || r.Revoked == nil {
			return row{}, errors.New("not a version 1 revocation set of this account")
		}
		return r, nil
	}, func(r *row) { r.Nonce = ids.Nonce() })
}

// decodeRow decodes a stored set: one JSON object of exactly its keys. It holds up to Capacity
// keys (about 11,000 under a 1 MiB broker message), so no request's size limit applies to it.
func decodeRow(data []byte, r *row) error {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(r); err != nil {
		return err
	}
	if _, err := dec.Token(); err != io.EOF {
		return errors.New("data after the set")
	}
	return nil
}

// Outcome is what revoking a list of keys came to.
type Outcome struct {
	// Confirmed are the keys of the list every server's resolver revokes, read back from each.
	Confirmed []string
	// Unrevoked are the others: the broker is not known to revoke them. Cause says why.
	Unrevoked []string
	// Reason says why some are unrevoked; "" when none is.
	Reason string
	// Cause is ErrFull when keys did not fit on the set (they are not on it), ErrNoSigner
	// when this plane cannot sign the account (the keys are on the set, for a plane that can),
	// and ErrUnconfirmed when the broker did not confirm them before the deadline (they are on
	// the set: every later push and every start applies it).
	Cause error
}

// Done says every key of the list is revoked at every server, read back.
func (o *Outcome) Done() bool { return len(o.Unrevoked) == 0 }

// Errors in an Outcome's Cause.
var (
	// ErrFull: keys did not fit on the set: its account JWT would pass the broker's largest
	// message.
	ErrFull = errors.New("the revocation set is full")
	// ErrNoSigner: this plane does not hold the operator signing key.
	ErrNoSigner = space.ErrNoOperatorSigner
	// ErrUnconfirmed: the broker did not confirm the keys before the deadline.
	ErrUnconfirmed = errors.New("the broker did not confirm the revocation before the deadline")
)

// waiter is one Revoke waiting for the round that covers its keys. Its fields after keys and
// deadline are the rounds', under Set.mu.
type waiter struct {
	keys     []string
	deadline time.Time

	added bool
	// want are the keys on the set, at their revocation times; full those that found no room.
	want      map[string]int64
	full      []string
	confirmed bool
	err       error // the keys may not be on the set
	cause     error // why they are not confirmed (ErrNoSigner), when final
	done      chan struct{}
	closed    bool
}

// Revoke puts keys on the set (each revoked at Now plus Skew; a key already there keeps its
// time) and returns once every server of the broker revokes them, read back, or ctx ends. Keys
// that find no room on the set are not put on it. An error means the keys may not be on the
// set (a store failure, or the deadline before they were added); otherwise the Outcome says
// which keys are confirmed and why the others are not. Revokes that run together are served by
// one round: one add, one signing, one push and one read-back for all of them.
func (s *Set) Revoke(ctx context.Context, keys []string) (*Outcome, error) {
	w := &waiter{keys: uniq(keys)}
	s.await(ctx, w)
	s.mu.Lock()
	defer s.mu.Unlock()
	if !w.added {
		err := w.err
		if err == nil {
			err = fault.Store(ctx.Err(), "adding to the revocation set of the data account")
		}
		return nil, err
	}
	out := &Outcome{Unrevoked: slices.Clone(w.full)}
	if len(w.full) > 0 {
		out.Cause = ErrFull
		out.Reason = fmt.Sprintf("%d of its keys found no room on the revocation set, which holds at most %d keys (its account JWT must fit in one broker message); they are not revoked, and their credentials expire at their clamp", len(w.full), s.Capacity)
	}
	for _, k := range slices.Sorted(maps.Keys(w.want)) {
		if w.confirmed {
			out.Confirmed = append(out.Confirmed, k)
		} else {
			out.Unrevoked = append(out.Unrevoked, k)
		}
	}
	slices.Sort(out.Unrevoked)
	if !w.confirmed && len(w.want) > 0 {
		switch {
		case w.cause != nil:
			out.Cause = w.cause
			out.Reason = w.cause.Error() + "; the broker keeps its account JWT, and the credentials expire at their clamp"
		default:
			out.Cause = ErrUnconfirmed
			out.Reason = ErrUnconfirmed.Error()
			if s.lastErr != nil {
				out.Reason += ": " + s.lastErr.Error()
			}
			out.Reason += "; the keys are on the set, which every later push and every start applies"
		}
	}
	return out, nil
}

// await queues w for the rounds, starting their run if none is under way, and returns once a
// round closed w or ctx ended (then w is closed); w's fields are read under s.mu.
func (s *Set) await(ctx context.Context, w *waiter) {
	w.done = make(chan struct{})
	w.deadline, _ = ctx.Deadline()
	if w.deadline.IsZero() {
		w.deadline = time.Now().Add(time.Minute)
	}
	s.mu.Lock()
	s.waiting = append(s.waiting, w)
	if !s.running {
		s.running = true
		go s.run()
	}
	s.mu.Unlock()
	select {
	case <-w.done:
	case <-ctx.Done():
	}
	s.mu.Lock()
	s.close(w)
	s.mu.Unlock()
}

func uniq(keys []string) []string {
	out := slices.Clone(keys)
	slices.Sort(out)
	return slices.Compact(out)
}

// close ends w's wait; it holds s.mu.
func (s *Set) close(w *waiter) {
	if !w.closed {
		w.closed = true
		close(w.done)
	}
}

// run serves rounds until no one waits. One runs at a time per Set, for every Revoke of the
// process: a round serves everyone waiting when it signs.
func (s *Set) run() {
	r := s.rounds()
	for {
		ws, deadline := s.open()
		if len(ws) == 0 {
			return
		}
		ctx, cancel := context.WithDeadline(context.Background(), deadline)
		r.serve(ctx)
		cancel()
	}
}

// rounds is the state the rounds keep from one run to the next (the issue time signed last,
// above all: a run that forgot it would try to sign again in the same second).
func (s *Set) rounds() *rounds {
	s.once.Do(func() { s.state = &rounds{s: s, reach: &reach{Broker: s.Broker}} })
	return s.state
}

// open returns the waiters still waiting and the latest of their deadlines, closing those
// whose deadline passed; with none left, the run ends (under the same lock as a Revoke that
// would start one).
func (s *Set) open() ([]*waiter, time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	open := s.waiting[:0]
	now := time.Now()
	var deadline time.Time
	for _, w := range s.waiting {
		if !w.closed && now.After(w.deadline) {
			s.close(w)
		}
		if !w.closed {
			open = append(open, w)
			if w.deadline.After(deadline) {
				deadline = w.deadline
			}
		}
	}
	clear(s.waiting[len(open):])
	s.waiting = open
	if len(open) == 0 {
		s.running = false
	}
	return slices.Clone(open), deadline
}

// rounds is the state of a Set's run across its rounds.
type rounds struct {
	s     *Set
	reach *reach
	// last is the newest issue time known to be signed (the row's or a server's): the next
	// signing must be later.
	last int64
	// force makes the next round sign even with no key to add: a push did not land, or the
	// broker does not revoke keys the set already holds.
	force   bool
	attempt int
	decoded []decoded // the account JWTs read back last
	// known is the set as this plane last wrote or read it.
	known *fence.Observed[row]
}

// errTooSoon: the wall clock is still in the second of the last signing.
var errTooSoon = errors.New("too soon to sign again")

// serve runs one round: wait out the second of the last signing, holding nothing, so everyone
// who arrives meanwhile joins; then one write adds everyone's keys and reserves the signing that
// carries them, and one push and one read-back confirm them all.
func (r *rounds) serve(ctx context.Context) {
	s := r.s
	if err := s.waitPast(ctx, r.last); err != nil {
		return // the deadline: run closes whoever waited
	}
	ws, _ := s.open()
	if len(ws) == 0 {
		return
	}
	o, token, err := s.addAndSign(ctx, ws, r.last, r.force, r.known)
	r.known = nil
	if err == nil || errors.Is(err, errTooSoon) {
		r.known = o
	}
	switch {
	case errors.Is(err, errTooSoon):
		r.last = max(r.last, o.Row.IssuedAt) // another replica signed in this second
		return
	case errors.Is(err, ErrNoSigner):
		s.mu.Lock()
		for _, w := range ws {
			if w.added {
				w.cause = ErrNoSigner
				s.close(w)
			}
		}
		s.mu.Unlock()
		return
	case err != nil:
		r.note(err)
		s.mu.Lock()
		for _, w := range ws {
			if !w.added { // the keys may not be on the set: the end is to be repeated
				w.err = fault.Store(err, "adding to the revocation set of the data account")
				s.close(w)
			}
		}
		s.mu.Unlock()
		r.pause(ctx)
		return
	}
	r.last = max(r.last, o.Row.IssuedAt)
	if token == "" {
		// Nothing to add: every key is on the set already (a repeated end). The broker may
		// revoke them already; those it does not get a signing of their own.
		held, err := r.view(ctx)
		if err != nil {
			r.note(err)
		}
		r.last = max(r.last, held.newest)
		if !r.release(ws, held, 0) {
			r.force = true
		}
		return
	}
	r.force = false
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

// release closes the waiters of ws whose keys every server revokes in held (with a JWT issued at
// issued or later), and reports whether it closed all of them.
func (r *rounds) release(ws []*waiter, held view, issued int64) bool {
	s := r.s
	s.mu.Lock()
	defer s.mu.Unlock()
	all := true
	for _, w := range ws {
		switch {
		case w.closed:
		case held.oldest >= issued && held.covers(w.want):
			w.confirmed = true
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

// addAndSign puts the keys of ws not yet added on the set, as many as find room, and signs the
// set that results with an issue time later than last and than the row's, reserving it in the
// same write: the JWT carries every key added before it. The decision signs but never waits;
// when the wall clock is still in the second of the newest signing it is errTooSoon (the row as
// seen comes back, for its issue time). With no key to add and no force, it writes nothing and
// returns no token. Each waiter learns which of its keys are on the set (want); the keys that
// found no room come back.
func (s *Set) addAndSign(ctx context.Context, ws []*waiter, last int64, force bool, known *fence.Observed[row]) (*fence.Observed[row], string, error) {
	var fresh []*waiter
	for _, w := range ws {
		if !w.added {
			fresh = append(fresh, w)
		}
	}
	var token string
	var full map[string]bool
	var seen *fence.Observed[row]
	decide := func(cur *fence.Observed[row]) (row, error) {
		seen, token = cur, ""
		next, left := s.withKeys(cur, fresh)
		full = left
		changed := cur.Absent() || len(next.Revoked) != len(cur.Row.Revoked) || !sameKeys(next.Revoked, cur.Row.Revoked)
		if !changed && !force {
			return row{}, fence.ErrKeep
		}
		after := max(last, cur.Row.IssuedAt)
		if len(next.Revoked) == 0 && len(cur.Row.Revoked) == 0 {
			after = 0 // a JWT that revokes nothing (a start's, with no end behind it) need not outrank any
		}
		t, issued, err := s.Sign(next.Revoked)
		if err != nil {
			return row{}, err
		}
		if issued <= after {
			return row{}, errTooSoon
		}
		next.IssuedAt, token = issued, t
		return next, nil
	}
	// The row as this plane last wrote or read it is tried first, at its revision: when no
	// other replica wrote since, that saves the read. A row that moved is read again.
	o, err := s.fence().UpdateFrom(ctx, known, decide)
	switch {
	case errors.Is(err, errTooSoon):
		return seen, "", err
	case errors.Is(err, ErrNoSigner):
		// The keys cannot be signed here, but they belong on the set, for a plane that can.
		if o, err = s.add(ctx, fresh); err != nil {
			return nil, "", err
		}
		return o, "", ErrNoSigner
	case err != nil:
		return nil, "", err
	}
	s.learn(o, fresh, full)
	return o, token, nil
}

// add puts the keys of fresh on the set without signing (a plane without the operator signing
// key), and returns the set as it then is.
func (s *Set) add(ctx context.Context, fresh []*waiter) (*fence.Observed[row], error) {
	var full map[string]bool
	o, err := s.fence().Update(ctx, func(cur *fence.Observed[row]) (row, error) {
		next, left := s.withKeys(cur, fresh)
		full = left
		if !cur.Absent() && len(next.Revoked) == len(cur.Row.Revoked) && sameKeys(next.Revoked, cur.Row.Revoked) {
			return row{}, fence.ErrKeep
		}
		return next, nil
	})
	if err != nil {
		return nil, err
	}
	s.learn(o, fresh, full)
	return o, nil
}

// learn tells each waiter of fresh which of its keys the set o holds (want) and which found no
// room (full).
func (s *Set) learn(o *fence.Observed[row], fresh []*waiter, full map[string]bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, w := range fresh {
		w.added, w.want, w.full = true, map[string]int64{}, nil
		for _, k := range w.keys {
			if at, ok := o.Row.Revoked[k]; ok && !full[k] {
				w.want[k] = at
			} else {
				w.full = append(w.full, k)
			}
		}
	}
}

// sameKeys reports whether every key of a is in b.
func sameKeys(a, b map[string]int64) bool {
	for k := range a {
		if _, ok := b[k]; !ok {
			return false
		}
	}
	return true
}

// withKeys is the set observed without the keys past Keep and with the keys of fresh added, in
// their order, while the set has room (each revoked at Now plus Skew; a key already there keeps
// its time). It returns the keys that found no room.
func (s *Set) withKeys(cur *fence.Observed[row], fresh []*waiter) (row, map[string]bool) {
	now := s.Now()
	next := row{V: 1, Account: s.Account, Revoked: map[string]int64{}, IssuedAt: cur.Row.IssuedAt}
	for k, at := range cur.Row.Revoked {
		if !Forgettable(at, now) {
			next.Revoked[k] = at
		}
	}
	full := map[string]bool{}
	at := now.Add(Skew).Unix()
	for _, w := range fresh {
		for _, k := range w.keys {
			if _, ok := next.Revoked[k]; ok {
				continue
			}
			if len(next.Revoked) >= s.Capacity {
				full[k] = true
				continue
			}
			next.Revoked[k] = at
		}
	}
	return next, full
}

// Forgettable reports whether a key revoked at the unix second at may leave the set at now:
// every credential it revokes has expired.
func Forgettable(at int64, now time.Time) bool {
	return !time.Unix(at, 0).Add(Keep).After(now)
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
// later, and releases the waiters of ws whose keys it revokes; or until ctx ends.
func (r *rounds) confirm(ctx context.Context, ws []*waiter, issued int64) error {
	for attempt := 0; ; attempt++ {
		v, err := r.view(ctx)
		if err == nil && v.oldest >= issued {
			if !r.release(ws, v, issued) {
				r.last = max(r.last, v.newest)
				return errors.New("a server holds a later account JWT that does not revoke every key")
			}
			return nil
		}
		if err == nil {
			err = errors.New("a server's resolver does not hold the revocations yet")
		}
		if perr := store.Pause(ctx, attempt); perr != nil {
			return fmt.Errorf("the broker did not confirm the revocation: %w", err)
		}
	}
}

// Reapply signs and pushes the whole set whatever the broker holds (a start, whose account
// limits may have changed since the last JWT), and reads it back from every server. Without the
// operator signing key it returns ErrNoSigner.
func (s *Set) Reapply(ctx context.Context) error {
	r := s.rounds()
	for {
		if err := s.waitPast(ctx, r.last); err != nil {
			return err
		}
		o, token, err := s.addAndSign(ctx, nil, r.last, true, nil)
		switch {
		case errors.Is(err, errTooSoon):
			r.last = max(r.last, o.Row.IssuedAt)
			continue
		case err != nil:
			return err
		}
		if err := s.Broker.Push(ctx, token); err != nil {
			return fmt.Errorf("the broker did not take the account JWT: %w", err)
		}
		w := &waiter{added: true, want: o.Row.Revoked, done: make(chan struct{})}
		err = r.confirm(ctx, []*waiter{w}, o.Row.IssuedAt)
		if err == nil {
			return nil
		}
		if ctx.Err() != nil {
			return err
		}
		// A server holds a later JWT that does not revoke all of them: sign again, later.
	}
}

// Recheck reads the set and what every server's resolver holds, and when a server does not
// revoke every key on the set, has a round sign and push the whole set again and waits for it to
// be read back, reporting that it did. That undoes what a push of an older account JWT did: one
// from something else that pushes the data account (nsc, a tool on the side), or one of a
// replica that reached a server after a later one (a push replaces what a server holds,
// whatever its issue time). Revokes that come meanwhile join that round, as they join any. A
// set whose last signing is younger than RecheckGrace is left to the round that made it, which
// reads it back itself.
func (s *Set) Recheck(ctx context.Context) (reapplied bool, err error) {
	cur, err := s.fence().Observe(ctx)
	if err != nil {
		return false, fmt.Errorf("read the revocation set: %w", err)
	}
	// A key past Keep need not be revoked any more, and the next signing drops it.
	want := maps.Clone(cur.Row.Revoked)
	now := s.Now()
	maps.DeleteFunc(want, func(_ string, at int64) bool { return Forgettable(at, now) })
	if len(want) == 0 || s.wall().Sub(time.Unix(cur.Row.IssuedAt, 0)) < RecheckGrace {
		return false, nil
	}
	// A reading of its own: the rounds' state is their run's.
	held, err := (&rounds{s: s, reach: &reach{Broker: s.Broker}}).view(ctx)
	if err != nil {
		return false, err
	}
	if held.covers(want) {
		return false, nil
	}
	// Its keys are on the set: the round reads the broker back, and signs and pushes the set
	// again when the broker does not revoke them all (as for an end repeated).
	w := &waiter{added: true, want: want}
	s.await(ctx, w)
	s.mu.Lock()
	defer s.mu.Unlock()
	if !w.confirmed {
		cause := s.lastErr
		if cause == nil {
			cause = ErrUnconfirmed
		}
		return true, fmt.Errorf("signed the set again, but the broker did not confirm it: %w", cause)
	}
	return true, nil
}

// RecheckGrace is how old the set's last signing must be before Recheck signs it again: its own
// round is reading it back until then.
const RecheckGrace = 10 * time.Second

// wall is the clock the JWT library stamps issue times with.
func (s *Set) wall() time.Time {
	if s.Wall == nil {
		return time.Now()
	}
	return s.Wall()
}

// Held reports how many keys the set holds and the size of the account JWT the broker's first
// server holds: what the bench shows of the ceiling.
func (s *Set) Held(ctx context.Context) (keys, jwtBytes int, err error) {
	cur, err := s.fence().Observe(ctx)
	if err != nil {
		return 0, 0, err
	}
	tokens, err := (&reach{Broker: s.Broker}).lookup(ctx)
	if err != nil {
		return len(cur.Row.Revoked), 0, err
	}
	return len(cur.Row.Revoked), len(tokens[0]), nil
}
