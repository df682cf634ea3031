package fence

import (
	"bytes"
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/cotal-ai/authplane/internal/store"
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
// under way (the one in flight and the next), where each decision used to queue its own
// behind everyone else's in the broker's JetStream API (a reconnect storm's callout decisions
// all read the one bearer key set).
type Shared struct {
	KV
	mu    sync.Mutex
	reads map[string]*reads
}

// Share returns kv with its reads shared.
func Share(kv KV) *Shared { return &Shared{KV: kv, reads: map[string]*reads{}} }

// reads is one key's gets: one is in flight while it exists, and next, when set, is the get
// that the Gets that came since wait for.
type reads struct {
	next *read
}

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
	k := s.reads[key]
	if k == nil { // nothing in flight: this Get's own get is the one
		k = &reads{}
		s.reads[key] = k
		s.mu.Unlock()
		e, err := s.KV.Get(ctx, key)
		s.answered(key, k)
		return e, err
	}
	r := k.next
	if r == nil {
		r = &read{done: make(chan struct{})}
		k.next = r
	}
	deadline, ok := ctx.Deadline()
	if !ok {
		deadline = time.Now().Add(time.Minute)
	}
	if deadline.After(r.deadline) {
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
// on its own goroutine; if none waits, the key is forgotten.
func (s *Shared) answered(key string, k *reads) {
	s.mu.Lock()
	defer s.mu.Unlock()
	r := k.next
	k.next = nil
	if r == nil || r.waiting == 0 {
		delete(s.reads, key)
		if r != nil {
			close(r.done) // nobody waits; closed so that nothing could
		}
		return
	}
	go s.send(key, k, r)
}

// send sends r, the get its Gets wait for; its membership closed when it was taken off next.
func (s *Shared) send(key string, k *reads, r *read) {
	s.mu.Lock()
	deadline := r.deadline
	s.mu.Unlock()
	ctx, cancel := context.WithDeadline(context.Background(), deadline)
	r.entry, r.err = s.KV.Get(ctx, key)
	cancel()
	close(r.done)
	s.answered(key, k)
}
