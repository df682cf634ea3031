package manager

import (
	"context"
	"encoding/json"
	"errors"
	"strings"

	"github.com/cotal-ai/authplane/client"
	"github.com/cotal-ai/authplane/internal/core/audit"
	"github.com/cotal-ai/authplane/internal/core/fault"
	"github.com/cotal-ai/authplane/internal/core/fence"
	"github.com/cotal-ai/authplane/subjects"
)

// maxReason bounds a revocation's reason, which every later reader of the marker gets back.
const maxReason = 256

// errAlreadyRevoked tells the run fence's update there is nothing to write.
var errAlreadyRevoked = errors.New("run fence already revoked")

// RevokeRun serves `manager-run-revoke` (docs/PROTOCOL.md, "run-revoke"), on the run-revoke endpoint and through
// manager-authority. The run must be admitted for this instance; the caller must be its
// admitted owner (no scope needed) or hold `admin`, read now (a `p_` platform holder is
// refused); the request carries the manager's current proof. It writes the revocation marker
// create-only, and the first marker wins: a repeat, or a concurrent revoke with another reason,
// succeeds with the original marker byte for byte. Then it sets the run fence revoked, so a run
// mint in flight cannot commit after it.
func (e *Engine) RevokeRun(ctx context.Context, caller Caller, about audit.Request, data []byte) (*client.RevokeReply, audit.Request, error) {
	var req revokeRequest
	about, err := e.parseRun(caller, about, data, client.KindRunRevoke, &req)
	if err != nil {
		return nil, about, err
	}
	reply, err := e.revoke(ctx, caller, &req.RunRevoke)
	if err == nil && e.Records != nil {
		var won client.Revocation
		if json.Unmarshal(reply.Revocation, &won) != nil {
			won.Reason = req.Revoke.Reason
		}
		e.Records.RunRevoked(ctx, about, won.Reason)
	}
	return reply, about, err
}

type revokeRequest struct{ client.RunRevoke }

func (r *revokeRequest) envelope() *client.Envelope { return &r.Envelope }
func (r *revokeRequest) runID() string              { return r.Revoke.RunID }
func (r *revokeRequest) checkOwn() error {
	switch {
	case !subjects.ValidRunID(r.Revoke.RunID):
		return fault.Field("revoke.runId", "want run- followed by 32 lowercase hex")
	case strings.TrimSpace(r.Revoke.Reason) == "" || len(r.Revoke.Reason) > maxReason:
		return fault.Field("revoke.reason", "want a reason of 1 to %d bytes", maxReason)
	}
	return nil
}

func (e *Engine) revoke(ctx context.Context, caller Caller, req *client.RunRevoke) (*client.RevokeReply, error) {
	runID, iid := req.Revoke.RunID, req.InstanceID
	adm, err := e.admittedHere(ctx, runID, iid)
	if err != nil {
		return nil, err
	}
	if !strings.HasPrefix(caller.Owner, "u_") {
		return nil, fault.New(fault.PermissionDenied, "revoking run %s requires its admitted owner or a platform admin", runID)
	}
	if caller.Owner != adm.Caller.Owner {
		row, found, err := ReadActor(ctx, e.Ledger, caller.Owner, caller.Actor)
		if err != nil && !errors.Is(err, ErrMalformed) {
			return nil, fault.Store(err, "reading the ledger")
		}
		if !found || !row.Has(Admin) {
			return nil, fault.New(fault.PermissionDenied, "revoking run %s requires its admitted owner or a platform admin", runID)
		}
	}
	// The manager's current proof authenticates the request, whoever sends it: an admin gets
	// it from the manager's operator.
	g, err := e.observe(ctx, iid)
	if err != nil {
		return nil, err
	}
	owner, ok := strings.CutSuffix(g.Row.Principal, "."+subjects.ServeActor(iid))
	if g.Absent() || !ok {
		return nil, fault.New(fault.FailedPrecondition, "instance %s carries no manager registration", iid)
	}
	if _, err := e.authenticate(ctx, owner, &req.Envelope); err != nil {
		return nil, err
	}
	marker := encode(client.Revocation{Version: 1, RunID: runID, Reason: req.Revoke.Reason, By: caller.String(), RevokedAt: e.Pipeline.Now().UnixMilli()})
	stored, _, err := e.createOnce(ctx, subjects.RevokedKey(runID), marker)
	if err != nil {
		return nil, err
	}
	rev, err := e.revokeRunFence(ctx, runID, adm.InstanceID)
	if err != nil {
		return nil, err
	}
	return &client.RevokeReply{V: 1, Kind: client.KindRunRevoke, RequestID: req.RequestID, RunID: runID, Revocation: stored, RunFenceRevision: rev}, nil
}

// revokeRunFence sets the run fence revoked, creating it so if no attempt ever did: an attempt
// in flight then cannot create it behind the revocation. A fence already revoked is left as it
// is. It returns the revision at which the fence says revoked.
func (e *Engine) revokeRunFence(ctx context.Context, runID, iid string) (uint64, error) {
	f := e.runFenceOf(runID)
	o, err := f.Update(ctx, func(cur *fence.Observed[runFence]) (runFence, error) {
		if cur.Row.Revoked {
			return runFence{}, errAlreadyRevoked
		}
		next := cur.Row
		if cur.Absent() {
			next = runFence{V: 1, RunID: runID, InstanceID: iid}
		}
		next.Revoked = true
		return next, nil
	})
	if errors.Is(err, errAlreadyRevoked) {
		o, err = f.Observe(ctx)
	}
	if err != nil {
		return 0, fault.Store(err, "revoking the run fence of %s", runID)
	}
	return o.Revision, nil
}
