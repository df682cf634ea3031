package supervisor

import (
	"context"
	"strings"
	"unicode"

	"github.com/cotal-ai/authplane/client"
	"github.com/cotal-ai/authplane/internal/audit"
	"github.com/cotal-ai/authplane/internal/body"
	"github.com/cotal-ai/authplane/internal/fault"
	"github.com/cotal-ai/authplane/internal/fence"
	"github.com/cotal-ai/authplane/internal/gate"
	"github.com/cotal-ai/authplane/internal/manager"
	"github.com/cotal-ai/authplane/subjects"
)

// MaxReason is the longest reason an end may give, in bytes.
const MaxReason = fault.MaxMessage

// End serves supervisor-end for caller: it ends owner's assignment, which must name the body's
// instance and lifecycle, in the order docs/PROTOCOL.md gives ("supervisor-end"): (1) freeze the gate (created retired if
// absent), so no mint commits after it; (2) mark the assignment ended; (3) retire the recorded
// supervisor and executor generations; (4) retire the gate; (5) put every key a `minted` record
// of the instance names on the data account's revocation set, apply it at the broker, read it
// back, and wait until the broker lists no connection of those keys. Each step checks its own
// state first, so a retry after a crash anywhere completes the end, and a repeat reports the
// same final state. It records `ended`.
//
// Refusals: bad-request (body), permission-denied (no platform-admin; no assignment, or one of
// another space; the instance is another owner's), failed-precondition (the assignment is for
// another lifecycle; a delete marker on a fence), unavailable (stores; an end stopped midway,
// to be repeated).
func (s *Supervisor) End(ctx context.Context, caller manager.Caller, about audit.Request, data []byte) (*client.EndReport, audit.Request, error) {
	var req client.End
	if err := body.Decode(data, &req); err != nil {
		return nil, about, err
	}
	about = aboutTarget(about, req.Kind, client.KindEnd, req.InstanceID)
	if err := checkTarget(req.V, req.Kind, client.KindEnd, req.Owner, req.InstanceID, req.LifecycleUID); err != nil {
		return nil, about, err
	}
	if strings.TrimSpace(req.Reason) == "" || len(req.Reason) > MaxReason || strings.ContainsFunc(req.Reason, unicode.IsControl) {
		return nil, about, fault.Field("reason", "want 1 to %d bytes of text without control characters", MaxReason)
	}
	if err := s.requirePlatformAdmin(ctx, caller); err != nil {
		return nil, about, err
	}
	o, err := s.readAssignment(ctx, req.Owner)
	if err != nil {
		return nil, about, err
	}
	if o.Row.InstanceID != req.InstanceID || o.Row.LifecycleUID != req.LifecycleUID {
		return nil, about, fault.New(fault.FailedPrecondition, "instanceId and lifecycleUid are not those of owner %s's assignment", req.Owner)
	}
	e := &ending{s: s, l: lifecycleOf(o.Row), report: &client.EndReport{Owner: req.Owner, InstanceID: req.InstanceID, LifecycleUID: req.LifecycleUID}}
	steps := []func(context.Context) error{e.freeze, e.markEnded, e.retireGenerations, e.retireGate, e.revoke}
	for i, step := range steps {
		if err := step(ctx); err != nil {
			return nil, about, err
		}
		if s.AfterEndStep != nil {
			if err := s.AfterEndStep(e.l.iid, i+1); err != nil {
				return nil, about, fault.Wrap(fault.Unavailable, err, "the end stopped after step %d of 5; repeat it to complete it", i+1)
			}
		}
	}
	s.Audit.Ended(ctx, about, e.ended, req.Reason, e.report.Revoked.NKeys)
	return e.report, about, nil
}

// ending is one end under way: its lifecycle and the report its steps fill in.
type ending struct {
	s      *Supervisor
	l      lifecycle
	report *client.EndReport
	ended  audit.Assignment
}

// retirement is the op of the lifecycle's freeze and retirement.
func (e *ending) retirement() *gate.Op {
	return &gate.Op{OpID: gate.RetirementOpID(e.l.uid), Kind: gate.OpRetirement}
}

// toGate moves the instance's gate to state (frozen or retired) under the end's op: a gate
// never written is created retired; another owner's is refused; one already there (or past
// it: retired) is left as it is.
func (e *ending) toGate(ctx context.Context, state string) error {
	principal := subjects.Principal(e.l.owner, subjects.ServeActor(e.l.iid))
	_, err := gate.Of(e.s.Gates, subjects.GateEndpointManager, e.l.iid).Update(ctx, func(cur *gate.Gate) (gate.Row, error) {
		switch {
		case cur.Absent():
			return gate.Row{State: gate.Retired, Principal: principal, Op: e.retirement()}, nil
		case cur.Row.Principal != principal:
			return gate.Row{}, fault.New(fault.PermissionDenied, "instance %s is registered to another owner", e.l.iid)
		case cur.Row.State == gate.Retired || cur.Row.State == state:
			return gate.Row{}, fence.ErrKeep
		}
		next := cur.Row
		next.State, next.Op = state, e.retirement()
		return next, nil
	})
	if err != nil {
		return fault.Store(err, "moving the gate of instance %s to %s", e.l.iid, state)
	}
	return nil
}

// freeze is step 1: the commit fence of every mint for the instance moves, so none commits
// after it.
func (e *ending) freeze(ctx context.Context) error { return e.toGate(ctx, gate.Frozen) }

// markEnded is step 2: the assignment ended, for good.
func (e *ending) markEnded(ctx context.Context) error {
	o, err := e.s.assignmentOf(e.l.owner).Update(ctx, func(cur *observedAssignment) (Assignment, error) {
		switch {
		case cur.Absent() || lifecycleOf(cur.Row) != e.l:
			return Assignment{}, fault.New(fault.FailedPrecondition, "owner %s's assignment is no longer for this lifecycle", e.l.owner)
		case cur.Row.State == client.StateEnded:
			return Assignment{}, fence.ErrKeep
		}
		next := cur.Row
		next.State = client.StateEnded
		return next, nil
	})
	if err != nil {
		return fault.Store(err, "ending the assignment of owner %s", e.l.owner)
	}
	e.report.Assignment.State, e.report.Assignment.Revision = o.Row.State, o.Revision
	e.ended = auditOf(o)
	return nil
}

// retireGenerations is step 3: the recorded supervisor and executor generations no longer
// resolve, whatever the gate or the assignment row say later.
func (e *ending) retireGenerations(ctx context.Context) error {
	e.report.Retired.Generations = []client.Generation{}
	for _, d := range recorded {
		o, err := e.s.generation(ctx, e.l, d)
		if err != nil {
			return err
		}
		if o == nil {
			continue
		}
		if err := e.s.Retire(ctx, o.Row.Ref); err != nil {
			return err
		}
		e.report.Retired.Generations = append(e.report.Retired.Generations, client.Generation{Duty: string(d), Generation: o.Row.Ref.Generation})
	}
	return nil
}

// retireGate is step 4: retired is terminal.
func (e *ending) retireGate(ctx context.Context) error {
	if err := e.toGate(ctx, gate.Retired); err != nil {
		return err
	}
	e.report.Retired.Gate = gate.Retired
	return nil
}

// revoke is step 5: every key minted for the instance on the revocation set, applied at the
// broker, and the broker's connections of those keys gone. It leaves a tenth of the time for
// the record and the reply.
func (e *ending) revoke(ctx context.Context) error {
	keys, err := e.s.Minted.MintedKeys(ctx, e.l.iid)
	if err != nil {
		return fault.Store(err, "listing the keys minted for instance %s", e.l.iid)
	}
	work, cancel := audit.Reserve(ctx)
	defer cancel()
	applied, err := e.s.Revocations.Apply(work, keys, false)
	if err != nil {
		return err
	}
	r := e.report
	r.Revoked.Done, r.Revoked.NKeys, r.Revoked.Reason = applied.Done, keys, applied.Reason
	if applied.Done {
		r.Evicted.Count = e.s.Revocations.Evict(work, keys)
	}
	r.Evicted.Complete = applied.Done && r.Evicted.Count == len(keys)
	return nil
}
