package handlers

import (
	"context"

	"github.com/cotal-ai/authplane/internal/capability/manager"
	"github.com/cotal-ai/authplane/internal/capability/supervisor"
	"github.com/cotal-ai/authplane/internal/core/audit"
)

// SupervisorEnd serves `cotal.<space>.auth.supervisor-end.<owner>.<actor>`.
//
// Request: `{v:1, kind:"platform-supervisor-end", owner, instanceId, lifecycleUid, reason}`
// (docs/PROTOCOL.md, "supervisor-assign" to "supervisor-end"), from a principal whose ledger row holds `platform-admin`. Reply: `{owner,
// instanceId, lifecycleUid, assignment{state, revision}, retired{generations, gate},
// revoked{done, nkeys, reason?}, evicted{count, complete}}`, the end's final state: a repeat,
// or a retry after a crash anywhere, reports the same. It is recorded `ended`.
//
// Refusals: bad-request, permission-denied, failed-precondition, unavailable (see
// supervisor.Supervisor.End).
func SupervisorEnd(s *supervisor.Supervisor) Func {
	return func(ctx context.Context, c Call) (any, audit.Request, error) {
		return s.End(ctx, manager.Caller{Owner: c.Owner, Actor: c.Actor}, c.About(), c.Body)
	}
}
