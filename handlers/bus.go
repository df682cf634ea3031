package handlers

import (
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"

	"github.com/cotal-ai/authplane/client"
	"github.com/cotal-ai/authplane/internal/core/fault"
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

// Counters is what an endpoint reports as its data (`nats micro info`, `nats micro stats --json`)
// beside micro's own numbers. micro counts a request when its handler returns, and an error
// only when the handler sends it on its own goroutine; the plane's handler hands each request
// to the endpoint's pool and returns, so micro counts every request received and the time to
// hand it over, and these count the answers.
type Counters struct {
	// Answered counts the answers sent, refusals included.
	Answered uint64 `json:"answered"`
	// Errors counts the refusals sent and the answers that could not be sent; LastError is the
	// last one's number and code ("403:permission-denied", never the refusal's message, which
	// quotes its caller), or the publish error.
	Errors    uint64 `json:"errors"`
	LastError string `json:"last_error,omitempty"`
	// ProcessingTime is the time from each request's arrival to its answer, summed; InFlight
	// the answers under way.
	ProcessingTime time.Duration `json:"processing_time"`
	InFlight       int           `json:"in_flight"`
	// Dropped counts requests answered with nothing because their reply subject was not the
	// caller's inbox (or their subject named no principal).
	Dropped uint64 `json:"dropped"`
	// Throttled counts requests refused by the per-principal rate limit or by their owner's
	// requests under way on the endpoint (Guard.Enter); in Errors too.
	Throttled uint64 `json:"throttled"`
}

// Stats returns the counters of a registered endpoint, for micro's StatsHandler.
func Stats(e *micro.Endpoint) any {
	h, ok := e.Handler.(*endpoint)
	if !ok {
		return nil
	}
	c := h.answers.counters()
	c.Dropped, c.Throttled = h.dropped.Load(), h.throttled.Load()
	return c
}

// CountsNote is the service's metadata "counts", which `nats micro info` shows above micro's
// figures: what they count, and where the answers are counted.
const CountsNote = "micro: requests and their hand-off; data: the answers, refusals included"

// PendingMsgs and PendingBytes bound what each endpoint holds delivered and not yet handed to
// its pool (the handler waits for a slot while the pool is full). Past them the client library
// drops the request (the caller times out; micro counts it in the endpoint's num_errors as a
// slow consumer) instead of buffering a flood until the broker cuts the serving connection: a
// serving connection holds at most 5 × PendingBytes of requests.
const (
	PendingMsgs  = 1024
	PendingBytes = 8 << 20
)

// Served is what one Register added: the service instance, and each endpoint's pool.
type Served struct {
	Service micro.Service
	pools   []*pool
}

// Stop stops the service instance, then waits until the answers under way are sent, until by
// at the latest. A request micro delivers after that is answered on its handler.
func (s *Served) Stop(by time.Time) error {
	var errs []error
	if s.Service != nil {
		if err := s.Service.Stop(); err != nil {
			errs = append(errs, err)
		}
	}
	under := 0
	for _, p := range s.pools {
		if !p.wait(by) {
			under++
		}
	}
	if under > 0 {
		errs = append(errs, fmt.Errorf("answers of %d endpoints still under way at the stop's deadline", under))
	}
	return errors.Join(errs...)
}

// Register adds one micro service instance of cfg to nc serving every endpoint of fns in cfg's
// queue group, so `nats micro stats` shows one row per endpoint and replica. micro hands an
// endpoint's requests to its handler one at a time; a request mostly waits on the stores, so
// the handler hands it to the endpoint's pool, which answers at most inFlight at once (past
// them the handler waits for a slot, and the connection holds the rest, up to PendingMsgs and
// PendingBytes), and returns. Each endpoint has its own pool: a slow one (supervisor-end waits on the revocation
// set's round) never holds up another.
func (b *Bus) Register(nc *nats.Conn, cfg micro.Config, fns map[string]Func, inFlight int) (*Served, error) {
	served := &Served{}
	cfg.StatsHandler = Stats
	cfg.Metadata = maps.Clone(cfg.Metadata)
	if cfg.Metadata == nil {
		cfg.Metadata = map[string]string{}
	}
	cfg.Metadata["counts"] = CountsNote
	svc, err := micro.AddService(nc, cfg)
	if err != nil {
		return served, fmt.Errorf("micro service %s: %w", cfg.Name, err)
	}
	served.Service = svc
	group := svc.AddGroup(subjects.AuthPrefix(b.Space))
	for _, name := range subjects.Endpoints {
		fn, ok := fns[name]
		if !ok {
			return served, fmt.Errorf("endpoint %s has no handler", name)
		}
		h := &endpoint{bus: b, name: name, fn: fn, pool: newPool(nc, max(inFlight, 1))}
		served.pools = append(served.pools, h.pool)
		if err := group.AddEndpoint(name, h, micro.WithEndpointSubject(subjects.EndpointPattern(name)),
			micro.WithEndpointPendingLimits(PendingMsgs, PendingBytes)); err != nil {
			return served, fmt.Errorf("register endpoint %s: %w", name, err)
		}
	}
	return served, nil
}

// endpoint is one endpoint of the service instance.
type endpoint struct {
	bus       *Bus
	name      string
	fn        Func
	pool      *pool
	answers   answers
	dropped   atomic.Uint64
	throttled atomic.Uint64
}

// Handle takes one request: the guard's Enter on the handler, then the answer on a goroutine of
// the pool once a slot is free, or on the handler once the service stopped. Either way the answer is published on the connection and counted
// in the endpoint's data.
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
	p := h.pool
	a := p.answerTo(req, &h.answers)
	// The guard's cheap checks come first, on micro's goroutine: a flood past them is answered
	// here, before it waits for a slot of the pool or does any store work.
	leave, refusal := b.Guard.Enter(call)
	if refusal != nil {
		defer a.done()
		h.answer(a, nil, refusal)
		return
	}
	if p.take() {
		go func() {
			defer p.give()
			defer a.done()
			defer leave()
			h.serve(a, call, leave)
		}()
		return
	}
	defer a.done()
	defer leave()
	h.serve(a, call, leave)
}

// serve answers call, which the guard let in, on req. The call leaves the guard before its
// answer is sent: a caller that sends its next call on the answer must find the owner's slot
// free, or an owner keeping --owner-in-flight calls under way would be refused. (leave runs
// once however often it is called; Handle defers it too, for a panic.)
func (h *endpoint) serve(req micro.Request, call Call, leave func()) {
	reply, refusal := h.bus.Guard.Run(call, h.fn)
	leave()
	h.answer(req, reply, refusal)
}

// answer sends reply, or refusal when it is not nil, on req.
func (h *endpoint) answer(req micro.Request, reply any, refusal *fault.Error) {
	var err error
	if refusal != nil {
		if errors.Is(refusal, ErrThrottled) {
			h.throttled.Add(1)
		}
		err = respondError(req, refusal)
	} else {
		var data []byte
		if data, err = fault.Encode(reply); err == nil {
			err = req.Respond(data)
		}
	}
	if err != nil {
		h.bus.Log.Warn("reply not sent", "endpoint", h.name, "err", err)
	}
}

// drop counts a request dropped without an answer and logs it: the 1st, 2nd, 4th, 8th… of
// each endpoint, so a caller cannot flood the log with them; the count says how many there were.
func (h *endpoint) drop(why string, attrs ...any) {
	n := h.dropped.Add(1)
	if fault.Sparse(n) {
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
	data, err := fault.Encode(client.ErrorBody{Error: w})
	if err != nil {
		return err
	}
	full := micro.WithHeaders(micro.Headers{micro.ErrorHeader: {w.Code + ": " + w.Message}})
	return req.Error(strconv.Itoa(fault.Code(w.Code).Numeric()), w.Code, data, full)
}
