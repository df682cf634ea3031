package supervisor_test

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"

	"github.com/nats-io/jwt/v2"

	"github.com/cotal-ai/authplane/internal/core/store"
	"github.com/cotal-ai/authplane/internal/platform/broker"
	"github.com/cotal-ai/authplane/internal/testkit"
)

// logged is a bucket of a schedule (the fence bucket, the platform bucket): an in-memory
// bucket that keeps every write that landed with its revision, so the invariants can read a
// fence as it was at any revision, and that fails writes on demand as a timeout, a leader
// change or a lost connection would.
type logged struct {
	*testkit.KV
	mu     sync.Mutex
	writes map[string][]write // by key
	fault  *injected
}

// write is one write that landed.
type write struct {
	key   string
	value []byte
	rev   uint64
}

// injected is an armed fault: writes to keys with prefix fail with err (lands: the write
// happens anyway, and its writer is told it may not have); once, or until disarmed (outage).
type injected struct {
	prefix string
	err    error
	lands  bool
	outage bool
}

func newLogged() *logged { return &logged{KV: testkit.NewKV(), writes: map[string][]write{}} }

func (l *logged) Create(ctx context.Context, key string, value []byte) (uint64, error) {
	return l.write(key, value, func() (uint64, error) { return l.KV.Create(ctx, key, value) })
}

func (l *logged) Update(ctx context.Context, key string, value []byte, rev uint64) (uint64, error) {
	return l.write(key, value, func() (uint64, error) { return l.KV.Update(ctx, key, value, rev) })
}

func (l *logged) write(key string, value []byte, do func() (uint64, error)) (uint64, error) {
	f := l.trip(key)
	if f != nil && !f.lands {
		return 0, f.err
	}
	rev, err := do()
	if err == nil {
		l.mu.Lock()
		l.writes[key] = append(l.writes[key], write{key: key, value: slices.Clone(value), rev: rev})
		l.mu.Unlock()
	}
	if f != nil {
		return 0, f.err
	}
	return rev, err
}

// trip returns the fault that fails this write to key, if one is armed for it.
func (l *logged) trip(key string) *injected {
	l.mu.Lock()
	defer l.mu.Unlock()
	f := l.fault
	if f == nil || !strings.HasPrefix(key, f.prefix) {
		return nil
	}
	if !f.outage {
		l.fault = nil
	}
	return &injected{prefix: f.prefix, err: fmt.Errorf("write %s: %w", key, f.err), lands: f.lands}
}

// arm arms f (nil disarms).
func (l *logged) arm(f *injected) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.fault = f
}

// history returns the writes that landed on key, in revision order.
func (l *logged) history(key string) []write {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := slices.Clone(l.writes[key])
	slices.SortFunc(out, func(a, b write) int { return cmp.Compare(a.rev, b.rev) })
	return out
}

// keysUnder returns the keys with prefix that were written, and how many writes landed on each.
func (l *logged) keysUnder(prefix string) map[string]int {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := map[string]int{}
	for k, ws := range l.writes {
		if strings.HasPrefix(k, prefix) {
			out[k] = len(ws)
		}
	}
	return out
}

// The faults a schedule injects.
var (
	errUnknown = fmt.Errorf("timed out (injected): %w", store.ErrUnknownOutcome)
	errLost    = errors.New("nats: connection closed (injected)")
)

// resolver is the broker's account resolver, one server of it: it keeps the account JWT pushed
// last, whatever its issue time (as nats-server's resolver does on a push), answers a lookup
// with it, and lists no connection (the schedule has no connections). down refuses every push
// and lookup: a broker the plane cannot reach.
type resolver struct {
	account string
	mu      sync.Mutex
	held    string
	down    bool
}

func (r *resolver) Servers(context.Context) (int, error) { return 1, nil }

func (r *resolver) Push(_ context.Context, token string) error {
	c, err := jwt.DecodeAccountClaims(token)
	if err != nil || c.Subject != r.account {
		return fmt.Errorf("not an account JWT of the data account: %v", err)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.down {
		return errors.New("nats: no responders available for request (injected)")
	}
	r.held = token // a push replaces what a nats-server resolver holds, whatever its issue time
	return nil
}

func (r *resolver) Lookup(_ context.Context, n int) ([]string, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	switch {
	case r.down:
		return nil, errors.New("nats: no responders available for request (injected)")
	case r.held == "":
		return nil, errors.New("the resolver holds no account JWT")
	}
	out := make([]string, n)
	for i := range out {
		out[i] = r.held
	}
	return out, nil
}

func (r *resolver) ListConnections(context.Context, int) ([]broker.Connection, map[string]bool, error) {
	return nil, map[string]bool{"s": true}, nil
}

func (r *resolver) Kick(context.Context, string, uint64) error { return nil }

// signers returns the signing keys the account JWT the resolver holds lists.
func (r *resolver) signers() map[string]bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := map[string]bool{}
	if c, err := jwt.DecodeAccountClaims(r.held); err == nil {
		for k := range c.SigningKeys {
			out[k] = true
		}
	}
	return out
}

// witnessAll witnesses every run-start: the schedules are not about the witness.
type witnessAll struct{}

func (witnessAll) Witnessed(context.Context, string) (bool, error) { return true, nil }

// OpenWitness opens nothing: every run-start is witnessed here.
func (witnessAll) OpenWitness(context.Context, string) {}
