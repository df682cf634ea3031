package handlers

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"encoding/json"
	"errors"
	"strings"
	"time"

	"github.com/cotal-ai/authplane/internal/capability/bearer"
	"github.com/cotal-ai/authplane/internal/capability/manager"
	"github.com/cotal-ai/authplane/internal/core/audit"
	"github.com/cotal-ai/authplane/internal/core/fault"
	"github.com/cotal-ai/authplane/subjects"
)

// Endpoint names of the HTTP doors, in their records.
const (
	EndpointExchange                = "exchange"
	EndpointManagerServiceAuthority = "manager-service-authority"
)

// AgentBearerTTL bounds an agent's bearer.
const AgentBearerTTL = 300 * time.Second

// exchangeBody is `POST /exchange`'s body: a human's IdP token, or an agent's owner and secret.
type exchangeBody struct {
	IdPToken   *string `json:"idpToken"`
	Actor      *string `json:"actor"`
	ActorToken *string `json:"actorToken"`
	Owner      *string `json:"owner"`
	TTLSec     *int64  `json:"ttlSec"`
	View       *string `json:"view"`
}

// ExchangeReply is what `POST /exchange` answers: a bearer, whose it is, and until when
// (seconds).
type ExchangeReply struct {
	Token string `json:"token"`
	Owner string `json:"owner"`
	Exp   int64  `json:"exp"`
}

// errAgent is the one answer an agent gets for an unknown agent and a wrong secret alike: no
// existence oracle.
var errAgent = fault.New(fault.Unauthenticated, "agent exchange refused: unknown agent or wrong secret - if this agent should exist, respawn it to rotate its grant")

// errTTL refuses a ttlSec off its range: the body's fault (400), not the token's, charged to
// the principal the token or secret proved.
var errTTL = fault.Field("ttlSec", "a bearer lives 1 to %d s", int(bearer.MaxTTL/time.Second))

// errAgentTTL refuses an agent's ttlSec under a second (a longer one is clamped).
var errAgentTTL = fault.Field("ttlSec", "a bearer lives at least 1 s")

// exchange serves `POST /exchange` (docs/PROTOCOL.md, "The HTTP face"), one of two arms per request:
//   - human `{idpToken, actor, ttlSec?, view?}`: the IdP token verified, its subject's owner
//     derived, the principal's ledger row read now; a bearer of at most 900 s and no longer
//     than the IdP token lives;
//   - agent `{owner, actor, actorToken, ttlSec?}`: the secret's SHA-256 against the managed
//     ledger row, in constant time; a bearer of at most 300 s.
//
// The public face serves only the caller view; `ops` needs `admin` and the loopback face.
func (f *face) exchange(ctx context.Context, peer string, data []byte) (any, *fault.Error) {
	var b exchangeBody
	if err := fault.Decode(data, &b); err != nil {
		return nil, f.refuse(ctx, EndpointExchange, "_", "_", fault.As(err))
	}
	view := bearer.ViewCaller
	if b.View != nil {
		view = *b.View
	}
	switch {
	case b.IdPToken != nil && b.ActorToken != nil:
		return nil, f.refuse(ctx, EndpointExchange, "_", "_", fault.New(fault.BadRequest, "exchange takes idpToken (human) OR owner+actorToken (agent), never both"))
	case view != bearer.ViewCaller && view != bearer.ViewOps:
		return nil, f.refuse(ctx, EndpointExchange, "_", "_", fault.Field("view", "want caller or ops"))
	case view != bearer.ViewCaller && f.public:
		return nil, f.refuse(ctx, EndpointExchange, "_", "_", fault.New(fault.PermissionDenied, "elevated views are a loopback operator surface - the public exchange never serves them"))
	case b.ActorToken != nil:
		return f.agentExchange(ctx, &b, view)
	}
	// The refusal names what is missing, for the arm the body is closest to: an owner is an
	// agent's.
	var missing *fault.Error
	switch {
	case b.IdPToken == nil && b.Owner != nil:
		missing = fault.New(fault.BadRequest, "agent exchange is missing actorToken: it takes { owner: string, actor: string, actorToken: string, ttlSec?: number }")
	case b.IdPToken == nil:
		missing = fault.New(fault.BadRequest, "exchange is missing idpToken (a person's: { idpToken: string, actor: string, ttlSec?: number, view?: string }) or owner and actorToken (an agent's: { owner: string, actor: string, actorToken: string, ttlSec?: number })")
	case b.Owner != nil:
		missing = fault.New(fault.BadRequest, "human exchange takes no owner (its IdP token's subject derives it): it takes { idpToken: string, actor: string, ttlSec?: number, view?: string }")
	case b.Actor == nil:
		missing = fault.New(fault.BadRequest, "human exchange is missing actor: it takes { idpToken: string, actor: string, ttlSec?: number, view?: string }")
	}
	if missing != nil {
		return nil, f.refuse(ctx, EndpointExchange, "_", "_", missing)
	}
	sub, owner, refusal := f.verifyIdP(ctx, EndpointExchange, *b.IdPToken)
	if refusal != nil {
		return nil, refusal
	}
	return f.serve(EndpointExchange, owner, *b.Actor, data, func(ctx context.Context, c Call) (any, audit.Request, error) {
		ttl := bearer.MaxTTL
		if b.TTLSec != nil {
			if *b.TTLSec < 1 || *b.TTLSec > int64(bearer.MaxTTL/time.Second) {
				return nil, c.About(), errTTL
			}
			ttl = time.Duration(*b.TTLSec) * time.Second
		}
		if left := sub.Exp.Sub(f.h.Now()); left < ttl {
			ttl = left
		}
		reply, err := f.issueBearer(ctx, c, view, ttl, sub.Exp, false)
		return reply, c.About(), err
	})
}

// agentExchange is the agent arm: the secret is the proof.
func (f *face) agentExchange(ctx context.Context, b *exchangeBody, view string) (any, *fault.Error) {
	if view != bearer.ViewCaller {
		return nil, f.refuse(ctx, EndpointExchange, "_", "_", fault.New(fault.BadRequest, "the managed (agent-secret) exchange never mints elevated views - views ride a signed-in human exchange"))
	}
	if b.Owner == nil || b.Actor == nil {
		var missing []string
		if b.Owner == nil {
			missing = append(missing, "owner")
		}
		if b.Actor == nil {
			missing = append(missing, "actor")
		}
		return nil, f.refuse(ctx, EndpointExchange, "_", "_", fault.New(fault.BadRequest, "agent exchange is missing %s: it takes { owner: string, actor: string, actorToken: string, ttlSec?: number }", strings.Join(missing, " and ")))
	}
	owner, actor := *b.Owner, *b.Actor
	if !subjects.ValidUserOwner(owner) || !subjects.ValidActor(actor) {
		return nil, f.refuse(ctx, EndpointExchange, "_", "_", errAgent)
	}
	// Until the secret matches, the principal is only named, not shown: its refusals are
	// recorded as "_._", so nobody can spend another owner's record budget.
	row, found, err := manager.ReadActor(ctx, f.h.Ledger, owner, actor)
	if err != nil && !errors.Is(err, manager.ErrMalformed) {
		return nil, f.refuse(ctx, EndpointExchange, "_", "_", fault.Store(err, "reading the ledger"))
	}
	sum := sha256.Sum256([]byte(*b.ActorToken))
	want := []byte(row.TokenHash)
	if !found || row.TokenHash == "" || subtle.ConstantTimeCompare([]byte(hex.EncodeToString(sum[:])), want) != 1 {
		return nil, f.refuse(ctx, EndpointExchange, "_", "_", errAgent)
	}
	data, err := json.Marshal(map[string]string{"owner": owner, "actor": actor})
	if err != nil {
		return nil, fault.As(err)
	}
	return f.serve(EndpointExchange, owner, actor, data, func(ctx context.Context, c Call) (any, audit.Request, error) {
		ttl := AgentBearerTTL
		if b.TTLSec != nil {
			if *b.TTLSec < 1 {
				return nil, c.About(), errAgentTTL
			}
			ttl = min(ttl, time.Duration(*b.TTLSec)*time.Second)
		}
		// A bearer's exp is rounded up to the second (it lives at least ttl); an agent's is
		// still never more than AgentBearerTTL past its iat.
		ceiling := time.Unix(f.h.Now().Unix(), 0).Add(AgentBearerTTL)
		reply, err := f.issueBearer(ctx, c, bearer.ViewCaller, ttl, ceiling, true)
		return reply, c.About(), err
	})
}

// issueBearer signs a bearer of ttl, not past ceiling when that is set (the IdP token's exp),
// for the call's principal, whose ledger row is read now: it must exist (and, for an agent,
// still hold its secret), and hold `admin` for the ops view.
func (f *face) issueBearer(ctx context.Context, c Call, view string, ttl time.Duration, ceiling time.Time, agent bool) (any, error) {
	row, found, err := manager.ReadActor(ctx, f.h.Ledger, c.Owner, c.Actor)
	switch {
	case err != nil && !errors.Is(err, manager.ErrMalformed):
		return nil, fault.Store(err, "reading the ledger")
	case !found || (agent && row.TokenHash == ""):
		return nil, fault.New(fault.Unauthenticated, "%s has no ledger row: an operator grants it first", c.Principal())
	case view == bearer.ViewOps && !row.Has(manager.Admin):
		return nil, fault.New(fault.PermissionDenied, "view ops needs scope %q", manager.Admin)
	case ttl < time.Second:
		return nil, fault.New(fault.Unauthenticated, "the IdP token has no life left to lend a bearer")
	}
	token, exp, err := f.h.Keys.Issue(ctx, f.h.Space, bearer.Claims{Owner: c.Owner, Actor: c.Actor, Scope: row.Scope, View: view, Agent: agent, Expires: ceiling}, ttl)
	if err != nil {
		return nil, fault.Store(err, "issuing the bearer")
	}
	f.h.Records.Exchanged(ctx, c.About(), audit.Bearer{View: view, Agent: agent, Exp: exp.Unix()})
	return ExchangeReply{Token: token, Owner: c.Owner, Exp: exp.Unix()}, nil
}

// msaBody is `POST /manager-service-authority`'s body.
type msaBody struct {
	IdPToken *string         `json:"idpToken"`
	Request  json.RawMessage `json:"request"`
}

// managerAuthority serves `POST /manager-service-authority` (docs/PROTOCOL.md, "The HTTP face"): the same dispatcher
// as the bus endpoint, with the owner the IdP token's subject derives as the caller, and the
// request's actor.
func (f *face) managerAuthority(ctx context.Context, peer string, data []byte) (any, *fault.Error) {
	var b msaBody
	if err := fault.Decode(data, &b); err != nil || b.IdPToken == nil || b.Request == nil {
		return nil, f.refuse(ctx, EndpointManagerServiceAuthority, "_", "_", fault.New(fault.BadRequest, "manager-service authority needs { idpToken, request }"))
	}
	actor, err := fault.Peek(b.Request, "actor")
	if err != nil || !subjects.ValidActor(actor) {
		return nil, f.refuse(ctx, EndpointManagerServiceAuthority, "_", "_", fault.Field("request.actor", "want [A-Za-z0-9_]{1,64}"))
	}
	_, owner, refusal := f.verifyIdP(ctx, EndpointManagerServiceAuthority, *b.IdPToken)
	if refusal != nil {
		return nil, refusal
	}
	return f.serve(subjects.EndpointManagerAuthority, owner, actor, b.Request, f.h.Manager)
}

// verifyIdP verifies an IdP token and derives its subject's owner; a refusal is recorded.
func (f *face) verifyIdP(ctx context.Context, endpoint, token string) (bearer.Subject, string, *fault.Error) {
	if f.h.IdP == nil {
		return bearer.Subject{}, "", f.refuse(ctx, endpoint, "_", "_", fault.New(fault.Unimplemented, "this space trusts no identity provider (--idp-url)"))
	}
	sub, err := f.h.IdP.Verify(ctx, token)
	if errors.Is(err, bearer.ErrKeySetUnavailable) {
		// The plane's outage, not the caller's fault; the cause (an address) is for the log.
		f.h.Log.Warn("identity provider key set not fetched", "endpoint", endpoint, "err", errors.Unwrap(err))
		return bearer.Subject{}, "", f.refuse(ctx, endpoint, "_", "_", fault.New(fault.Unavailable, "%s; retry shortly", bearer.ErrKeySetUnavailable))
	}
	if err != nil {
		return bearer.Subject{}, "", f.refuse(ctx, endpoint, "_", "_", fault.New(fault.Unauthenticated, "the IdP token is refused: %s", err))
	}
	return sub, bearer.DeriveOwner(f.h.OwnerSecret, f.h.IdP.Config().Issuer, sub.Sub), nil
}

// serve passes a door's call, its principal authenticated, through the one guard.
func (f *face) serve(endpoint, owner, actor string, data []byte, fn Func) (any, *fault.Error) {
	timeout := f.h.Timeout
	if f.public {
		timeout = min(timeout, PublicDeadline)
	}
	deadline := time.Now().Add(timeout)
	return f.h.Guard.Serve(Call{Endpoint: endpoint, Owner: owner, Actor: actor, Body: data, Deadline: deadline}, fn)
}

// refuse records a door's refusal made before its caller was known ("_._" then), and returns
// it.
func (f *face) refuse(ctx context.Context, endpoint, owner, actor string, refusal *fault.Error) *fault.Error {
	f.h.Guard.Refused(ctx, audit.Request{Endpoint: endpoint, Caller: subjects.Principal(owner, actor)}, refusal)
	return refusal
}
