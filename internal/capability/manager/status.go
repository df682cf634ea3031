package manager

import (
	"context"
	"regexp"

	"github.com/cotal-ai/authplane/client"
	"github.com/cotal-ai/authplane/internal/core/audit"
	"github.com/cotal-ai/authplane/internal/core/fault"
	"github.com/cotal-ai/authplane/internal/core/fence"
	"github.com/cotal-ai/authplane/subjects"
)

var holderRe = regexp.MustCompile(`^[A-Za-z0-9_.-]{1,256}$`)

// ReportStatus serves `manager-run-status` (docs/PROTOCOL.md, the run kinds): the run's current driver reports
// running, released, completed or failed, as the run's own principal, with the run fence's
// holder, epoch and fencing token (a fenced-out driver no longer has them). The plane writes
// the status row by CAS; a terminal state is final.
func (e *Engine) ReportStatus(ctx context.Context, caller Caller, about audit.Request, data []byte) (*client.StatusReply, audit.Request, error) {
	var s client.RunStatus
	if err := fault.Decode(data, &s); err != nil {
		return nil, about, err
	}
	about.RunID = keepIf(s.RunID, subjects.ValidRunID(s.RunID))
	switch {
	case s.V != 1:
		return nil, about, fault.Field("v", "want 1")
	case s.Kind != client.KindRunStatus:
		return nil, about, fault.Field("kind", "want %q", client.KindRunStatus)
	case !subjects.ValidRunID(s.RunID):
		return nil, about, fault.Field("runId", "want run- followed by 32 lowercase hex")
	case !validState(s.State):
		return nil, about, fault.Field("state", "want running, released, completed or failed")
	case !holderRe.MatchString(s.Holder):
		return nil, about, fault.Field("holder", "want [A-Za-z0-9_.-]{1,256}")
	case s.Epoch < 1:
		return nil, about, fault.Field("epoch", "want 1 or more")
	case s.FencingToken < 1:
		return nil, about, fault.Field("fencingToken", "want 1 or more")
	case s.Space != e.Space:
		return nil, about, fault.New(fault.PermissionDenied, "space %s is not this plane's space %q", fault.Quote(s.Space), e.Space)
	}
	reply, err := e.reportStatus(ctx, caller, &s)
	return reply, about, err
}

func (e *Engine) reportStatus(ctx context.Context, caller Caller, s *client.RunStatus) (*client.StatusReply, error) {
	if caller.Actor != subjects.RunActor(s.RunID) {
		return nil, fault.New(fault.PermissionDenied, "only the driver of run %s reports its status", s.RunID)
	}
	rf, err := e.observeRunFence(ctx, s.RunID)
	if err != nil {
		return nil, err
	}
	if rf.Row.Revoked {
		return nil, revoked(s.RunID)
	}
	if rf.Absent() || rf.Row.Holder != s.Holder || rf.Row.Epoch != s.Epoch || rf.Row.FencingToken != s.FencingToken {
		return nil, fault.New(fault.PermissionDenied, "the fence of run %s holds another takeover: a fenced-out driver reports nothing", s.RunID)
	}
	// The driver's principal is its manager's owner's: the gate of the fence's instance says whose.
	g, err := e.registered(ctx, rf.Row.InstanceID)
	if err != nil {
		return nil, err
	}
	if err := checkOwner(g, caller.Owner, rf.Row.InstanceID); err != nil {
		return nil, fault.New(fault.PermissionDenied, "run %s is not a run of this owner's managers", s.RunID)
	}
	next := status{V: 1, ObservedSpecRevision: s.ObservedSpecRevision, State: s.State, Holder: s.Holder,
		Epoch: s.Epoch, FencingToken: s.FencingToken, JournalHigh: s.JournalHigh, At: e.Pipeline.Now().UnixMilli()}
	o, err := e.runStatusOf(s.RunID).Update(ctx, func(cur *fence.Observed[status]) (status, error) {
		if !cur.Absent() && terminal(cur.Row.State) {
			return status{}, fault.New(fault.FailedPrecondition, "run %s is %s: a terminal state is final", s.RunID, cur.Row.State)
		}
		// The fence is read again with every decision: a takeover that lands meanwhile fences
		// this driver out.
		now, err := e.observeRunFence(ctx, s.RunID)
		if err != nil {
			return status{}, err
		}
		if now.Row.Revoked || now.Row.Holder != s.Holder || now.Row.Epoch != s.Epoch || now.Row.FencingToken != s.FencingToken {
			return status{}, fault.New(fault.PermissionDenied, "the fence of run %s holds another takeover: a fenced-out driver reports nothing", s.RunID)
		}
		return next, nil
	})
	if err != nil {
		return nil, fault.Store(err, "writing the status of run %s", s.RunID)
	}
	return &client.StatusReply{V: 1, Kind: client.KindRunStatus, RunID: s.RunID, Status: o.Row.reply(), Revision: o.Revision}, nil
}
