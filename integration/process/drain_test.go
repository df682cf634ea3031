package process

import (
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/cotal-ai/authplane/integration/internal/harness"
	"github.com/cotal-ai/authplane/internal/testkit"
	"github.com/cotal-ai/authplane/service"
	"github.com/cotal-ai/authplane/subjects"
)

// leftNothing fails the test if the prepare of instance iid left a gate or a minted record:
// what a request that got no credential must leave.
func leftNothing(t testing.TB, p *harness.TestPlane, iid string) {
	t.Helper()
	if _, err := harness.FenceEntry(t, p, subjects.GateKey(subjects.GateEndpointManager, iid)); !errors.Is(err, jetstream.ErrMsgNotFound) {
		t.Errorf("instance %s: its gate: %v, want none", iid, err)
	}
	if _, err := harness.LastMsg(t, p, subjects.MintedStream(harness.TestSpace), subjects.MintedStreamSubjects(harness.TestSpace)[:len("cotal.default.minted.")]+iid+".>"); !errors.Is(err, jetstream.ErrMsgNotFound) {
		t.Errorf("instance %s: a minted record: %v, want none", iid, err)
	}
}

// A stop takes no new request and lets the one in flight finish: it gets its credentials,
// committed, while a request sent after the stop began gets unavailable or no responder and
// leaves nothing behind.
func TestDrainFinishesTheRequestInFlightAndTakesNoNewOne(t *testing.T) {
	t.Parallel()
	s := harness.StartStandalone(t, harness.TestSpace)
	pp := harness.NewPausePoint()
	p := harness.StartPlane(t, func(c *service.Config) {
		harness.AgainstStandalone(s)(c)
		c.Hooks = &service.Hooks{BeforeCommit: pp.Hook}
	})
	harness.Grant(t, p, harness.OwnerA, "cli", "supervise")
	cli := harness.CallerConn(t, p, harness.OwnerA, "cli")
	inFlight, late := harness.NewManagerKeys(t), harness.NewManagerKeys(t)
	pp.Armed.Store(true)
	result := make(chan harness.Outcome, 1)
	go func() {
		result <- harness.AskAsync(cli, harness.OwnerA, "cli", subjects.EndpointManagerAuthority, inFlight.Body(t, "prepare", "cli"))
	}()
	pp.Wait(t)

	closed := make(chan error, 1)
	go func() { closed <- p.Close() }()
	harness.WaitUnhealthy(t, p.HTTPURL(), "draining")
	// The late request may wait behind the held one (micro serves an endpoint of a service
	// instance one request at a time), so it is sent before the held one is released.
	lateResult := make(chan harness.Outcome, 1)
	go func() {
		lateResult <- harness.AskAsync(cli, harness.OwnerA, "cli", subjects.EndpointManagerAuthority, late.Body(t, "prepare", "cli"))
	}()
	select {
	case err := <-closed:
		t.Fatalf("Close returned (%v) while a request was in flight within --drain-timeout", err)
	default:
	}

	close(pp.Release)
	if got := <-result; got.Code != "" || len(got.Material.Credentials) != 2 {
		t.Fatalf("the request in flight: got %q %q, want its supervisor and executor", got.Code, got.Message)
	}
	if o := <-lateResult; o.Code != "unavailable" && !(o.Code == "transport" && strings.Contains(o.Message, "no responders")) {
		t.Errorf("a request after the stop began: got %q %q, want unavailable or no responders", o.Code, o.Message)
	}
	if err := <-closed; err != nil {
		t.Errorf("Close: %v", err)
	}
	if _, err := harness.FenceEntry(t, p, subjects.GateKey(subjects.GateEndpointManager, inFlight.Iid)); err != nil {
		t.Errorf("the request in flight: its gate: %v, want it committed", err)
	}
	leftNothing(t, p, late.Iid)
}

// A request still in flight when --drain-timeout runs out is cut off: the stop ends on time,
// and the request commits nothing afterwards.
func TestDrainEndsAtTheDrainTimeoutAndWhatItCutCommitsNothing(t *testing.T) {
	t.Parallel()
	s := harness.StartStandalone(t, harness.TestSpace)
	pp := harness.NewPausePoint()
	p := harness.StartPlane(t, func(c *service.Config) {
		harness.AgainstStandalone(s)(c)
		c.DrainTimeout = 300 * time.Millisecond
		c.Hooks = &service.Hooks{BeforeCommit: pp.Hook}
	})
	harness.Grant(t, p, harness.OwnerA, "cli", "supervise")
	cli := harness.CallerConn(t, p, harness.OwnerA, "cli")
	m := harness.NewManagerKeys(t)
	pp.Armed.Store(true)
	result := make(chan harness.Outcome, 1)
	// The request waits two seconds for an answer: its handler, released after the stop, fails
	// at once on the closed connections, long before.
	go func() {
		result <- harness.AskWithin(2*time.Second, cli, harness.OwnerA, "cli", subjects.EndpointManagerAuthority, m.Body(t, "prepare", "cli"))
	}()
	pp.Wait(t)

	start := time.Now()
	if err := p.Close(); err != nil {
		t.Errorf("Close: %v", err)
	}
	t.Logf("Close took %s", time.Since(start))
	if took := time.Since(start); took > 3*time.Second {
		t.Errorf("Close took %s with --drain-timeout 300ms, want it bounded by the drain timeout", took)
	}
	close(pp.Release)
	if o := <-result; o.Code == "" {
		t.Errorf("the request cut off: got credentials, want none")
	}
	if _, err := harness.FenceEntry(t, p, subjects.GateKey(subjects.GateEndpointManager, m.Iid)); !errors.Is(err, jetstream.ErrMsgNotFound) {
		t.Errorf("the request cut off: its gate: %v, want none", err)
	}
}

// SIGTERM to the binary while prepares stream in: it exits 0, every request got its
// credentials, unavailable, or no responder, and every one that got no credentials left no
// gate and no minted record: nothing half done.
func TestSIGTERMDrainsAndExitsZeroWithNothingHalfDone(t *testing.T) {
	t.Parallel()
	s := harness.StartStandalone(t, harness.TestSpace)
	dir := t.TempDir()
	proc := harness.StartAuthplane(t, "serve", "--dir", dir, "--nats-url", s.URL(), "--space-dir", s.SpaceDir, "--http-port", "0", "--drain-timeout", "5s")
	p := harness.BinaryPlane(t, harness.WaitReady(t, proc, dir))
	harness.Grant(t, p, harness.OwnerA, "cli", "supervise")
	cli := harness.CallerConn(t, p, harness.OwnerA, "cli")

	type sent struct {
		iid string
		o   harness.Outcome
	}
	var (
		mu       sync.Mutex
		all      []sent
		stopping atomic.Bool
		wg       sync.WaitGroup
	)
	for range 8 {
		wg.Go(func() {
			for after := 0; after < 5; {
				m := harness.NewManagerKeys(t)
				o := harness.AskAsync(cli, harness.OwnerA, "cli", subjects.EndpointManagerAuthority, m.Body(t, "prepare", "cli"))
				mu.Lock()
				all = append(all, sent{m.Iid, o})
				mu.Unlock()
				if stopping.Load() {
					after++
				}
			}
		})
	}
	testkit.CheckFor(t, 10*time.Second, 10*time.Millisecond, func() error {
		mu.Lock()
		defer mu.Unlock()
		if len(all) < 20 {
			return errors.New("fewer than 20 prepares answered yet")
		}
		return nil
	})
	if err := proc.Cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	stopping.Store(true)
	if code := proc.Wait(t, 15*time.Second); code != 0 {
		t.Errorf("after SIGTERM: exit %d, want 0\n%s", code, proc.Stderr.String())
	}
	wg.Wait()

	counts := map[string]int{}
	for _, r := range all {
		switch {
		case r.o.Code == "" && len(r.o.Material.Credentials) == 2:
			counts["credentials"]++
		case r.o.Code == "unavailable":
			counts["unavailable"]++
			leftNothing(t, p, r.iid)
		case r.o.Code == "transport" && strings.Contains(r.o.Message, "no responders"):
			counts["no responders"]++
			leftNothing(t, p, r.iid)
		default:
			t.Errorf("instance %s: got %q %q, want credentials, unavailable or no responders", r.iid, r.o.Code, r.o.Message)
		}
	}
	if counts["credentials"] < 20 || counts["unavailable"]+counts["no responders"] < 8 {
		t.Errorf("answers: %v, want prepares served before the stop and refused after it", counts)
	}
	t.Logf("answers: %v", counts)
}
