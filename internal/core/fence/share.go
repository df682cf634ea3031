package fence

import (
	"bytes"
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/cotal-ai/authplane/internal/core/store"
)

// Shared is a bucket whose reads share: a Get of a key while a get of that key is in flight
// waits for the next one, sent as soon as the one in flight is answered, and every Get that
// came meanwhile shares its answer. Every other verb is the bucket's own.
//
// Why a shared answer is as fresh as a Get's own: a Get never joins a get already sent, only
// the next, which is sent after it came. So what it returns is the leader's row at a moment
// after the Get began, as its own get's would be: a write acknowledged before the Get began is
// in it, and a fence that stopped something before a decision began stops that decision. What
// sharing saves is gets: however many decisions read a key at once, at most two gets of it are
// under way (the one in flight and the next), instead of one per decision queued behind
// everyone else's in the broker's JetStream API (a reconnect storm's callout decisions all read
// the one bearer key set).
type Shared struct {
	KV
	mu sync.Mutex
	// reads holds a key while a get of it is in flight; its value is the next get, which the
	// Gets that came since wait for (nil until one does).
	reads map[string]*read
}

// Sole says whether the shared bucket's reads cannot be stale.
func (s *Shared) Sole() bool { return isSole(s.KV) }

// Share returns kv with its reads shared.
func Share(kv KV) *Shared { return &Shared{KV: kv, reads: map[string]*read{}} }

// read is one get that Gets share: sent with the latest deadline among them, its answer kept
// in entry and err once done is closed.
type read struct {
	deadline time.Time
	waiting  int // Gets still waiting for it; one that gave up no longer counts
	done     chan struct{}
	entry    store.Entry
	err      error
}

// Get reads key as the bucket's own Get does, sharing a get with the Gets of key that came
// while the last one was in flight. A Get whose ctx ends before its answer came gets
// store.ErrUnknownOutcome, as a get of its own that timed out would.
func (s *Shared) Get(ctx context.Context, key string) (store.Entry, error) {
	s.mu.Lock()
	r, inFlight := s.reads[key]
	if !inFlight { // this Get's own get is the one in flight
		s.reads[key] = nil
		s.mu.Unlock()
		e, err := s.KV.Get(ctx, key)
		s.answered(key)
		return e, err
	}
	if r == nil {
		r = &read{done: make(chan struct{})}
		s.reads[key] = r
	}
	if deadline := deadlineOf(ctx); deadline.After(r.deadline) {
		r.deadline = deadline
	}
	r.waiting++
	s.mu.Unlock()
	select {
	case <-r.done:
		return store.Entry{Value: bytes.Clone(r.entry.Value), Revision: r.entry.Revision}, r.err
	case <-ctx.Done():
	}
	s.mu.Lock()
	r.waiting--
	s.mu.Unlock()
	return store.Entry{}, fmt.Errorf("read %s: %w: the request ended waiting for a shared read: %w", key, store.ErrUnknownOutcome, ctx.Err())
}

// answered ends the get in flight on key: the next one, if a Get still waits for it, is sent
// on its own goroutine (and Gets that come now wait for the one after it); if none waits, the
// key is forgotten.
func (s *Shared) answered(key string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	r := s.reads[key]
	if r == nil || r.waiting == 0 {
		delete(s.reads, key)
		if r != nil {
			close(r.done) // nobody waits; closed so that nothing could
		}
		return
	}
	s.reads[key] = nil
	go s.send(key, r)
}

// send sends r, the get its Gets wait for; its membership closed when answered took it off
// the key.
func (s *Shared) send(key string, r *read) {
	s.mu.Lock()
	deadline := r.deadline
	s.mu.Unlock()
	ctx, cancel := context.WithDeadline(context.Background(), deadline)
	r.entry, r.err = s.KV.Get(ctx, key)
	cancel()
	close(r.done)
	s.answered(key)
}

// deadlineOf is ctx's deadline, or a minute from now for a ctx without one: how long a shared
// get or a group's CAS may run for a waiter.
func deadlineOf(ctx context.Context) time.Time {
	if deadline, ok := ctx.Deadline(); ok {
		return deadline
	}
	return time.Now().Add(time.Minute)
}
