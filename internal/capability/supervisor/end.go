package supervisor

import (
	"context"
	"errors"
	"strings"
	"sync"
	"unicode"

	"github.com/cotal-ai/authplane/client"
	"github.com/cotal-ai/authplane/internal/capability/manager"
	"github.com/cotal-ai/authplane/internal/capability/signers"
	"github.com/cotal-ai/authplane/internal/core/audit"
	"github.com/cotal-ai/authplane/internal/core/fault"
	"github.com/cotal-ai/authplane/internal/core/fence"
	"github.com/cotal-ai/authplane/internal/core/issue"
	"github.com/cotal-ai/authplane/subjects"
)

// MaxReason is the longest reason an end may give, in bytes.
const MaxReason = fault.MaxMessage

// The steps of an end, numbered as AfterEndStep sees them.
const (
	StepEnding = 1 + iota
	StepFrozen
	StepGenerationsRetired
	StepGateRetired
	StepRevoked
	StepEvicted
	StepEnded
	// EndSteps is how many there are.
	EndSteps = StepEnded
)

// End serves supervisor-end for caller: it ends owner's assignment, which must name the body's
// instance and lifecycle, in seven steps: (1) mark the assignment ending, so it authorizes
// nothing and no new lifecycle buries the end; (2) freeze the gate (created retired if absent),
// so no mint commits after it; (3) retire the recorded supervisor and executor generations; (4)
// retire the gate; (5) take the instance's signing key off the data account's JWT and wait until
// every server of the broker holds a JWT without it, read back: the broker then refuses every
// credential the key signed and closes their connections; (6) wait until the broker lists no
// connection of the keys the instance claimed that a `minted` record names; (7) record `ended`
// (with the keys not revoked) and mark the assignment ended. Each step checks its own state first, so
// a retry after a crash anywhere completes the end, and a repeat completes whatever an earlier
// one left undone (a revocation the broker had not confirmed, a connection still listed).
//
// The end is done (the report's done) once the key is off at every server and no connection
// of the instance's keys is left. The assignment is ended once the revocation's outcome is
// settled: confirmed, or recorded as not possible (no operator signing key; the broker not
// confirming by the deadline), the keys not revoked listed in the report and the `ended`
// record; their credentials expire at their clamp. Taking a key off needs no room, so no other
// owner's instances can stop an end.
//
// Refusals: bad-request (body), permission-denied (no platform-admin; no assignment, or one of
// another space; the instance is another owner's), failed-precondition (the assignment is for
// another lifecycle; a delete marker on a fence), unavailable
// (stores; an end stopped midway; the broker did not confirm the revocation, or still listed a
// connection, by the deadline: the report in the details; repeat the end to complete it).
func (s *Supervisor) End(ctx context.Context, caller manager.Caller, about audit.Request, data []byte) (*client.EndReport, audit.Request, error) {
	var req client.End
	if err := fault.Decode(data, &req); err != nil {
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
	e := &ending{s: s, l: lifecycleOf(o.Row), about: about, reason: req.Reason,
		report: &client.EndReport{Owner: req.Owner, InstanceID: req.InstanceID, LifecycleUID: req.LifecycleUID}}
	e.report.Revoked.NKeys = []string{}
	// An instance another owner registered is refused before anything is written. (One another
	// owner registers after this read is found by the freeze: then this lifecycle never had
	// the gate, minted nothing on it, and has nothing of its own there to freeze or revoke.)
	if g, err := issue.GateOf(s.Gates, subjects.GateEndpointManager, e.l.iid).Observe(ctx); err != nil {
		return nil, about, fault.Store(err, "reading the gate of instance %s", e.l.iid)
	} else if !g.Absent() && g.Row.Principal != e.principal() {
		return nil, about, fault.New(fault.PermissionDenied, "instance %s is registered to another owner", e.l.iid)
	}
	// The revocation and the wait for the connections leave a tenth of the time for marking
	// the assignment ended, the record and the reply.
	work, cancel := audit.Reserve(ctx)
	defer cancel()
	steps := []func(context.Context) error{e.begin, e.freeze, e.retireGenerations, e.retireGate,
		func(context.Context) error { return e.revoke(work) },
		func(context.Context) error { return e.evict(work) },
		e.finish}
	for i, step := range steps {
		if err := step(ctx); err != nil {
			return nil, about, err
		}
		if s.AfterEndStep != nil {
			if err := s.AfterEndStep(e.l.iid, i+1); err != nil {
				return nil, about, fault.Wrap(fault.Unavailable, err, "the end stopped after step %d of %d; repeat it to complete it", i+1, len(steps))
			}
		}
	}
	return e.report, about, e.verdict()
}

// verdict is the end's answer once its steps ran: nil when it is done or cannot be (no operator
// signing key: the report says so); otherwise a refusal that carries the report.
func (e *ending) verdict() error {
	r := e.report
	var f *fault.Error
	switch {
	case r.Done:
		return nil
	case errors.Is(e.outcome.Cause, signers.ErrNoSigner):
		return nil // the operator keeps the signing key elsewhere: revoked.reason says so
	case !r.Revoked.Done:
		f = fault.New(fault.Unavailable, "the lifecycle of instance %s is ended and retired, but the broker did not confirm the revocation of %d of its keys before the deadline; its signing key is off the data account; repeat the end to confirm it",
			e.l.iid, len(r.Revoked.Unrevoked))
	default:
		f = fault.New(fault.Unavailable, "the lifecycle of instance %s is ended and its keys are revoked at the broker, but %d of them still had a connection listed at the deadline; repeat the end to see them closed",
			e.l.iid, len(r.Revoked.NKeys)-r.Evicted.Count)
	}
	f.Details = r
	return f
}

// ending is one end under way: its lifecycle and the report its steps fill in.
type ending struct {
	s       *Supervisor
	l       lifecycle
	report  *client.EndReport
	about   audit.Request
	reason  string
	ended   audit.Assignment
	outcome signers.Outcome
	// foreign: the instance's gate is another owner's (registered after the end began).
	foreign bool
}

// principal is the gate principal of the lifecycle's instance.
func (e *ending) principal() string {
	return subjects.Principal(e.l.owner, subjects.ServeActor(e.l.iid))
}

// retirement is the op of the lifecycle's freeze and retirement.
func (e *ending) retirement() *issue.GateOp {
	return &issue.GateOp{OpID: issue.RetirementOpID(e.l.uid), Kind: issue.OpRetirement}
}

// moveAssignment moves owner's assignment of this lifecycle from one state to the next: a row
// already at next (or past it: ended) is left as it is; a row of another lifecycle refuses.
func (e *ending) moveAssignment(ctx context.Context, from, next string) error {
	o, err := e.s.assignmentOf(e.l.owner).Update(ctx, func(cur *observedAssignment) (Assignment, error) {
		switch {
		case cur.Absent() || lifecycleOf(cur.Row) != e.l:
			return Assignment{}, fault.New(fault.FailedPrecondition, "owner %s's assignment is no longer for this lifecycle", e.l.owner)
		case cur.Row.State == next || cur.Row.State == StateEnded:
			return Assignment{}, fence.ErrKeep
		case cur.Row.State != from:
			return Assignment{}, fault.New(fault.Internal, "owner %s's assignment is %s, not %s", e.l.owner, cur.Row.State, from)
		}
		row := cur.Row
		row.State = next
		return row, nil
	})
	if err != nil {
		return fault.Store(err, "marking the assignment of owner %s %s", e.l.owner, next)
	}
	e.report.Assignment.State, e.report.Assignment.Revision = o.Row.State, o.Revision
	e.ended = auditOf(o)
	return nil
}

// begin is step 1: the assignment is ending; it authorizes nothing more, and the owner gets no
// new assignment until the end completes.
func (e *ending) begin(ctx context.Context) error {
	return e.moveAssignment(ctx, StateAssigned, StateEnding)
}

// finish is step 7: the end's outcome is settled, and the assignment ended for good. The
// outcome is recorded (`ended`, with the keys not revoked) before the assignment says ended:
// once it does, a new assignment may take its place and this end is never repeated, so a crash
// in between would leave the unrevoked keys on no record. A repeat records it again.
func (e *ending) finish(ctx context.Context) error {
	r := e.report
	r.Done = r.Revoked.Done && r.Evicted.Complete
	if err := e.s.Audit.Ended(ctx, e.about, e.ended, e.reason, r.Revoked.NKeys, r.Revoked.Unrevoked); err != nil && len(r.Revoked.Unrevoked) > 0 {
		// The keys not revoked would be on no record: the end stays pending, to be repeated.
		return fault.Store(err, "recording the end's unrevoked keys")
	}
	return e.moveAssignment(ctx, StateEnding, StateEnded)
}

// toGate moves the instance's gate to state (frozen or retired) under the end's op: a gate
// never written is created retired; one already there (or past it: retired) is left as it
// is; another owner's is left alone (foreign).
func (e *ending) toGate(ctx context.Context, state string) error {
	principal := e.principal()
	_, err := issue.GateOf(e.s.Gates, subjects.GateEndpointManager, e.l.iid).Update(ctx, func(cur *issue.Gate) (issue.GateRow, error) {
		switch {
		case cur.Absent():
			return issue.GateRow{State: issue.GateRetired, Principal: principal, Op: e.retirement()}, nil
		case cur.Row.Principal != principal:
			e.foreign = true
			return issue.GateRow{}, fence.ErrKeep
		case cur.Row.State == issue.GateRetired || cur.Row.State == state:
			return issue.GateRow{}, fence.ErrKeep
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

// freeze is step 2: the commit fence of every mint for the instance moves, so none commits
// after it.
func (e *ending) freeze(ctx context.Context) error { return e.toGate(ctx, issue.GateFrozen) }

// retireGenerations is step 3: the recorded supervisor and executor generations no longer
// resolve, whatever the gate or the assignment row say later. The duties are retired at once.
func (e *ending) retireGenerations(ctx context.Context) error {
	gens := make([]*client.Generation, len(recorded))
	errs := make([]error, len(recorded))
	var wg sync.WaitGroup
	for i, d := range recorded {
		wg.Go(func() {
			o, err := e.s.generation(ctx, e.l, d)
			if err != nil || o == nil {
				errs[i] = err
				return
			}
			if errs[i] = e.s.Retire(ctx, o.Row.Ref); errs[i] == nil {
				gens[i] = &client.Generation{Duty: string(d), Generation: o.Row.Ref.Generation}
			}
		})
	}
	wg.Wait()
	e.report.Retired.Generations = []client.Generation{}
	for i := range recorded {
		if errs[i] != nil {
			return errs[i]
		}
		if gens[i] != nil {
			e.report.Retired.Generations = append(e.report.Retired.Generations, *gens[i])
		}
	}
	return nil
}

// retireGate is step 4: retired is terminal.
func (e *ending) retireGate(ctx context.Context) error {
	if err := e.toGate(ctx, issue.GateRetired); err != nil {
		return err
	}
	if !e.foreign {
		e.report.Retired.Gate = issue.GateRetired
	}
	return nil
}

// revoke is step 5: the instance's signing key goes off the data account's JWT, and the end
// waits until every server holds a JWT without it; every credential it signed is then refused
// and its connection closed. The report names the keys the instance claimed that a `minted`
// record of it names: a key another instance claimed is left alone (it is not this instance's);
// a key no instance claimed (a mint that never committed) is claimed for this instance first,
// so no one can claim it later.
func (e *ending) revoke(ctx context.Context) error {
	if e.foreign {
		e.report.Revoked.Done = true // the instance is another owner's: no key of it is this lifecycle's
		return nil
	}
	candidates, err := e.s.Minted.MintedKeys(ctx, e.l.iid)
	if err != nil {
		return fault.Store(err, "listing the keys minted for instance %s", e.l.iid)
	}
	keys, err := e.claimed(ctx, candidates)
	if err != nil {
		return err
	}
	outcome, err := e.s.Signers.Remove(ctx, e.l.iid)
	if err != nil {
		return err
	}
	e.outcome = *outcome
	r := e.report
	r.Revoked.NKeys, r.Revoked.Done = keys, outcome.Done
	if !outcome.Done {
		r.Revoked.Unrevoked, r.Revoked.Reason = keys, outcome.Reason
	}
	return nil
}

// claimed is the keys of candidates the instance claimed, claiming for it those no instance
// did; the claims are read at once.
func (e *ending) claimed(ctx context.Context, candidates []string) ([]string, error) {
	in := issue.MustInstance(e.l.owner, e.l.iid)
	mine := make([]bool, len(candidates))
	errs := make([]error, len(candidates))
	var wg sync.WaitGroup
	for i, k := range candidates {
		wg.Go(func() {
			holder, err := e.s.Claims.Holder(ctx, k)
			if err != nil {
				errs[i] = fault.Store(err, "reading the claim on %s", k)
				return
			}
			if holder == "" {
				err := e.s.Claims.Take(ctx, in, []string{k})
				switch {
				case errors.Is(err, issue.ErrElsewhere):
					return // claimed by another instance meanwhile: not ours
				case err != nil:
					errs[i] = fault.Store(err, "claiming %s for instance %s", k, e.l.iid)
					return
				}
				holder = e.l.iid
			}
			mine[i] = holder == e.l.iid
		})
	}
	wg.Wait()
	keys := []string{}
	for i, k := range candidates {
		if errs[i] != nil {
			return nil, errs[i]
		}
		if mine[i] {
			keys = append(keys, k)
		}
	}
	return keys, nil
}

// evict is step 6: the broker lists no connection of the revoked keys (it closes them as it
// takes the signing key off).
func (e *ending) evict(ctx context.Context) error {
	r := e.report
	if e.outcome.Done && len(r.Revoked.NKeys) > 0 {
		r.Evicted.Count = e.s.Signers.Evict(ctx, r.Revoked.NKeys)
	}
	r.Evicted.Complete = r.Revoked.Done && r.Evicted.Count == len(r.Revoked.NKeys)
	return nil
}
