package handlers

import (
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/cotal-ai/authplane/internal/testkit"
)

// queueProbe is a calloutQueue whose decisions record the request they were handed and block
// until the test releases them.
type queueProbe struct {
	q       *calloutQueue
	release chan struct{}
	mu      sync.Mutex
	started []string
	served  []string
}

// newQueueProbe is a probe whose queue reads the time from now.
func newQueueProbe(inFlight, backlog int, now func() time.Time) *queueProbe {
	p := &queueProbe{release: make(chan struct{})}
	p.q = newCalloutQueue(inFlight, backlog, now, func(r calloutRequest) {
		p.record(&p.started, r.m.Subject)
		<-p.release
		p.record(&p.served, r.m.Subject)
	}, slog.New(slog.DiscardHandler))
	return p
}

func (p *queueProbe) record(into *[]string, s string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	*into = append(*into, s)
}

// snapshot returns copies of what was started and served.
func (p *queueProbe) snapshot() (started, served []string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Clone(p.started), slices.Clone(p.served)
}

func request(name string, at time.Time) calloutRequest {
	return calloutRequest{m: &nats.Msg{Subject: name}, at: at}
}

// waitUntil polls cond every 5 ms for up to 10 s.
func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	testkit.CheckFor(t, 10*time.Second, 5*time.Millisecond, func() error {
		if !cond() {
			return fmt.Errorf("not yet: %s", what)
		}
		return nil
	})
}

// stopped is a clock that stands at t.
func stopped(t time.Time) func() time.Time { return func() time.Time { return t } }

// A storm asks faster than the callout decides: a request that finds every slot busy waits its
// turn, oldest first while none has waited CalloutCongested, instead of being dropped (the
// broker would refuse that connection), and every worker ends once nothing waits.
func TestCalloutQueueDecidesEveryRequestPastItsSlotsInArrivalOrder(t *testing.T) {
	t.Parallel()
	now := time.Now()
	p := newQueueProbe(1, 8, stopped(now))
	var want []string
	for i := range 6 {
		name := strconv.Itoa(i)
		want = append(want, name)
		p.q.take(request(name, now))
	}
	waitUntil(t, "the first request is being decided", func() bool { s, _ := p.snapshot(); return len(s) == 1 })
	close(p.release)
	waitUntil(t, "every request is decided", func() bool { _, s := p.snapshot(); return len(s) == len(want) })
	if _, served := p.snapshot(); !slices.Equal(served, want) {
		t.Fatalf("decided %v, want %v (arrival order)", served, want)
	}
	waitUntil(t, "the worker gives its slot up", p.q.idle)
}

// Once the oldest waiting request has waited CalloutCongested, the newest is decided first:
// the broker gives each connection two seconds, and the newest has most of them ahead. The
// backlog is still decided whole.
func TestCalloutQueueDecidesNewestFirstOnceTheBacklogIsCongested(t *testing.T) {
	t.Parallel()
	now := time.Now()
	p := newQueueProbe(1, 8, stopped(now))
	p.q.take(request("deciding", now))
	waitUntil(t, "the first request is being decided", func() bool { s, _ := p.snapshot(); return len(s) == 1 })
	for i, waited := range []time.Duration{CalloutCongested, CalloutCongested / 2, 0} {
		p.q.take(request(strconv.Itoa(i), now.Add(-waited)))
	}
	close(p.release)
	waitUntil(t, "every request is decided", func() bool { _, s := p.snapshot(); return len(s) == 4 })
	if _, served := p.snapshot(); !slices.Equal(served, []string{"deciding", "2", "1", "0"}) {
		t.Fatalf("decided %v, want the newest first once the oldest waited %s", served, CalloutCongested)
	}
	waitUntil(t, "the worker gives its slot up", p.q.idle)
}

// A request that waited past CalloutQueueWait is not decided (the broker has given up on it);
// one behind it that has not waited so long is.
func TestCalloutQueueDropsARequestThatWaitedPastTheBrokersPatience(t *testing.T) {
	t.Parallel()
	now := time.Now()
	p := newQueueProbe(1, 8, stopped(now))
	close(p.release)
	p.q.take(request("stale", now.Add(-CalloutQueueWait-time.Millisecond)))
	p.q.take(request("fresh", now))
	waitUntil(t, "the fresh request is decided", func() bool { _, s := p.snapshot(); return slices.Contains(s, "fresh") })
	waitUntil(t, "the worker gives its slot up", func() bool { return p.q.idle() })
	if started, _ := p.snapshot(); !slices.Equal(started, []string{"fresh"}) {
		t.Fatalf("decided %v, want only the fresh request", started)
	}
}

// Past a full backlog the oldest waiting request is let go (it has the least time left), and
// the new one waits; one that waited past CalloutQueueWait goes first.
func TestCalloutQueueLetsTheOldestGoPastAFullBacklog(t *testing.T) {
	t.Parallel()
	now := time.Now()
	p := newQueueProbe(2, 3, stopped(now))
	for i := range 5 {
		p.q.take(request(strconv.Itoa(i), now.Add(-time.Duration(5-i)*time.Millisecond)))
	}
	waitUntil(t, "two requests are being decided", func() bool { s, _ := p.snapshot(); return len(s) == 2 })
	p.q.take(request("sixth", now))
	close(p.release)
	waitUntil(t, "five are decided", func() bool { _, s := p.snapshot(); return len(s) == 5 })
	waitUntil(t, "the workers give their slots up", p.q.idle)
	if _, served := p.snapshot(); slices.Contains(served, "2") || !slices.Contains(served, "sixth") {
		t.Fatalf("decided %v, want the sixth among them and the oldest waiting (2) not", served)
	}

	q := newQueueProbe(1, 2, stopped(now))
	q.q.take(request("deciding", now))
	waitUntil(t, "one request is being decided", func() bool { s, _ := q.snapshot(); return len(s) == 1 })
	q.q.take(request("stale", now.Add(-CalloutQueueWait-time.Millisecond)))
	q.q.take(request("waiting", now))
	q.q.take(request("new", now))
	close(q.release)
	waitUntil(t, "three are decided", func() bool { _, s := q.snapshot(); return len(s) == 3 })
	waitUntil(t, "the worker gives its slot up", q.q.idle)
	if _, served := q.snapshot(); slices.Contains(served, "stale") || !slices.Contains(served, "waiting") {
		t.Fatalf("decided %v, want the stale request let go first and the waiting one decided", served)
	}
}

// Requests taken from many goroutines while workers come and go are each decided once: none
// is stranded in the backlog by a worker that gave its slot up just as it was queued.
func TestCalloutQueueStrandsNoRequestUnderConcurrentTakes(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	seen := map[string]int{}
	q := newCalloutQueue(3, 10_000, stopped(time.Now()), func(r calloutRequest) {
		mu.Lock()
		defer mu.Unlock()
		seen[r.m.Subject]++
	}, slog.New(slog.DiscardHandler))
	const takers, each = 8, 500
	var wg sync.WaitGroup
	for g := range takers {
		wg.Go(func() {
			for i := range each {
				q.take(request(strconv.Itoa(g*each+i), time.Now()))
			}
		})
	}
	wg.Wait()
	waitUntil(t, "every request is decided", func() bool { mu.Lock(); defer mu.Unlock(); return len(seen) == takers*each })
	waitUntil(t, "the workers give their slots up", func() bool { return q.idle() })
	mu.Lock()
	defer mu.Unlock()
	for name, n := range seen {
		if n != 1 {
			t.Fatalf("request %s decided %d times, want once", name, n)
		}
	}
}

// idle reports whether no worker is deciding and nothing waits.
func (q *calloutQueue) idle() bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.busy == 0 && len(q.waiting) == 0
}

// A decision that took CalloutSlow halves how many decide at once, at most once per
// CalloutSlow and never below CalloutMinInFlight; one under half of it lets one more, up to the
// queue's bound; one in between changes nothing. A storm's store reads are served in arrival
// order, and past the deadline every answer is a refusal: fewer reads under way keep them in
// time.
func TestCalloutQueueDecidesFewerAtOnceWhileDecisionsAreSlow(t *testing.T) {
	t.Parallel()
	clock := time.Now()
	q := newCalloutQueue(64, 8, func() time.Time { return clock }, func(calloutRequest) {}, slog.New(slog.DiscardHandler))
	limit := func() int { q.mu.Lock(); defer q.mu.Unlock(); return q.limit }

	q.took(CalloutSlow)
	if got := limit(); got != 32 {
		t.Fatalf("after a slow decision: %d at once, want 32", got)
	}
	q.took(2 * CalloutSlow) // the same slow spell
	if got := limit(); got != 32 {
		t.Fatalf("after a second slow decision at the same moment: %d at once, want still 32", got)
	}
	for range 5 {
		clock = clock.Add(CalloutSlow)
		q.took(CalloutSlow)
	}
	if got := limit(); got != CalloutMinInFlight {
		t.Fatalf("after a long slow spell: %d at once, want the floor %d", got, CalloutMinInFlight)
	}
	q.took(CalloutSlow * 3 / 4)
	if got := limit(); got != CalloutMinInFlight {
		t.Fatalf("after a decision between half of CalloutSlow and it: %d at once, want unchanged", got)
	}
	for range 100 {
		q.took(time.Millisecond)
	}
	if got := limit(); got != 64 {
		t.Fatalf("after 100 quick decisions: %d at once, want the queue's bound 64", got)
	}
}

// With the bound lowered, no more than it decide at once: the rest wait their turn; a quick
// decision raises it and starts one more, and every one is decided once the slow ones finish.
func TestCalloutQueueKeepsToTheLoweredBound(t *testing.T) {
	t.Parallel()
	now := time.Now()
	p := newQueueProbe(64, 64, stopped(now))
	for range 3 { // 64 → 8, each a slow spell of its own
		p.q.mu.Lock()
		p.q.cut = time.Time{}
		p.q.mu.Unlock()
		p.q.took(CalloutSlow)
	}
	for i := range 20 {
		p.q.take(request(strconv.Itoa(i), now))
	}
	waitUntil(t, "the bound's decisions started", func() bool { s, _ := p.snapshot(); return len(s) == CalloutMinInFlight })
	p.q.mu.Lock()
	busy := p.q.busy
	p.q.mu.Unlock()
	if busy != CalloutMinInFlight {
		t.Fatalf("%d deciding at once, want the lowered bound %d", busy, CalloutMinInFlight)
	}
	// A quick decision raises the bound by one, and a waiting request starts at once.
	p.q.took(time.Millisecond)
	waitUntil(t, "a decision started for the raised bound", func() bool { s, _ := p.snapshot(); return len(s) == CalloutMinInFlight+1 })
	close(p.release)
	waitUntil(t, "every request is decided", func() bool { _, s := p.snapshot(); return len(s) == 20 })
	waitUntil(t, "the workers give their slots up", p.q.idle)
}
