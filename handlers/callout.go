package handlers

import (
	"context"
	"errors"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"

	"github.com/cotal-ai/authplane/internal/capability/bearer"
	"github.com/cotal-ai/authplane/internal/capability/manager"
	"github.com/cotal-ai/authplane/internal/core/audit"
	"github.com/cotal-ai/authplane/internal/core/fault"
	"github.com/cotal-ai/authplane/internal/core/fence"
	"github.com/cotal-ai/authplane/internal/core/issue"
	"github.com/cotal-ai/authplane/internal/platform/conns"
	"github.com/cotal-ai/authplane/subjects"
)

// The auth callout's names and bounds.
const (
	// EndpointCallout names the callout in its records.
	EndpointCallout = "auth-callout"
	// CalloutSubject is where the broker asks; CalloutQueue the queue group its replicas share.
	CalloutSubject = "$SYS.REQ.USER.AUTH"
	CalloutQueue   = "cotal-auth-callout"
	// CalloutDeadline bounds one decision, from the request's arrival: the broker waits two
	// seconds for the answer.
	CalloutDeadline = 1800 * time.Millisecond
	// CalloutInFlight bounds the decisions under way; past it a request waits in a backlog of
	// at most CalloutBacklog (past that the oldest waiting is dropped, and the broker refuses
	// that connection when its wait runs out). See calloutQueue for the order they are taken in,
	// and for the bound, which falls to CalloutMinInFlight while decisions are slow.
	CalloutInFlight    = 256
	CalloutMinInFlight = 8
	CalloutBacklog     = 8192
	// CalloutSlow is how long a decision takes, from its start, when the stores behind it are
	// congested: each one that slow halves the decisions let under way at once (at most once
	// per CalloutSlow), and each one under half of it lets one more.
	CalloutSlow = 600 * time.Millisecond
	// CalloutQueueWait is the longest a request waits in the backlog for its decision to start.
	// One that waited longer is dropped unanswered, as the broker will have given up on it
	// before an answer came: in a reconnect storm the decisions go to requests the broker still
	// waits for, and a client refused retries. Dropping at once instead of queueing refused
	// 982 of the first 1,000 attempts of a storm that the callout answered in under 10 s.
	CalloutQueueWait = time.Second
	// CalloutCongested is how long the oldest waiting request has waited when the backlog is
	// taken newest first (see calloutQueue).
	CalloutCongested = 100 * time.Millisecond
	// xkeyHeader carries the server's curve key, which sealed the request.
	xkeyHeader = "Nats-Server-Xkey"
)

// Callout serves the broker's auth callout for the callout account (docs/PROTOCOL.md, "The HTTP face"): a client that
// connects with the deny-all sentinel creds and a plane bearer as its token gets a user of the
// data account, scoped by its ledger row and the bearer's view, that expires with the bearer.
// Requests and answers are sealed with the callout's curve key; an answer is signed with the
// callout account's signing key. A request that is not the broker's, properly sealed and
// signed, gets no answer at all.
type Callout struct {
	Space    string
	Guard    *Guard
	Keys     *bearer.Keys
	Ledger   fence.KV
	Pipeline *issue.Pipeline
	// Account is the callout account's public key, Signer its signing key.
	Account string
	Signer  nkeys.KeyPair
	// XKey opens requests and seals answers.
	XKey nkeys.KeyPair
	Log  *slog.Logger
	// Conns holds each principal to its connection cap and the tenants to their share of the
	// data account; nil admits every connection.
	Conns Admitter
	// Refused counts a connection Conns refused, by budget; nil counts nothing.
	Refused func(budget string)

	once  sync.Once
	queue *calloutQueue
}

// Subscribe serves the callout on nc (a connection of the callout user) until the
// subscription ends: at most CalloutInFlight requests are decided at once, the rest wait their
// turn (calloutQueue).
func (c *Callout) Subscribe(nc *nats.Conn) (*nats.Subscription, error) {
	c.once.Do(func() { c.queue = newCalloutQueue(CalloutInFlight, CalloutBacklog, time.Now, c.serve, c.Log) })
	return nc.QueueSubscribe(CalloutSubject, CalloutQueue, func(m *nats.Msg) {
		c.queue.take(calloutRequest{m: m, at: time.Now()})
	})
}

// serve answers one request, or drops it when it is not the broker's.
func (c *Callout) serve(r calloutRequest) {
	m := r.m
	answer, serverXKey, ok := c.decide(r.at.Add(CalloutDeadline), m.Header.Get(xkeyHeader), m.Data)
	if !ok {
		return
	}
	sealed, err := c.XKey.Seal(answer, serverXKey)
	if err != nil {
		c.Log.Warn("auth callout: sealing the answer failed", "err", err)
		return
	}
	if err := m.Respond(sealed); err != nil {
		c.Log.Warn("auth callout: the answer was not sent", "err", err)
	}
}

// decide opens a sealed request and returns the signed answer, due by deadline, unsealed, and
// the server's curve key to seal it for; ok is false when the request gets no answer at all: no
// curve key, a seal that does not open, claims that are not a server's signed request, or a
// server key that differs from the one it sealed with.
func (c *Callout) decide(deadline time.Time, serverXKey string, sealed []byte) (answer []byte, xkey string, ok bool) {
	if serverXKey == "" {
		c.Log.Debug("auth callout: a request without the server's curve key dropped")
		return nil, "", false
	}
	plain, err := c.XKey.Open(sealed, serverXKey)
	if err != nil {
		c.Log.Debug("auth callout: a request that does not open dropped")
		return nil, "", false
	}
	req, err := jwt.DecodeAuthorizationRequestClaims(string(plain))
	if err != nil {
		c.Log.Debug("auth callout: a request that is not an authorization request dropped")
		return nil, "", false
	}
	vr := jwt.CreateValidationResults()
	req.Validate(vr)
	switch {
	case vr.IsBlocking(true):
		c.Log.Debug("auth callout: an invalid authorization request dropped")
		return nil, "", false
	case req.Issuer != req.Server.ID || !nkeys.IsValidPublicServerKey(req.Issuer):
		c.Log.Debug("auth callout: a request not signed by the server it names dropped")
		return nil, "", false
	case req.Server.XKey != serverXKey:
		c.Log.Debug("auth callout: a request whose signed curve key is not the one it was sealed with dropped")
		return nil, "", false
	case !subjects.ValidUserNKey(req.UserNkey):
		c.Log.Debug("auth callout: a request for no user key dropped")
		return nil, "", false
	}
	res := jwt.NewAuthorizationResponseClaims(req.UserNkey)
	res.Audience = req.Server.ID
	res.IssuerAccount = c.Account
	user, refusal := c.authorize(deadline, req)
	if refusal != nil {
		res.Error = refusal.Message
	} else {
		res.Jwt = user
	}
	token, err := res.Encode(c.Signer)
	if err != nil {
		c.Log.Warn("auth callout: signing the answer failed", "err", err)
		return nil, "", false
	}
	return []byte(token), serverXKey, true
}

// authorize decides who the connection is: the bearer validated against the published key
// set, then, through the one guard, its principal's ledger row read now and a user minted on
// it for the broker's user key.
func (c *Callout) authorize(deadline time.Time, req *jwt.AuthorizationRequestClaims) (string, *fault.Error) {
	token := req.ConnectOptions.Token
	ctx, cancel := context.WithDeadline(context.Background(), deadline)
	defer cancel()
	if token == "" {
		return "", c.refuse(ctx, fault.New(fault.Unauthenticated, "connect with the bundle's sentinel creds and a bearer from /exchange as the token"))
	}
	if len(token) > bearer.MaxToken {
		return "", c.refuse(ctx, fault.New(fault.Unauthenticated, "the token is over %d bytes; it is no bearer", bearer.MaxToken))
	}
	claims, err := c.Keys.Validate(ctx, c.Space, token)
	switch {
	case errors.Is(err, bearer.ErrRefused):
		return "", c.refuse(ctx, fault.New(fault.Unauthenticated, "the bearer is refused: %s", err))
	case err != nil:
		return "", c.refuse(ctx, fault.Store(err, "reading the bearer keys"))
	}
	// The deadline is a timeout (the broker waits CalloutDeadline of real time from the
	// request's arrival), not a time of the plane's clock: every decision on time (the bearer's
	// expiry, the user's) is the pipeline's, on the injected clock.
	call := Call{Endpoint: EndpointCallout, Owner: claims.Owner, Actor: claims.Actor, Deadline: deadline}
	reply, refusal := c.Guard.Serve(call, func(ctx context.Context, call Call) (any, audit.Request, error) {
		about := call.About()
		about.Kind = claims.View
		release, err := c.admit(call.Owner, call.Principal())
		if err != nil {
			return nil, about, err
		}
		user, err := c.mint(ctx, claims, req.UserNkey, about)
		if err != nil {
			release()
		}
		return user, about, err
	})
	if refusal != nil {
		return "", refusal
	}
	return reply.(string), nil
}

// Admitter holds connections to their budgets (conns.Ledger): Admit takes a slot for a
// connection of principal about to be let in, or refuses it (an error that errors.Is one of
// the budget's sentinels, conns.ErrPrincipalFull, conns.ErrOwnerFull, conns.ErrTenantsFull or
// conns.ErrBackingOff).
type Admitter interface {
	Admit(principal string) (release func(), err error)
}

// admit takes the connection's slot for principal, of owner: a principal or an owner past its
// cap, or a space whose tenants hold their whole share of the data account, is refused before
// anything is signed.
func (c *Callout) admit(owner, principal string) (release func(), err error) {
	if c.Conns == nil {
		return func() {}, nil
	}
	release, err = c.Conns.Admit(principal)
	switch {
	case errors.Is(err, conns.ErrPrincipalFull):
		c.refused(conns.BudgetPrincipal)
		return nil, fault.New(fault.ResourceExhausted, "%s: %s; close one first", principal, err)
	case errors.Is(err, conns.ErrOwnerFull):
		c.refused(conns.BudgetOwner)
		return nil, fault.New(fault.ResourceExhausted, "owner %s: %s; close one first", owner, err)
	case errors.Is(err, conns.ErrBackingOff):
		c.refused(conns.BudgetBackoff)
		return nil, fault.New(fault.ResourceExhausted, "%s: %s; retry in a few seconds", principal, err)
	case errors.Is(err, conns.ErrTenantsFull):
		c.refused(conns.BudgetTenants)
		return nil, fault.New(fault.ResourceExhausted, "%s; retry later", err)
	case err != nil:
		return nil, fault.Wrap(fault.Internal, err, "counting the connections")
	}
	return release, nil
}

func (c *Callout) refused(budget string) {
	if c.Refused != nil {
		c.Refused(budget)
	}
}

// mint signs the connection's user: the principal's ledger row must exist now, still hold
// every scope the bearer carries (and, for an agent, its secret), and grant `admin` for the ops
// view. The user commits on that row as read: a grant changed meanwhile discards it.
func (c *Callout) mint(ctx context.Context, claims bearer.Claims, userKey string, about audit.Request) (string, error) {
	o, err := manager.ActorOf(c.Ledger, claims.Owner, claims.Actor).Observe(ctx)
	principal := subjects.Principal(claims.Owner, claims.Actor)
	switch {
	case errors.Is(err, fence.ErrGone) || errors.Is(err, fence.ErrMalformed) || (err == nil && o.Absent()):
		return "", fault.New(fault.PermissionDenied, "%s has no ledger row now", principal)
	case err != nil:
		return "", fault.Store(err, "reading the ledger")
	case claims.Agent && o.Row.TokenHash == "":
		return "", fault.New(fault.PermissionDenied, "the agent %s was revoked", principal)
	case slices.ContainsFunc(claims.Scope, func(s string) bool { return !o.Row.Has(s) }):
		return "", fault.New(fault.PermissionDenied, "the grant of %s changed since its bearer was issued: exchange again", principal)
	case claims.View == bearer.ViewOps && !o.Row.Has(manager.Admin):
		return "", fault.New(fault.PermissionDenied, "view ops needs scope %q", manager.Admin)
	}
	duty := subjects.DutyCaller
	if claims.View == bearer.ViewOps {
		duty = subjects.DutyOps
	}
	_, perms, err := subjects.PermissionsOf(duty, subjects.Holder{Space: c.Space, Owner: claims.Owner, Actor: claims.Actor})
	if err != nil {
		return "", fault.Wrap(fault.Internal, err, "the %s permissions", duty)
	}
	issued, err := c.Pipeline.Issue(ctx, issue.Plan{
		Instance: issue.ServerChosen(claims.Owner), // the broker chose the key for this one connection
		Request:  about,
		Grants:   []issue.Grant{{Duty: duty, Key: userKey, Principal: principal, TTL: bearer.MaxTTL + bearer.Skew, Permissions: perms}},
		Ceiling:  issue.Ceiling{At: claims.Expires, What: "the bearer"},
		Steps:    []issue.Step{issue.Unchanged(o)},
	})
	if err != nil {
		return "", err
	}
	return issued.Credentials[0].JWT, nil
}

// refuse records a refusal made before the bearer named its principal, and returns it.
func (c *Callout) refuse(ctx context.Context, refusal *fault.Error) *fault.Error {
	c.Guard.Refused(ctx, audit.Request{Endpoint: EndpointCallout, Caller: subjects.Principal("_", "_")}, refusal)
	return refusal
}
