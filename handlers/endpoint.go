package handlers

import (
	"context"
	"encoding/json"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/micro"

	"github.com/cotal-ai/authplane/internal/fault"
	"github.com/cotal-ai/authplane/internal/records"
	"github.com/cotal-ai/authplane/subjects"
)

// Call is one request that passed the reply check and the rate limit. The caller comes from
// the subject, never from the body.
type Call struct {
	Owner string
	Actor string
	Data  []byte
	// Note describes the request for its records; a handler fills in what it learns (kind,
	// operation, instance, request id) as it parses.
	Note *records.Request
}

// Principal is the caller's `<owner>.<actor>`.
func (c *Call) Principal() string { return subjects.Principal(c.Owner, c.Actor) }

// Func serves one call: a reply to send as JSON, or an error (a *fault.Error; anything else is
// answered `internal`).
type Func func(ctx context.Context, c *Call) (any, error)

// Unimplemented is the Func of an endpoint whose capability has not landed: it refuses every
// call with `unimplemented`, never a fake success.
func Unimplemented(endpoint string) Func {
	return func(context.Context, *Call) (any, error) {
		return nil, fault.New(fault.Unimplemented, "%s is not implemented by this plane yet", endpoint)
	}
}

// Recorder records a decision (and logs it); a failed write is its own to log.
type Recorder interface {
	Record(ctx context.Context, d records.Decision)
}

// Guard is what every endpoint shares: the space, the limits, the recorder and the fence.
type Guard struct {
	Space    string
	Timeout  time.Duration
	Limiter  *Limiter
	Recorder Recorder
	Log      *slog.Logger
	// Fenced reports that the plane has been fenced by a newer registration: it answers
	// `unavailable` from then on, in flight too.
	Fenced func() bool
}

// handler is one registered copy of an endpoint. micro runs each copy's requests one at a
// time and takes its stats when Handle returns, so the plane registers several copies.
type handler struct {
	guard     *Guard
	endpoint  string
	fn        Func
	dropped   atomic.Uint64
	throttled atomic.Uint64
}

// Counters is what a copy reports in `nats micro stats` beside micro's own numbers.
type Counters struct {
	// Dropped counts requests answered with nothing because their reply subject was not the
	// caller's inbox (or their subject named no principal).
	Dropped uint64 `json:"dropped"`
	// Throttled counts requests refused by the per-principal rate limit.
	Throttled uint64 `json:"throttled"`
}

// Stats returns the counters of a registered endpoint copy, for micro's StatsHandler.
func Stats(e *micro.Endpoint) any {
	if h, ok := e.Handler.(*handler); ok {
		return Counters{Dropped: h.dropped.Load(), Throttled: h.throttled.Load()}
	}
	return nil
}

// Handle serves one request.
func (h *handler) Handle(req micro.Request) {
	g := h.guard
	endpoint, owner, actor, ok := subjects.ParseEndpointSubject(g.Space, req.Subject())
	if !ok || endpoint != h.endpoint {
		h.drop("subject names no principal", "subject", req.Subject())
		return
	}
	if !subjects.ReplyAllowed(req.Reply(), owner, actor) {
		h.drop("reply subject is not the caller's inbox", "caller", subjects.Principal(owner, actor), "reply", req.Reply())
		return
	}
	if !g.Limiter.Allow(subjects.Principal(owner, actor)) {
		h.throttled.Add(1)
		h.respond(req, nil, fault.New(fault.ResourceExhausted, "too many requests from %s; slow down", subjects.Principal(owner, actor)))
		return
	}
	call := &Call{Owner: owner, Actor: actor, Data: req.Data(),
		Note: &records.Request{Endpoint: h.endpoint, Caller: subjects.Principal(owner, actor)}}
	var reply any
	var err error = errFenced
	if !g.Fenced() {
		ctx, cancel := context.WithTimeout(context.Background(), g.Timeout)
		reply, err = h.fn(ctx, call)
		cancel()
	}
	switch {
	case err == nil && g.Fenced():
		// It committed before the fence, but a fenced plane answers nothing more: withhold it,
		// and record what is withheld.
		var creds []records.Credential
		if m, ok := reply.(mintedReply); ok {
			creds = m.MintedCredentials()
		}
		h.record(records.Discarded, call, errFenced, creds)
		reply, err = nil, errFenced
	case err != nil:
		if f := fault.As(err); !f.Recorded {
			h.record(records.Refused, call, f, nil)
		}
		if g.Fenced() {
			err = errFenced // in flight when the fence came: answered unavailable
		}
	}
	h.respond(req, reply, err)
}

// mintedReply is a reply that carries credentials.
type mintedReply interface {
	MintedCredentials() []records.Credential
}

// drop counts a request dropped without an answer and logs it: the 1st, 2nd, 4th, 8th… of
// each copy, so a caller cannot flood the log with them; the count says how many there were.
func (h *handler) drop(why string, attrs ...any) {
	n := h.dropped.Add(1)
	if n&(n-1) == 0 {
		h.guard.Log.Warn("dropped request: "+why, append([]any{"endpoint", h.endpoint, "dropped", n}, attrs...)...)
	}
}

// record writes one decision about call, with its own context (the request's may have run
// out). A failed write is logged by the recorder; the decision stands.
func (h *handler) record(decision string, call *Call, f *fault.Error, creds []records.Credential) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	h.guard.Recorder.Record(ctx, records.Decision{Decision: decision, Request: *call.Note,
		Code: string(f.Code), Message: f.Message, Credentials: creds, Cause: f.Cause})
}

var errFenced = fault.New(fault.Unavailable, "this authority plane is momentarily unavailable (fenced by a newer instance); retry shortly")

func (h *handler) respond(req micro.Request, reply any, err error) {
	var rerr error
	if err != nil {
		rerr = respondError(req, fault.As(err))
	} else {
		var data []byte
		if data, rerr = json.Marshal(reply); rerr == nil {
			rerr = req.Respond(data)
		}
	}
	if rerr != nil {
		h.guard.Log.Warn("reply not sent", "endpoint", h.endpoint, "err", rerr)
	}
}

// Register adds endpoint to group `workers` times on its subject, each copy a handler of its
// own so requests run in parallel and every copy's stats stay truthful.
func Register(g micro.Group, guard *Guard, endpoint string, fn Func, workers int) error {
	for range max(workers, 1) {
		h := &handler{guard: guard, endpoint: endpoint, fn: fn}
		if err := g.AddEndpoint(endpoint, h, micro.WithEndpointSubject(subjects.EndpointPattern(endpoint))); err != nil {
			return err
		}
	}
	return nil
}
