package handlers

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/cotal-ai/authplane/internal/core/audit"
	"github.com/cotal-ai/authplane/internal/core/fault"
	"github.com/cotal-ai/authplane/internal/core/issue"
	"github.com/cotal-ai/authplane/internal/platform/metrics"
	"github.com/cotal-ai/authplane/subjects"
)

// Call is one request as any transport hands it to the guard: the endpoint, the principal the
// transport vouches for (on the bus, the subject's last two tokens, which the broker
// forge-locks), the body, and the deadline of all its work, retries and records included.
type Call struct {
	Endpoint string
	Owner    string
	Actor    string
	Body     []byte
	Deadline time.Time
}

// Principal is the caller's `<owner>.<actor>`.
func (c Call) Principal() string { return subjects.Principal(c.Owner, c.Actor) }

// About is what every record of the call starts from: its endpoint and its caller.
func (c Call) About() audit.Request {
	return audit.Request{Endpoint: c.Endpoint, Caller: c.Principal()}
}

// Func serves one call that passed the guard. It returns the reply to send (as JSON) or a
// refusal (a *fault.Error; anything else is answered `internal`), and, whichever it returns,
// what the call was about as far as it parsed (c.About() plus only what passed its grammar),
// for the refusal's record.
type Func func(ctx context.Context, c Call) (reply any, about audit.Request, err error)

// DefaultOwnerInFlight is how many requests of one endpoint one owner may have under way at
// once in one process unless --owner-in-flight says otherwise: a quarter of the answers each
// endpoint's pool holds at once on a 2-CPU replica (--workers), so an owner's flood of an
// endpoint leaves the rest of its pool to the other owners.
const DefaultOwnerInFlight = 8

// Refusals records refused calls.
type Refusals interface {
	Refused(ctx context.Context, req audit.Request, refusal *fault.Error)
}

// Guard is what every call passes, whatever carried it (the bus, the HTTP face, the auth
// callout): a valid principal, the per-principal rate limit, its owner's calls under way on the
// endpoint, the deadline, the plane's own fence, and the refusal record. Decisions are recorded
// in two places only: the guard records `refused`; the issuance pipeline records `minted` and
// `discarded`.
type Guard struct {
	Limiter *issue.Buckets
	// OwnerInFlight bounds each owner's calls under way at once on each endpoint, in this
	// process (0: unbounded), so a flood by one owner holds at most that many of the service
	// instances and the detached slots; the callout's decisions are bounded by its own queue.
	OwnerInFlight int
	Audit         Refusals
	// Fenced reports that the plane has been fenced by a newer registration: it answers
	// `unavailable` from then on, in flight too. Nil: never.
	Fenced func() bool
	// Draining reports that the plane is stopping: a call that arrives then is answered
	// `unavailable` before any work; calls in flight finish. Nil: never.
	Draining func() bool
	// Unsynced reports that a server of the broker does not sync every write and the operator
	// did not accept it (--allow-unsynced): a call is answered `unavailable` before any work
	// until it does. Nil: never.
	Unsynced func() bool
	// Metrics counts every call and its latency; nil counts nothing.
	Metrics *metrics.Metrics

	once     sync.Once
	inFlight *slots // per endpoint and owner
}

func (g *Guard) fenced() bool { return g.Fenced != nil && g.Fenced() }

func (g *Guard) draining() bool { return g.Draining != nil && g.Draining() }

func (g *Guard) unsynced() bool { return g.Unsynced != nil && g.Unsynced() }

// Refused records a refusal made before a call could be made of a request: a door that could
// not yet name its caller ("_._").
func (g *Guard) Refused(ctx context.Context, about audit.Request, refusal *fault.Error) {
	g.Metrics.Refused(about.Endpoint, string(refusal.Code))
	g.Audit.Refused(ctx, about, refusal)
}

// ErrThrottled is the cause of a refusal by the rate limit: counted by the transport, not
// recorded.
var ErrThrottled = errors.New("throttled")

// errFenced answers every call once the plane is fenced.
var errFenced = fault.New(fault.Unavailable, "this authority plane is momentarily unavailable (fenced by a newer instance); retry shortly")

// errDraining answers a call that arrives while the plane stops.
var errDraining = fault.New(fault.Unavailable, "this authority plane is stopping and takes no new request; retry shortly")

// errUnsynced answers a call while a server of the broker does not sync every write.
var errUnsynced = fault.New(fault.Unavailable, "this authority plane is unavailable: a server of its broker does not sync every write to disk; retry later")

// ErrOwnerBusy is in the chain of a refusal of a call whose owner has OwnerInFlight calls of
// the endpoint under way: counted with the throttled, not recorded.
var ErrOwnerBusy = fmt.Errorf("the owner's calls under way: %w", ErrThrottled)

// Serve runs fn for c if c passes every check (Enter, then Run), and returns the reply or the
// refusal.
func (g *Guard) Serve(c Call, fn Func) (reply any, refusal *fault.Error) {
	leave, refusal := g.Enter(c)
	if refusal != nil {
		return nil, refusal
	}
	defer leave()
	return g.Run(c, fn)
}

// Enter admits c, or refuses it before any store work: c names a valid principal
// (bad-request otherwise); the principal is within its rate (resource-exhausted wrapping
// ErrThrottled); its owner has fewer than OwnerInFlight calls of the endpoint under way
// (resource-exhausted wrapping ErrOwnerBusy). Neither refusal is recorded, so a flood costs no
// write. leave ends the call's stay: it must be called once c's work is done.
func (g *Guard) Enter(c Call) (leave func(), refusal *fault.Error) {
	if !subjects.ValidOwner(c.Owner) || !subjects.ValidActor(c.Actor) {
		g.Metrics.Refused(c.Endpoint, string(fault.BadRequest))
		return nil, fault.New(fault.BadRequest, "the request names no valid principal")
	}
	if !g.Limiter.Allow(c.Principal()) {
		g.Metrics.Refused(c.Endpoint, string(fault.ResourceExhausted))
		return nil, fault.Wrap(fault.ResourceExhausted, ErrThrottled, "too many requests from %s; slow down", c.Principal())
	}
	if g.OwnerInFlight <= 0 || c.Endpoint == EndpointCallout {
		return func() {}, nil
	}
	g.once.Do(func() { g.inFlight = newSlots(g.OwnerInFlight) })
	key := c.Endpoint + " " + c.Owner
	if !g.inFlight.take(key) {
		g.Metrics.Refused(c.Endpoint, string(fault.ResourceExhausted))
		g.Metrics.TenantBudgetRefused(issue.OwnerInFlight)
		return nil, fault.Wrap(fault.ResourceExhausted, ErrOwnerBusy, "owner %s has %d %s requests under way, the most it may at once (--owner-in-flight); retry shortly", c.Owner, g.OwnerInFlight, c.Endpoint)
	}
	var once sync.Once
	return func() { once.Do(func() { g.inFlight.give(key) }) }, nil
}

// Run runs fn for c, which Enter admitted, and returns the reply or the refusal: unavailable
// when the plane is fenced, stopping, or on a server that does not sync every write; otherwise
// fn, whose work must end a tenth of the time
// before c's deadline so the refusal record still fits in it. Every refusal is recorded.
// Anything answered while the plane was being fenced is answered `unavailable`
// (docs/OPERATIONS.md, "What it runs": the plane's own instance): a refusal keeps its own code
// in its record, and a mint that committed just then was withheld and recorded `discarded` by
// the pipeline.
func (g *Guard) Run(c Call, fn Func) (reply any, refusal *fault.Error) {
	start := time.Now()
	about := c.About()
	defer func() {
		code := metrics.CodeOK
		if refusal != nil {
			code = string(refusal.Code)
		}
		g.Metrics.Served(c.Endpoint, code, time.Since(start))
	}()
	ctx, cancel := context.WithDeadline(context.Background(), c.Deadline)
	defer cancel()
	var err error
	switch {
	case g.fenced():
		err = errFenced
	case g.draining():
		err = errDraining // no new work once the stop began; calls in flight finish
	case g.unsynced():
		err = errUnsynced // nothing it would write could be counted on
	default:
		work, stop := audit.Reserve(ctx)
		reply, about, err = fn(work, c)
		stop()
	}
	if err == nil && !g.fenced() {
		return reply, nil
	}
	if err == nil {
		return nil, errFenced // served as the fence came: no more answers but unavailable
	}
	refusal = fault.As(err)
	if past := (*issue.Exceeded)(nil); errors.As(refusal.Cause, &past) {
		g.Metrics.TenantBudgetRefused(past.Budget)
	}
	if !errors.Is(refusal, issue.ErrDiscarded) { // a discarded mint is already on record
		g.Audit.Refused(ctx, about, refusal)
	}
	if g.fenced() {
		refusal = errFenced // in flight when the fence came: answered unavailable
	}
	return nil, refusal
}
