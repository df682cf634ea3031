package signers

import (
	"context"
	"slices"
	"sync"
	"time"

	"github.com/cotal-ai/authplane/internal/core/store"
	"github.com/cotal-ai/authplane/internal/platform/broker"
)

// evictions are the Evicts under way in this process. One listing of the account at a time
// serves every one of them, however many ends wait (as one round of the set serves every change
// waiting): each end listing the account on its own had the broker answer as many listings at
// once as ends were under way, and under load they timed out and were asked again, so one
// owner's ends made another's wait for their listings (docs/decisions/2026-12-04-one-listing-for-every-end.md).
// Their runner, ServeEvictions, is one goroutine of the plane's, from its start to its close:
// Evict wakes it, and after it stops an Evict returns at once.
type evictions struct {
	mu      sync.Mutex
	waiting []*evictee
	wake    chan struct{}
	stopped bool
}

// wakeup is the channel that wakes the runner; it holds e.mu.
func (e *evictions) wakeup() chan struct{} {
	if e.wake == nil {
		e.wake = make(chan struct{}, 1)
	}
	return e.wake
}

// evictee is one Evict waiting: its keys, those the last listing found, and whether a listing
// found none of them, so the next one that agrees confirms it.
type evictee struct {
	want, held map[string]bool
	confirming bool
	confirmed  bool
	deadline   time.Time
	done       chan struct{}
	closed     bool
}

// Evict waits until the broker lists no connection authenticated with any of keys, kicking
// each one it lists (a client whose authentication was under way as its key left the account
// JWT got in after the broker closed the others), or until ctx ends, and returns how many of
// keys it found with none left. Each listing lists the account; once one finds none left, a
// second listing must agree. (A listing is paged per server, and connections that close between
// two pages move later ones past the next page's start: one listing can miss a connection.)
// The listings are shared: one at a time serves every Evict waiting when it began, on the
// goroutine of ServeEvictions; without one running (the plane closed), Evict finds none gone.
func (s *Set) Evict(ctx context.Context, keys []string) int {
	w := &evictee{want: map[string]bool{}, done: make(chan struct{})}
	for _, k := range keys {
		w.want[k] = true
	}
	w.held = w.want
	w.deadline, _ = ctx.Deadline()
	if w.deadline.IsZero() {
		w.deadline = time.Now().Add(time.Minute)
	}
	e := &s.evicts
	e.mu.Lock()
	if e.stopped {
		e.mu.Unlock()
		return 0
	}
	e.waiting = append(e.waiting, w)
	select {
	case e.wakeup() <- struct{}{}:
	default: // the runner is woken already
	}
	e.mu.Unlock()
	select {
	case <-w.done:
	case <-ctx.Done():
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	e.close(w)
	if w.confirmed {
		return len(keys)
	}
	return len(keys) - len(w.held)
}

// close ends w's wait; it holds e.mu.
func (e *evictions) close(w *evictee) {
	if !w.closed {
		w.closed = true
		close(w.done)
	}
}

// open returns the Evicts still waiting and the latest of their deadlines, closing those whose
// deadline passed.
func (e *evictions) open() ([]*evictee, time.Time) {
	e.mu.Lock()
	defer e.mu.Unlock()
	now := time.Now()
	var deadline time.Time
	e.waiting = slices.DeleteFunc(e.waiting, func(w *evictee) bool {
		if now.After(w.deadline) {
			e.close(w)
		}
		if w.closed {
			return true
		}
		if w.deadline.After(deadline) {
			deadline = w.deadline
		}
		return false
	})
	return slices.Clone(e.waiting), deadline
}

// ServeEvictions runs the listings of every Evict until ctx ends (the plane closes), and then
// ends the waits of those under way, which find none gone that a listing had not found gone.
func (s *Set) ServeEvictions(ctx context.Context) {
	e := &s.evicts
	e.mu.Lock()
	wake := e.wakeup()
	e.mu.Unlock()
	defer func() {
		e.mu.Lock()
		defer e.mu.Unlock()
		e.stopped = true
		for _, w := range e.waiting {
			e.close(w)
		}
		e.waiting = nil
	}()
	for {
		select {
		case <-ctx.Done():
			return
		case <-wake:
			s.listForEvicts(ctx)
		}
	}
}

// listForEvicts lists the account until no Evict waits or life ends: each listing kicks every
// connection of a key any Evict waiting when it began wants. A listing that finds none of an
// Evict's keys is followed at once by the next; one that fails, or finds a connection still
// there, by a pause.
func (s *Set) listForEvicts(life context.Context) {
	e := &s.evicts
	b := &reach{Broker: s.Broker} // the servers counted once a run, again after a failed listing
	attempt := 0
	for life.Err() == nil {
		ws, deadline := e.open()
		if len(ws) == 0 {
			return
		}
		want := map[string]bool{}
		for _, w := range ws {
			for k := range w.want {
				want[k] = true
			}
		}
		ctx, cancel := context.WithDeadline(life, deadline)
		found, _, err := s.kick(ctx, b, func(c broker.Connection) bool { return want[c.User] })
		clean := err == nil
		e.mu.Lock()
		for _, w := range ws {
			if err != nil || w.closed {
				continue
			}
			mine := map[string]bool{}
			for k := range w.want {
				if found[k] {
					mine[k] = true
				}
			}
			switch {
			case len(mine) > 0:
				w.held, w.confirming, clean = mine, false, false
			case w.confirming:
				w.confirmed = true
				e.close(w)
			default:
				w.held, w.confirming = mine, true
			}
		}
		e.mu.Unlock()
		if clean {
			attempt = 0 // the second listing at once
		} else {
			_ = store.Pause(ctx, attempt) // a deadline that passes is open's to close
			attempt++
		}
		cancel()
	}
}
