package issue

// The plane's per-tenant budgets kept in memory: a token bucket per name (a
// principal, an owner, an instance), on an injected clock. Buckets idle long enough to be full
// again are forgotten, so the map stays as small as the set of active names. A budget held in
// memory is per replica: a bound it documents holds per replica, multiplied by the replicas.

import (
	"sync"
	"time"

	"golang.org/x/time/rate"
)

// Buckets is a token bucket per name.
type Buckets struct {
	rate  rate.Limit
	burst int
	now   func() time.Time

	mu      sync.Mutex
	buckets map[string]*rate.Limiter
	swept   time.Time
}

// NewBuckets gives each name perSecond tokens a second, up to burst, on the clock now (nil:
// time.Now). A perSecond of zero or less bounds nothing.
func NewBuckets(perSecond float64, burst int, now func() time.Time) *Buckets {
	if now == nil {
		now = time.Now
	}
	return &Buckets{rate: rate.Limit(perSecond), burst: burst, now: now, buckets: map[string]*rate.Limiter{}}
}

// Allow takes one token from name's bucket.
func (b *Buckets) Allow(name string) bool { return b.Take(name, 1) }

// Take takes n tokens from name's bucket, all or none, and reports whether it had them. A nil
// or unbounded Buckets always has them.
func (b *Buckets) Take(name string, n int) bool {
	if b == nil || b.rate <= 0 {
		return true
	}
	now := b.now()
	b.mu.Lock()
	defer b.mu.Unlock()
	if now.Sub(b.swept) > time.Minute {
		for k, l := range b.buckets {
			if l.TokensAt(now) >= float64(b.burst) {
				delete(b.buckets, k)
			}
		}
		b.swept = now
	}
	l, ok := b.buckets[name]
	if !ok {
		l = rate.NewLimiter(b.rate, b.burst)
		b.buckets[name] = l
	}
	return l.AllowN(now, n)
}

// Exceeded is the cause of a refusal past a tenant's budget: Budget names which, as the
// metric of budget refusals labels it.
type Exceeded struct{ Budget string }

func (e *Exceeded) Error() string { return "past the " + e.Budget + " budget" }

// The tenant budgets whose refusals carry an Exceeded (the label of
// authplane_tenant_budget_refused_total).
const (
	// ReregistrationsInstance and ReregistrationsOwner: prepares of registered instances an hour.
	ReregistrationsInstance = "reregistrations_instance"
	ReregistrationsOwner    = "reregistrations_owner"
	// NewKeysOwner: keys an owner claims anew over the minted records' retention.
	NewKeysOwner = "new_keys_owner"
	// ConnectionKeysOwner: the auth callout's users of an owner's connections, each a key the
	// broker chose, over a bearer's life.
	ConnectionKeysOwner = "connection_keys_owner"
	// PendingRegistrations: an owner's first registrations in flight at once.
	PendingRegistrations = "pending_registrations"
	// OwnerInFlight: an owner's calls of one endpoint under way at once in one process.
	OwnerInFlight = "owner_in_flight"
)

// BudgetNames are every tenant budget of this package's refusals, for metrics that start at 0.
var BudgetNames = []string{ReregistrationsInstance, ReregistrationsOwner, NewKeysOwner, ConnectionKeysOwner, PendingRegistrations, OwnerInFlight}
