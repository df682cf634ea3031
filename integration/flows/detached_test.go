package flows

import (
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"

	"github.com/cotal-ai/authplane/client"
	"github.com/cotal-ai/authplane/handlers"
	"github.com/cotal-ai/authplane/integration/internal/harness"
	"github.com/cotal-ai/authplane/internal/supervisor"
	"github.com/cotal-ai/authplane/internal/testkit"
	"github.com/cotal-ai/authplane/service"
	"github.com/cotal-ai/authplane/subjects"
)

// detachedCounts sums supervisor-end's detached counters (data.detached in `nats micro stats
// --json`) and micro's own request count over every service instance of p.
func detachedCounts(t testing.TB, p *harness.TestPlane) (handlers.DetachedCounters, int) {
	t.Helper()
	var sum handlers.DetachedCounters
	requests := 0
	for _, m := range harness.CollectN(t, p.Ops(t), "$SRV.STATS."+subjects.ServiceName, nil, p.Workers, 3*time.Second) {
		var stats micro.Stats
		if err := json.Unmarshal(m.Data, &stats); err != nil {
			t.Fatalf("decode $SRV.STATS answer %q: %v", m.Data, err)
		}
		for _, e := range stats.Endpoints {
			if e.Name != subjects.EndpointSupervisorEnd {
				continue
			}
			requests += e.NumRequests
			var d handlers.Counters
			if err := json.Unmarshal(e.Data, &d); err != nil || d.Detached == nil {
				t.Fatalf("stats data of supervisor-end %s: want data.detached (err %v)", e.Data, err)
			}
			sum.Answered += d.Detached.Answered
			sum.Errors += d.Detached.Errors
			sum.InFlight += d.Detached.InFlight
			if d.Detached.LastError != "" {
				sum.LastError = d.Detached.LastError
			}
		}
	}
	return sum, requests
}

// TestEndsOnOneServiceInstanceRunAtOnce: with one micro service instance, two ends each wait
// inside the plane (after step 4) until the other has arrived there too. micro hands an
// instance one request at a time, so an end answered on micro's handler would hold the other
// back until it gave up; answered off it (handlers.Detached), both go on and both complete.
// Their answers, and a refusal, are counted in supervisor-end's data.detached.
func TestEndsOnOneServiceInstanceRunAtOnce(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	arrived := map[string]bool{}
	both := make(chan struct{})
	var watched map[string]bool // the two lifecycles' instances, set before either end
	p := harness.StartPlane(t, func(c *service.Config) {
		c.Workers = 1
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
		got, requests := detachedCounts(t, p)
		want := handlers.DetachedCounters{Answered: 3, Errors: 1, LastError: "400:bad-request"}
		if got.Answered != want.Answered || got.Errors != want.Errors || got.LastError != want.LastError || got.InFlight != 0 || requests != 3 {
			return fmt.Errorf("supervisor-end: data.detached %+v and %d requests, want %+v, none in flight, and 3 requests", got, requests, want)
		}
		return nil
	})
}

// TestAPlaneStoppingWithAnEndUnderWayAnswersIt: an end held inside the plane while the plane
// stops still gets its answer: the stop waits for detached answers before the serving
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
