package handlers

import (
	"context"

	"github.com/cotal-ai/authplane/internal/audit"
	"github.com/cotal-ai/authplane/internal/body"
	"github.com/cotal-ai/authplane/internal/fault"
	"github.com/cotal-ai/authplane/internal/manager"
)

// Manager-authority kinds that land with workflow runs.
var runKinds = map[string]bool{
	"manager-run-admission": true,
	"manager-run-attempt":   true,
	"manager-run-status":    true,
}

// ManagerAuthority serves `cotal.<space>.auth.manager-authority.<owner>.<actor>`.
//
// Request: a JSON body whose `kind` selects the handler. `manager-service-authority` (DESIGN
// §6.2): operations prepare, activate, renew and renewStandingBundle. Reply: the material
// (credentials for the caller's nkeys, proofs, the epoch and account to renew with). The run
// kinds (`manager-run-admission`, `manager-run-attempt`, `manager-run-status`) and
// renewRunDriver answer `unimplemented` until workflow runs land.
//
// Refusals: bad-request, unimplemented, permission-denied, failed-precondition, conflict,
// resource-exhausted, unavailable, internal (see manager.Engine.ServiceAuthority).
func ManagerAuthority(e *manager.Engine) Func {
	return func(ctx context.Context, c Call) (any, audit.Request, error) {
		about := c.About()
		kind, err := body.Peek(c.Body, "kind")
		if err != nil {
			return nil, about, err
		}
		if kind == manager.Kind || runKinds[kind] {
			about.Kind = kind // only a known kind reaches the records
		}
		switch {
		case kind == manager.Kind:
			return e.ServiceAuthority(ctx, manager.Caller{Owner: c.Owner, Actor: c.Actor}, about, c.Body)
		case runKinds[kind]:
			return nil, about, fault.New(fault.Unimplemented, "%s lands with workflow runs; not implemented by this plane yet", kind)
		case kind == "":
			return nil, about, fault.Field("kind", "missing")
		}
		return nil, about, fault.Field("kind", "%s is not a manager-authority kind", fault.Quote(kind))
	}
}
