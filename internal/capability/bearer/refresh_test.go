package bearer

import (
	"context"
	"errors"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cotal-ai/authplane/internal/testkit"
)

// refreshClock is a settable refreshClock for the refresh interval.
type refreshClock struct{ at atomic.Int64 }

func (c *refreshClock) now() time.Time      { return time.Unix(0, c.at.Load()) }
func (c *refreshClock) add(d time.Duration) { c.at.Add(int64(d)) }
func newRefreshClock() *refreshClock {
	c := &refreshClock{}
	c.at.Store(time.Now().UnixNano())
	return c
}
func junkToken(t *testing.T, kid string) string {
	t.Helper()
	// Any header with alg EdDSA and a kid the cache lacks: the signature is never looked at.
	return testkit.Unsigned(t, map[string]any{"alg": "EdDSA", "kid": kid}, map[string]any{"sub": "x"}, []byte("sig"))
}

// A caller who gives up on its request (net/http cancels a request's context when the client
// hangs up) must not spend the key set's refresh: a genuine token right after it still
// verifies. Before, the cancelled fetch counted as the refresh, and for RefreshEvery every
// token was refused: one anonymous request an interval locked every human out.
func TestACancelledCallerDoesNotSpendTheKeySetRefresh(t *testing.T) {
	p := testkit.NewIdP(t)
	v := newVerifier(t, p)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := v.Verify(ctx, junkToken(t, "nope")); err == nil {
		t.Fatal("junk verified")
	}
	if _, err := v.Verify(context.Background(), p.Token(t, p.Claims("alice", time.Hour))); err != nil {
		t.Fatalf("a genuine token after a cancelled caller: got %v, want it verified", err)
	}
	if got := p.Fetches.Load(); got != 1 {
		t.Fatalf("the key set was fetched %d times, want once", got)
	}
}

// A key set that cannot be fetched is the plane's outage: ErrKeySetUnavailable, whose text
// names no address (the caller sees it; the cause is for the log), and it stays so without a
// new fetch until RefreshEvery has passed.
func TestAnUnreachableKeySetIsUnavailableAndNamesNoAddress(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	var accepted atomic.Int64
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			accepted.Add(1)
			c.Close() // an IdP that hangs up on every fetch
		}
	}()
	t.Cleanup(func() { l.Close() })
	c := newRefreshClock()
	v, err := NewVerifier(IdPConfig{URL: "http://" + addr, Issuer: "https://idp.test", Audience: "a", JWKS: "http://" + addr + "/jwks"}, c.now)
	if err != nil {
		t.Fatal(err)
	}
	for i, kid := range []string{"first", "second"} {
		_, err := v.Verify(context.Background(), junkToken(t, kid))
		if !errors.Is(err, ErrKeySetUnavailable) {
			t.Fatalf("verify %d: got %v, want ErrKeySetUnavailable", i, err)
		}
		if strings.Contains(err.Error(), "127.0.0.1") || strings.Contains(err.Error(), "/jwks") {
			t.Fatalf("verify %d: the refusal names the key set's address: %q", i, err)
		}
		if errors.Unwrap(err) == nil {
			t.Fatalf("verify %d: the cause is not kept for the log", i)
		}
	}
	if got := accepted.Load(); got != 1 {
		t.Fatalf("%d fetches within %s, want 1", got, RefreshEvery)
	}
	c.add(RefreshEvery)
	if _, err := v.Verify(context.Background(), junkToken(t, "third")); !errors.Is(err, ErrKeySetUnavailable) {
		t.Fatalf("after the interval: got %v, want ErrKeySetUnavailable", err)
	}
	if got := accepted.Load(); got != 2 {
		t.Fatalf("%d fetches after the interval, want 2", got)
	}
}

// While a slow IdP holds a fetch, a token whose key is cached verifies at once, and the callers
// that need the fetch share it: one fetch, every one of them answered when it lands.
func TestAFetchInFlightStallsNoOneElseAndIsShared(t *testing.T) {
	p := testkit.NewIdP(t)
	c := newRefreshClock()
	v, err := NewVerifier(IdPConfig{URL: p.Server.URL, Issuer: p.Issuer, Audience: p.Audience, JWKS: p.JWKS()}, c.now)
	if err != nil {
		t.Fatal(err)
	}
	genuine := p.Token(t, p.Claims("alice", time.Hour))
	if _, err := v.Verify(context.Background(), genuine); err != nil {
		t.Fatal(err)
	}
	c.add(RefreshEvery)
	stall := make(chan struct{})
	p.Stall.Store(&stall)
	const waiters = 8
	var wg sync.WaitGroup
	errs := make([]error, waiters)
	for i := range waiters {
		wg.Go(func() { _, errs[i] = v.Verify(context.Background(), junkToken(t, "rotated")) })
	}
	testkit.CheckFor(t, 10*time.Second, time.Millisecond, func() error {
		if p.Fetches.Load() < 2 {
			return errors.New("no fetch began for an unknown kid")
		}
		return nil
	})
	done := make(chan error, 1)
	go func() { _, err := v.Verify(context.Background(), genuine); done <- err }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("a token with a cached key during a fetch: %v", err)
		}
	case <-time.After(3 * time.Second):
		close(stall)
		t.Fatal("a token with a cached key waited for the fetch in flight")
	}
	close(stall)
	wg.Wait()
	for i, err := range errs {
		if !errors.Is(err, errUnknownKid) {
			t.Fatalf("waiter %d: got %v, want the unknown kid refused after the shared fetch", i, err)
		}
	}
	if got := p.Fetches.Load(); got != 2 {
		t.Fatalf("%d fetches, want 2: the waiters share one", got)
	}
}
