package flows

import (
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/cotal-ai/authplane/client"
	"github.com/cotal-ai/authplane/integration/internal/harness"
	"github.com/cotal-ai/authplane/internal/capability/supervisor"
	"github.com/cotal-ai/authplane/internal/testkit"
	"github.com/cotal-ai/authplane/service"
	"github.com/cotal-ai/authplane/subjects"
)

// TestEndsOnOneServiceInstanceRunAtOnce: the plane's one micro service instance hands each
// request to its endpoint's pool, so two ends that each wait inside the plane (after step 4)
// until the other has arrived there too both go on and complete: answered on micro's handler,
// which takes an instance's requests one at a time, the first would hold the other back until
// it gave up. Their answers, and a refusal, are counted in supervisor-end's data, and micro
// counts the three requests.
func TestEndsOnOneServiceInstanceRunAtOnce(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	arrived := map[string]bool{}
	both := make(chan struct{})
	var watched map[string]bool // the two lifecycles' instances, set before either end
	p := harness.StartPlane(t, func(c *service.Config) {
		c.Workers = 2
		c.Hooks = &service.Hooks{AfterEndStep: func(iid string, step int) error {
			mu.Lock()
			if step != supervisor.StepGateRetired || !watched[iid] {
				mu.Unlock()
				return nil
			}
			arrived[iid] = true
			if len(arrived) == len(watched) {
				close(both)
			}
			mu.Unlock()
			select {
			case <-both:
				return nil
			case <-time.After(10 * time.Second):
				return errors.New("the other end never came in while this one waited (test hook)")
			}
		}}
	})
	pa := harness.NewPlatformAdmin(t, p, "admin")
	lives := []*harness.Supervised{pa.Assign(time.Now().Add(time.Hour)), pa.Assign(time.Now().Add(time.Hour))}
	for _, s := range lives {
		pa.Register(s)
	}
	mu.Lock()
	watched = map[string]bool{lives[0].M.Iid: true, lives[1].M.Iid: true}
	mu.Unlock()

	errs := make([]error, len(lives))
	var wg sync.WaitGroup
	for i, s := range lives {
		wg.Go(func() {
			report, err := pa.End(s)
			if err == nil && !report.Done {
				err = fmt.Errorf("answered but not done: %+v", report)
			}
			errs[i] = err
		})
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Errorf("end %d on the one service instance: %v", i, err)
		}
	}

	_, err := pa.C.End(harness.CallCtx(t), client.End{Owner: lives[0].Owner, InstanceID: lives[0].M.Iid, LifecycleUID: lives[0].M.Uid, Reason: ""})
	harness.WantRefusalOf(t, "an end without a reason", err, "bad-request", "reason")
	testkit.CheckFor(t, 5*time.Second, 20*time.Millisecond, func() error {
		got := harness.Counters(t, p, subjects.EndpointSupervisorEnd)
		if got.Answered != 3 || got.Errors != 1 || got.LastError != "400:bad-request" || got.InFlight != 0 || got.Requests != 3 {
			return fmt.Errorf("supervisor-end: got %+v, want 3 requests, 3 answered, 1 error (400:bad-request), none in flight", got)
		}
		return nil
	})
}

// TestAPlaneStoppingWithAnEndUnderWayAnswersIt: an end held inside the plane while the plane
// stops still gets its answer: the stop waits for the pools' answers before the serving
// connection drains.
func TestAPlaneStoppingWithAnEndUnderWayAnswersIt(t *testing.T) {
	t.Parallel()
	inside := make(chan struct{})
	release := make(chan struct{})
	var hold sync.Once
	p := harness.StartPlane(t, func(c *service.Config) {
		c.Hooks = &service.Hooks{AfterEndStep: func(_ string, step int) error {
			if step == supervisor.StepGateRetired {
				hold.Do(func() {
					close(inside)
					select {
					case <-release:
					case <-time.After(30 * time.Second): // the test failed before it let go
					}
				})
			}
			return nil
		}}
	})
	pa := harness.NewPlatformAdmin(t, p, "admin")
	s := pa.Assign(time.Now().Add(time.Hour))
	pa.Register(s)
	ops := p.Ops(t)
	if _, err := ops.Request("$SRV.PING."+subjects.ServiceName, nil, 5*time.Second); err != nil {
		t.Fatalf("a ping before the stop: %v", err)
	}

	type result struct {
		report *client.EndReport
		err    error
	}
	answered := make(chan result, 1)
	go func() {
		r, err := pa.End(s)
		answered <- result{r, err}
	}()
	<-inside
	closed := make(chan error, 1)
	go func() { closed <- p.Close() }()
	// The services have stopped once no instance answers a ping; the end is still held.
	testkit.CheckFor(t, 10*time.Second, 20*time.Millisecond, func() error {
		_, err := ops.Request("$SRV.PING."+subjects.ServiceName, nil, time.Second)
		if !errors.Is(err, nats.ErrNoResponders) {
			return fmt.Errorf("a ping: got %v, want no responders", err)
		}
		return nil
	})
	close(release)
	r := <-answered
	if r.err != nil || !r.report.Done {
		t.Fatalf("the end under way while the plane stopped: got %+v, %v; want its answer, done", r.report, r.err)
	}
	if err := <-closed; err != nil && !errors.Is(err, service.ErrFenced) {
		t.Errorf("close plane: %v", err)
	}
}
