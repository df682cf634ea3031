package fence

import (
	"bytes"
	"context"
	"fmt"
	"slices"
	"sync"
	"time"
)

// Grouped is a bucket whose commits group: concurrent commits on one key of observations with
// the same bytes share one CAS (group commit), instead of each losing to the others and
// retrying with back-off. Every other verb is the bucket's own.
//
// Why one CAS commits them all: a commit proves that no fence writer changed the row between
// its observation and the commit. Every member of a group observed the same bytes, at its own
// revision, and the group's CAS is pinned to the latest of those revisions (or to the revision
// this process last committed those bytes at, if later). Fence writers give every write fresh
// bytes (a nonce), so a row never returns to bytes it once had: bytes seen unchanged at two
// revisions prove that no fence write landed between them. So the CAS landing proves, for every
// member, that no fence write landed from its observation to the commit; and a fence write that
// landed first makes the CAS fail, the re-read find other bytes, and every member ErrMoved. A
// member joins a group only once its mint is recorded, and a group's membership closes before
// its CAS is sent: nothing commits after a fence that forbids it, and no nkey commits before it
// is on record. Commits that arrive while a CAS is in flight form the next group, which needs
// no read: the CAS that just landed says the row's revision.
//
// A fence write (Observed.Write: a registration, a freeze) on a key goes through the same queue,
// ahead of every waiting commit, and alone: commits that landed one group after another would
// otherwise move the row's revision under it at every attempt, and a re-registration racing a
// steady stream of renewals lost its CAS until its deadline. Once it lands, the commits that
// waited find other bytes and are refused, as the fence says.
type Grouped struct {
	KV
	mu     sync.Mutex
	queues map[string]*queue
}

// Retried tells the grouped bucket, if it counts, of a retried write.
func (g *Grouped) Retried() {
	if c, ok := g.KV.(RetryCounter); ok {
		c.Retried()
	}
}

// Sole says whether the grouped bucket's reads cannot be stale: then its commits are reads
// and never reach the groups.
func (g *Grouped) Sole() bool { return isSole(g.KV) }

// Group returns kv with its commits grouped.
func Group(kv KV) *Grouped { return &Grouped{KV: kv, queues: map[string]*queue{}} }

// queue is one key's commits: those waiting for the next CAS while a group is committing. It
// exists while a group is committing on the key, no longer.
type queue struct {
	waiting []*waiter
	// lastRaw and lastRev are the bytes and revision of the last CAS that landed here.
	lastRaw []byte
	lastRev uint64
}

// waiter is one commit: the observation it commits, when its request ends, how to commit
// (any member's way serves the group: they commit the same bytes), and where the outcome goes.
type waiter struct {
	// write, when set, is a fence write that runs alone (exclusive); the rest is a commit's.
	write    func()
	raw      []byte
	rev      uint64
	deadline time.Time
	cas      func(ctx context.Context, rev uint64) (uint64, error)
	done     chan outcome
}

type outcome struct {
	rev uint64
	err error
}

// commit commits raw observed at rev on key with the next group of the same bytes, and returns
// the revision the group's CAS landed at. cas is the one CAS loop, pinned to the revision it is
// given. A commit on a key where nothing is committing sends its CAS at once, on its own
// goroutine, in a group of one; commits that arrive meanwhile wait for the next group. A
// commit whose ctx ends before its group is sent is withdrawn (nothing was written for it);
// one whose group is in flight does not know its outcome: ErrUnknownOutcome.
func (g *Grouped) commit(ctx context.Context, key string, raw []byte, rev uint64, cas func(context.Context, uint64) (uint64, error)) (uint64, error) {
	g.mu.Lock()
	q := g.queues[key]
	if q == nil {
		q = &queue{}
		g.queues[key] = q
		g.mu.Unlock()
		n, err := cas(ctx, rev)
		g.landed(key, q, raw, n, err)
		return n, err
	}
	w := &waiter{raw: raw, rev: rev, deadline: deadlineOf(ctx), cas: cas, done: make(chan outcome, 1)}
	q.waiting = append(q.waiting, w)
	g.mu.Unlock()
	select {
	case o := <-w.done:
		return o.rev, o.err
	case <-ctx.Done():
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if i := slices.Index(q.waiting, w); i >= 0 {
		q.waiting = slices.Delete(q.waiting, i, i+1)
		return 0, fmt.Errorf("commit %s: withdrawn before it was sent: %w", key, ctx.Err())
	}
	select {
	case o := <-w.done: // it was answered as the request ended
		return o.rev, o.err
	default:
	}
	return 0, fmt.Errorf("commit %s: %w: the request ended while its group was committing: %w", key, ErrUnknownOutcome, ctx.Err())
}

// landed records a group's CAS on key: its bytes and revision if it landed. Then, if commits
// wait, a goroutine commits them; if none does, the key is forgotten.
func (g *Grouped) landed(key string, q *queue, raw []byte, n uint64, err error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if err == nil {
		q.lastRaw, q.lastRev = raw, n
	}
	if len(q.waiting) == 0 {
		delete(g.queues, key)
		return
	}
	go g.drain(key, q)
}

// exclusive runs write, a fence write on key, alone among the key's commits and writes, ahead of
// every commit waiting there. It returns ctx's error, having run nothing, when ctx ends first.
func (g *Grouped) exclusive(ctx context.Context, key string, write func()) error {
	g.mu.Lock()
	q := g.queues[key]
	if q == nil {
		q = &queue{}
		g.queues[key] = q
		g.mu.Unlock()
		write()
		g.landed(key, q, nil, 0, nil)
		return nil
	}
	w := &waiter{write: write, done: make(chan outcome, 1)}
	at := 0
	for at < len(q.waiting) && q.waiting[at].write != nil {
		at++ // writes keep their order among themselves
	}
	q.waiting = slices.Insert(q.waiting, at, w)
	g.mu.Unlock()
	select {
	case <-w.done:
		return nil
	case <-ctx.Done():
	}
	g.mu.Lock()
	if i := slices.Index(q.waiting, w); i >= 0 {
		q.waiting = slices.Delete(q.waiting, i, i+1)
		g.mu.Unlock()
		return ctx.Err()
	}
	g.mu.Unlock()
	<-w.done // it is running: write ends with ctx
	return nil
}

// drain commits key's waiting commits, one group after another, until none waits; then it
// forgets the key. Each group is every waiting commit of the first one's bytes; its CAS runs
// until the latest deadline among them.
func (g *Grouped) drain(key string, q *queue) {
	for {
		g.mu.Lock()
		if len(q.waiting) == 0 {
			delete(g.queues, key)
			g.mu.Unlock()
			return
		}
		if first := q.waiting[0]; first.write != nil {
			q.waiting = q.waiting[1:]
			q.lastRaw, q.lastRev = nil, 0 // the row's bytes change
			g.mu.Unlock()
			first.write()
			first.done <- outcome{}
			continue
		}
		raw := q.waiting[0].raw
		var group, rest []*waiter
		for _, w := range q.waiting {
			if w.write == nil && bytes.Equal(w.raw, raw) {
				group = append(group, w)
			} else {
				rest = append(rest, w)
			}
		}
		q.waiting = rest
		rev, deadline := uint64(0), time.Time{}
		if bytes.Equal(q.lastRaw, raw) {
			rev = q.lastRev
		}
		for _, w := range group {
			rev = max(rev, w.rev)
			if w.deadline.After(deadline) {
				deadline = w.deadline
			}
		}
		g.mu.Unlock()

		ctx, cancel := context.WithDeadline(context.Background(), deadline)
		n, err := group[0].cas(ctx, rev)
		cancel()
		if err == nil {
			g.mu.Lock()
			q.lastRaw, q.lastRev = raw, n
			g.mu.Unlock()
		}
		for _, w := range group {
			w.done <- outcome{n, err}
		}
	}
}
