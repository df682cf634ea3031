package handlers

import (
	"context"

	"github.com/cotal-ai/authplane/internal/capability/manager"
	"github.com/cotal-ai/authplane/internal/capability/supervisor"
	"github.com/cotal-ai/authplane/internal/core/audit"
)

// SupervisorAuthority serves `cotal.<space>.auth.supervisor-authority.<owner>.<actor>`.
//
// Request: `{v:1, kind:"platform-supervisor-authority", owner, assignmentRevision, request}`
// (docs/PROTOCOL.md, "supervisor-assign" to "supervisor-end"), from a principal whose ledger row holds `platform-admin`; `request` is a
// manager-service-authority request with actor "cli" and operation prepare, activate, renew or
// renewStandingBundle for the assignment's instance and lifecycle. Reply: the material, every
// credential's expiry at most the assignment's expiresAt.
//
// Refusals: bad-request, permission-denied (the checks of the original in its order; an ended
// lifecycle: "platform supervisor assignment for owner X has ended; …"), failed-precondition,
// conflict, already-exists, resource-exhausted, unavailable, internal (see
// supervisor.Supervisor.Authority).
func SupervisorAuthority(s *supervisor.Supervisor) Func {
	return func(ctx context.Context, c Call) (any, audit.Request, error) {
		return s.Authority(ctx, manager.Caller{Owner: c.Owner, Actor: c.Actor}, c.About(), c.Body)
	}
}
