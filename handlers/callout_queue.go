package handlers

import (
	"log/slog"
	"sync"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/cotal-ai/authplane/internal/core/fault"
)

// calloutRequest is a request and when it came.
type calloutRequest struct {
	m  *nats.Msg
	at time.Time
}

// calloutQueue decides requests, at most inFlight at once (fewer while decisions are slow, see
// below): each on a goroutine that goes on to a waiting request when it is done and ends when
// none waits. A request waits in a backlog of at most backlog (a full one lets go of its
// oldest); one that waited past CalloutQueueWait is dropped unanswered.
//
// The backlog is taken oldest first while it drains promptly, and newest first once its oldest
// request has waited CalloutCongested (adaptive LIFO): in a reconnect storm the broker gives
// each connection two seconds, so oldest first spends the callout on requests about to time
// out (their store reads then miss the decision's deadline, and the answer is a refusal that
// cost a whole decision), and every connection of a wave fails together. Newest first, a
// decision starts with most of its time ahead, and the requests it leaves behind are dropped
// unanswered without costing anything.
//
// How many decide at once follows how long decisions take: a decision that took CalloutSlow
// halves the bound, down to CalloutMinInFlight (at most once per CalloutSlow: the decisions of
// one slow spell end together), and one under half of it raises the bound by one, up to
// inFlight, and starts a worker for a waiting request (so the bound about doubles with each
// round of quick decisions, as TCP's slow start does). A decision waits on store reads, and the
// broker serves those in arrival order: too many decisions at once in a storm on a cluster make
// every read miss the decisions' deadline, so nearly every answer is a refusal. A bound that
// stays low would cost the storms the stores keep up with, so it rises again as decisions speed
// up (docs/decisions/2026-12-02-callout-bound-follows-decisions.md).
type calloutQueue struct {
	inFlight, backlog int
	now               func() time.Time
	serve             func(calloutRequest)
	log               *slog.Logger

	mu      sync.Mutex
	busy    int              // workers deciding
	limit   int              // how many may decide at once now: CalloutMinInFlight to inFlight
	cut     time.Time        // when limit was last halved
	waiting []calloutRequest // oldest first
	refused uint64           // requests dropped for a full backlog in this storm
	cuts    uint64           // halvings of limit in this storm
}

func newCalloutQueue(inFlight, backlog int, now func() time.Time, serve func(calloutRequest), log *slog.Logger) *calloutQueue {
	return &calloutQueue{inFlight: inFlight, limit: inFlight, backlog: backlog, now: now, serve: serve, log: log}
}

// take hands r to a free worker, or queues it. A full backlog first lets go of the requests
// that waited past CalloutQueueWait, then of the oldest: a new request has the most time ahead.
func (q *calloutQueue) take(r calloutRequest) {
	q.mu.Lock()
	if q.busy < q.limit {
		q.busy++
		q.mu.Unlock()
		go q.work(r)
		return
	}
	var n uint64
	if len(q.waiting) >= q.backlog {
		if q.trim(q.now()) == 0 && len(q.waiting) > 0 {
			q.waiting[0] = calloutRequest{}
			q.waiting = q.waiting[1:]
			q.refused++
			n = q.refused
		}
	}
	if len(q.waiting) < q.backlog {
		q.waiting = append(q.waiting, r)
	}
	q.mu.Unlock()
	if fault.Sparse(n) { // the 1st, 2nd, 4th, 8th… of a storm
		q.log.Warn("auth callout busy; the oldest waiting connection attempt is left to time out", "in_flight", q.inFlight, "waiting", q.backlog, "dropped", n)
	}
}

// trim lets go of the waiting requests that waited past CalloutQueueWait at now (the oldest
// come first), and returns how many; it holds q.mu.
func (q *calloutQueue) trim(now time.Time) int {
	stale := 0
	for stale < len(q.waiting) && now.Sub(q.waiting[stale].at) > CalloutQueueWait {
		stale++
	}
	if stale > 0 {
		clear(q.waiting[:stale])
		q.waiting = q.waiting[stale:]
		q.log.Debug("auth callout: requests that waited past the broker's patience dropped", "dropped", stale)
	}
	return stale
}

// work decides r and then every request it is handed next, but for one that waited past
// CalloutQueueWait.
func (q *calloutQueue) work(r calloutRequest) {
	for ok := true; ok; r, ok = q.next() {
		start := q.now()
		if start.Sub(r.at) > CalloutQueueWait {
			continue
		}
		q.serve(r)
		q.took(q.now().Sub(start))
	}
}

// took adjusts how many may decide at once by how long a decision took (see calloutQueue).
func (q *calloutQueue) took(d time.Duration) {
	q.mu.Lock()
	var cut uint64
	var started *calloutRequest
	now := q.now()
	switch {
	case d >= CalloutSlow && q.limit > CalloutMinInFlight && now.Sub(q.cut) >= CalloutSlow:
		q.limit = max(CalloutMinInFlight, q.limit/2)
		q.cut = now
		q.cuts++
		cut = q.cuts
	case d < CalloutSlow/2 && q.limit < q.inFlight:
		q.limit++
		if q.busy < q.limit {
			q.trim(now)
			if len(q.waiting) > 0 {
				r := q.pick(now)
				q.busy++
				started = &r
			}
		}
	}
	limit := q.limit
	q.mu.Unlock()
	if started != nil {
		go q.work(*started)
	}
	if fault.Sparse(cut) {
		q.log.Warn("auth callout: decisions are slow (the stores are congested); deciding fewer at once", "took", d, "in_flight", limit)
	}
}

// next hands a worker the request to decide next (see calloutQueue), dropping those that
// waited past CalloutQueueWait, or gives its slot up and reports false when none waits.
func (q *calloutQueue) next() (calloutRequest, bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	now := q.now()
	q.trim(now)
	if len(q.waiting) == 0 || q.busy > q.limit {
		q.busy--
		if len(q.waiting) == 0 {
			q.waiting = nil
			q.refused, q.cuts = 0, 0 // the storm is over: the next one's are logged from the first
		}
		return calloutRequest{}, false
	}
	return q.pick(now), true
}

// pick takes the request to decide next off the backlog, which holds one: the oldest, or the
// newest once the oldest has waited CalloutCongested. It holds q.mu.
func (q *calloutQueue) pick(now time.Time) calloutRequest {
	var r calloutRequest
	if last := len(q.waiting) - 1; now.Sub(q.waiting[0].at) >= CalloutCongested {
		r, q.waiting[last] = q.waiting[last], calloutRequest{}
		q.waiting = q.waiting[:last]
	} else {
		r, q.waiting[0] = q.waiting[0], calloutRequest{}
		q.waiting = q.waiting[1:]
	}
	return r
}
