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
}

// Stats returns the counters of a registered endpoint, for micro's StatsHandler.
func Stats(e *micro.Endpoint) any {
	if h, ok := e.Handler.(*endpoint); ok {
		return Counters{Dropped: h.dropped.Load(), Throttled: h.throttled.Load()}
	}
	return nil
}

// Register adds `workers` micro service instances of cfg to nc, each serving every endpoint of
// fns in cfg's queue group. micro runs an endpoint's requests one at a time and takes its stats
// when the handler returns, so the plane serves in parallel with instances, not copies: `nats
// micro info` shows each endpoint once, and `nats micro stats` one row per instance. Each
// instance's metadata says which worker it is.
func (b *Bus) Register(nc *nats.Conn, cfg micro.Config, fns map[string]Func, workers int) ([]micro.Service, error) {
	var svcs []micro.Service
	for w := range max(workers, 1) {
		c := cfg
		c.Metadata = map[string]string{"worker": strconv.Itoa(w)}
		for k, v := range cfg.Metadata {
			c.Metadata[k] = v
		}
		c.StatsHandler = Stats
		svc, err := micro.AddService(nc, c)
		if err != nil {
			return svcs, fmt.Errorf("micro service %s worker %d: %w", c.Name, w, err)
		}
		svcs = append(svcs, svc)
		group := svc.AddGroup(subjects.AuthPrefix(b.Space))
		for _, name := range subjects.Endpoints {
			fn, ok := fns[name]
			if !ok {
				return svcs, fmt.Errorf("endpoint %s has no handler", name)
			}
			h := &endpoint{bus: b, name: name, fn: fn}
			if err := group.AddEndpoint(name, h, micro.WithEndpointSubject(subjects.EndpointPattern(name))); err != nil {
				return svcs, fmt.Errorf("register endpoint %s: %w", name, err)
			}
		}
	}
	return svcs, nil
}

// endpoint is one endpoint of one service instance.
type endpoint struct {
	bus       *Bus
	name      string
	fn        Func
	dropped   atomic.Uint64
	throttled atomic.Uint64
}

// Handle serves one request.
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
	reply, refusal := b.Guard.Serve(Call{Endpoint: name, Owner: owner, Actor: actor, Body: req.Data(), Deadline: time.Now().Add(b.Timeout)}, h.fn)
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
	if n&(n-1) == 0 {
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
