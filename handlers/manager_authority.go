package handlers

import (
	"context"

	"github.com/cotal-ai/authplane/client"
	"github.com/cotal-ai/authplane/internal/capability/manager"
	"github.com/cotal-ai/authplane/internal/core/audit"
	"github.com/cotal-ai/authplane/internal/core/fault"
)

// ManagerAuthority serves `cotal.<space>.auth.manager-authority.<owner>.<actor>`.
//
// Request: a JSON body whose `kind` selects the handler:
//   - `manager-service-authority` (docs/PROTOCOL.md, "manager-service-authority"): prepare, activate, renew, renewStandingBundle
//     → the material (credentials for the caller's nkeys, proofs, the epoch and account to renew
//     with); renewRunDriver → the run's driver and mediator credentials;
//   - `manager-run-admission` → the admission;
//   - `manager-run-attempt` → the run's driver and mediator credentials and the hold;
//   - `manager-run-status`, from the run's driver → the status as written;
//   - `manager-run-revoke` → the revocation marker that won.
//
// Refusals: bad-request, unimplemented, permission-denied, failed-precondition, conflict,
// resource-exhausted, unavailable, internal (see the manager.Engine methods).
func ManagerAuthority(e *manager.Engine) Func {
	return func(ctx context.Context, c Call) (any, audit.Request, error) {
		about := c.About()
		kind, err := fault.Peek(c.Body, "kind")
		if err != nil {
			return nil, about, err
		}
		caller := manager.Caller{Owner: c.Owner, Actor: c.Actor}
		serve, known := map[string]func(context.Context, manager.Caller, audit.Request, []byte) (any, audit.Request, error){
			manager.Kind:            e.ServiceAuthority,
			client.KindRunAdmission: reply(e.Admit),
			client.KindRunAttempt:   reply(e.Attempt),
			client.KindRunStatus:    reply(e.ReportStatus),
			client.KindRunRevoke:    reply(e.RevokeRun),
		}[kind]
		switch {
		case known:
			about.Kind = kind // only a known kind reaches the records
			return serve(ctx, caller, about, c.Body)
		case kind == "":
			return nil, about, fault.Field("kind", "missing")
		}
		return nil, about, fault.Field("kind", "%s is not a manager-authority kind", fault.Quote(kind))
	}
}

// RunRevoke serves `cotal.<space>.auth.run-revoke.<owner>.<actor>`.
//
// Request: a `manager-run-revoke` body (docs/PROTOCOL.md, "run-revoke"): the envelope with the manager's current
// proof, and `revoke{runId, reason}`. Reply: `{v, kind, requestId, runId, revocation,
// runFenceRevision}`, the marker that won, byte for byte: a repeat gets the first one.
//
// Refusals: bad-request (body), permission-denied (no admission record, another instance's
// run, not its admitted owner nor an admin, a wrong proof), failed-precondition, conflict
// (stale epoch), unavailable.
func RunRevoke(e *manager.Engine) Func {
	return func(ctx context.Context, c Call) (any, audit.Request, error) {
		about := c.About()
		kind, err := fault.Peek(c.Body, "kind")
		if err != nil {
			return nil, about, err
		}
		if kind != client.KindRunRevoke {
			return nil, about, fault.Field("kind", "want %q", client.KindRunRevoke)
		}
		about.Kind = kind
		return reply(e.RevokeRun)(ctx, manager.Caller{Owner: c.Owner, Actor: c.Actor}, about, c.Body)
	}
}

// reply adapts an engine method with a typed reply to the dispatch's shape, and never lets a
// nil reply pass for one.
func reply[R any](serve func(context.Context, manager.Caller, audit.Request, []byte) (*R, audit.Request, error)) func(context.Context, manager.Caller, audit.Request, []byte) (any, audit.Request, error) {
	return func(ctx context.Context, caller manager.Caller, about audit.Request, data []byte) (any, audit.Request, error) {
		r, about, err := serve(ctx, caller, about, data)
		if err != nil {
			return nil, about, err
		}
		return r, about, nil
	}
}
