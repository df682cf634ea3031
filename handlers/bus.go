package handlers

import (
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"

	"github.com/cotal-ai/authplane/client"
	"github.com/cotal-ai/authplane/internal/body"
	"github.com/cotal-ai/authplane/internal/fault"
	"github.com/cotal-ai/authplane/internal/logs"
	"github.com/cotal-ai/authplane/subjects"
)

// Bus serves the plane's endpoints over NATS as micro services: it takes the caller from the
// subject, answers only into the caller's own inbox, and hands every call to the guard.
type Bus struct {
	Space   string
	Timeout time.Duration
	Guard   *Guard
	Log     *slog.Logger
}

// Counters is what an endpoint reports in `nats micro stats` (with --json) beside micro's own
// numbers.
type Counters struct {
	// Dropped counts requests answered with nothing because their reply subject was not the
	// caller's inbox (or their subject named no principal).
	Dropped uint64 `json:"dropped"`
	// Throttled counts requests refused by the per-principal rate limit.
	Throttled uint64 `json:"throttled"`
	// Detached is an endpoint's own count of its answers when they are sent off micro's handler
	// (Detached): micro's num_errors and processing_time then count only the hand-off.
	Detached *DetachedCounters `json:"detached,omitempty"`
}

// DetachedCounters are a detached endpoint's answers: how many were sent, how many were
// refusals or not sent (last_error is the last one's number and code, as micro keeps it, or
// the publish error), the time from each request's hand-off to its answer, and how many are
// under way. A request answered inline once the services stopped is micro's to count.
type DetachedCounters struct {
	Answered       uint64        `json:"answered"`
	Errors         uint64        `json:"errors"`
	LastError      string        `json:"last_error,omitempty"`
	ProcessingTime time.Duration `json:"processing_time"`
	InFlight       int           `json:"in_flight"`
}

// Stats returns the counters of a registered endpoint, for micro's StatsHandler.
func Stats(e *micro.Endpoint) any {
	h, ok := e.Handler.(*endpoint)
	if !ok {
		return nil
	}
	c := Counters{Dropped: h.dropped.Load(), Throttled: h.throttled.Load()}
	if h.detached != nil {
		c.Detached = h.answers.counters()
	}
	return c
}

// Detached are the endpoints whose requests are answered off micro's handler, at most
// DetachedInFlight at once per Register (per serving connection: a replica has two while it
// renews its serving user). micro runs an instance's requests one at a time and
// the broker hands each request to a random instance of the queue group, so a request that
// waits long holds up whichever request comes next to its instance. supervisor-end waits on the
// revocation set's round (up to a second for the next signing, then the broker's
// confirmation): twenty ends at once over 32 instances put two or three on one instance, and
// those took two or three rounds (p99 3 s in `authplane bench --phases ends`, against 1 s at
// the plane).
var Detached = map[string]bool{subjects.EndpointSupervisorEnd: true}

// DetachedInFlight bounds the detached answers under way per Register; past it an instance
// waits for one to finish before it takes its next request, as it would answering inline.
const DetachedInFlight = 64

// Served is what one Register added: the service instances, and the detached answers under way.
type Served struct {
	Services []micro.Service
	detached *detached
}

// Stop stops every service instance, then waits until the detached answers under way are
// sent, until by at the latest. A request micro delivers after that is answered inline.
func (s *Served) Stop(by time.Time) error {
	var errs []error
	for _, svc := range s.Services {
		if err := svc.Stop(); err != nil {
			errs = append(errs, err)
		}
	}
	if s.detached != nil && !s.detached.wait(by) {
		errs = append(errs, errors.New("detached answers still under way at the stop's deadline"))
	}
	return errors.Join(errs...)
}

// Register adds `workers` micro service instances of cfg to nc, each serving every endpoint of
// fns in cfg's queue group. micro runs an endpoint's requests one at a time and takes its stats
// when the handler returns, so the plane serves in parallel with instances, not copies: `nats
// micro info` shows each endpoint once, and `nats micro stats` one row per instance. Each
// instance's metadata says which worker it is. The Detached endpoints share one bound of
// answers under way across the instances.
func (b *Bus) Register(nc *nats.Conn, cfg micro.Config, fns map[string]Func, workers int) (*Served, error) {
	served := &Served{detached: newDetached(nc, DetachedInFlight)}
	for w := range max(workers, 1) {
		c := cfg
		c.Metadata = map[string]string{"worker": strconv.Itoa(w)}
		for k, v := range cfg.Metadata {
			c.Metadata[k] = v
		}
		c.StatsHandler = Stats
		svc, err := micro.AddService(nc, c)
		if err != nil {
			return served, fmt.Errorf("micro service %s worker %d: %w", c.Name, w, err)
		}
		served.Services = append(served.Services, svc)
		group := svc.AddGroup(subjects.AuthPrefix(b.Space))
		for _, name := range subjects.Endpoints {
			fn, ok := fns[name]
			if !ok {
				return served, fmt.Errorf("endpoint %s has no handler", name)
			}
			h := &endpoint{bus: b, name: name, fn: fn}
			if Detached[name] {
				h.detached = served.detached
			}
			if err := group.AddEndpoint(name, h, micro.WithEndpointSubject(subjects.EndpointPattern(name))); err != nil {
				return served, fmt.Errorf("register endpoint %s: %w", name, err)
			}
		}
	}
	return served, nil
}

// endpoint is one endpoint of one service instance.
type endpoint struct {
	bus       *Bus
	name      string
	fn        Func
	detached  *detached // nil: answered inline
	answers   answers   // the detached answers of this instance's endpoint
	dropped   atomic.Uint64
	throttled atomic.Uint64
}

// Handle serves one request: inline, or for a detached endpoint on a goroutine of its own once
// a slot is free (inline once the services stopped).
func (h *endpoint) Handle(req micro.Request) {
	b := h.bus
	name, owner, actor, ok := subjects.ParseEndpointSubject(b.Space, req.Subject())
	if !ok || name != h.name {
		h.drop("subject names no principal", "subject", fault.Clip(req.Subject(), 2*fault.MaxQuote))
		return
	}
	if !subjects.ReplyAllowed(req.Reply(), owner, actor) {
		h.drop("reply subject is not the caller's inbox", "caller", subjects.Principal(owner, actor), "reply", fault.Clip(req.Reply(), 2*fault.MaxQuote))
		return
	}
	call := Call{Endpoint: name, Owner: owner, Actor: actor, Body: req.Data(), Deadline: time.Now().Add(b.Timeout)}
	if d := h.detached; d != nil && !d.isStopped() {
		select {
		case d.slots <- struct{}{}:
			a := d.answerTo(req, &h.answers)
			go func() {
				defer func() { <-d.slots }()
				defer a.done()
				h.serve(a, call)
			}()
			return
		case <-d.stopped:
		}
	}
	h.serve(req, call)
}

// serve answers call on req.
func (h *endpoint) serve(req micro.Request, call Call) {
	b := h.bus
	reply, refusal := b.Guard.Serve(call, h.fn)
	var err error
	if refusal != nil {
		if errors.Is(refusal, ErrThrottled) {
			h.throttled.Add(1)
		}
		err = respondError(req, refusal)
	} else {
		var data []byte
		if data, err = body.Encode(reply); err == nil {
			err = req.Respond(data)
		}
	}
	if err != nil {
		b.Log.Warn("reply not sent", "endpoint", h.name, "err", err)
	}
}

// drop counts a request dropped without an answer and logs it: the 1st, 2nd, 4th, 8th… of
// each endpoint, so a caller cannot flood the log with them; the count says how many there were.
func (h *endpoint) drop(why string, attrs ...any) {
	n := h.dropped.Add(1)
	if logs.Sparse(n) {
		h.bus.Log.Warn("dropped request: "+why, append([]any{"endpoint", h.name, "dropped", n}, attrs...)...)
	}
}

// respondError answers req with refusal e: both micro headers and the JSON body, so micro
// counts it in the endpoint's error stats. micro keeps the description it is given as the
// endpoint's last_error, which `$SRV.STATS` shows every ops credential; a refusal's message
// quotes its caller, so micro is given the code alone, and the caller's own
// `Nats-Service-Error` header the whole `<code>: <message>`.
func respondError(req micro.Request, e *fault.Error) error {
	w := client.WireError{Code: string(e.Code), Message: e.Message, Details: e.Details}
	if !e.Code.Known() {
		w = client.WireError{Code: string(fault.Internal), Message: "internal error"}
	}
	data, err := body.Encode(client.ErrorBody{Error: w})
	if err != nil {
		return err
	}
	full := micro.WithHeaders(micro.Headers{micro.ErrorHeader: {w.Code + ": " + w.Message}})
	return req.Error(strconv.Itoa(fault.Code(w.Code).Numeric()), w.Code, data, full)
}
