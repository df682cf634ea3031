package handlers

import (
	"sync"
	"time"

	"golang.org/x/time/rate"
)

// Limiter is a token bucket per principal. Buckets idle long enough to be full again are
// forgotten, so the map stays as small as the set of active callers.
type Limiter struct {
	rate  rate.Limit
	burst int
	now   func() time.Time

	mu      sync.Mutex
	buckets map[string]*rate.Limiter
	swept   time.Time
}

// NewLimiter allows each principal perSecond requests a second with bursts of burst, on the
// clock now (nil: time.Now). A perSecond of zero or less disables limiting.
func NewLimiter(perSecond float64, burst int, now func() time.Time) *Limiter {
	if now == nil {
		now = time.Now
	}
	return &Limiter{rate: rate.Limit(perSecond), burst: burst, now: now, buckets: map[string]*rate.Limiter{}}
}

// Allow takes one token from principal's bucket.
func (l *Limiter) Allow(principal string) bool {
	if l == nil || l.rate <= 0 {
		return true
	}
	now := l.now()
	l.mu.Lock()
	defer l.mu.Unlock()
	if now.Sub(l.swept) > time.Minute {
		for p, b := range l.buckets {
			if b.TokensAt(now) >= float64(l.burst) {
				delete(l.buckets, p)
			}
		}
		l.swept = now
	}
	b, ok := l.buckets[principal]
	if !ok {
		b = rate.NewLimiter(l.rate, l.burst)
		l.buckets[principal] = b
	}
	return b.AllowN(now, 1)
}
