package handlers

import (
	"context"

	"github.com/cotal-ai/authplane/internal/capability/manager"
	"github.com/cotal-ai/authplane/internal/capability/supervisor"
	"github.com/cotal-ai/authplane/internal/core/audit"
)

// SupervisorAssign serves `cotal.<space>.auth.supervisor-assign.<owner>.<actor>`.
//
// Request: `{v:1, kind:"platform-supervisor-assign", owner, instanceId, lifecycleUid,
// expiresAt}` (docs/PROTOCOL.md, "supervisor-assign" to "supervisor-end"), from a principal whose ledger row holds `platform-admin`. Reply:
// the assignment record, `assignment.<owner>` as written, with its revision (what
// supervisor-authority names). A repeat of the assignment in force returns it; it is recorded
// `assigned`.
//
// Refusals: bad-request, permission-denied, failed-precondition, unavailable (see
// supervisor.Supervisor.Assign).
func SupervisorAssign(s *supervisor.Supervisor) Func {
	return func(ctx context.Context, c Call) (any, audit.Request, error) {
		return s.Assign(ctx, manager.Caller{Owner: c.Owner, Actor: c.Actor}, c.About(), c.Body)
	}
}
