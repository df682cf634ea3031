package manager

import (
	"context"
	"errors"

	"github.com/cotal-ai/authplane/client"
	"github.com/cotal-ai/authplane/internal/core/audit"
	"github.com/cotal-ai/authplane/internal/core/fault"
	"github.com/cotal-ai/authplane/internal/core/fence"
	"github.com/cotal-ai/authplane/internal/core/issue"
	"github.com/cotal-ai/authplane/subjects"
)

// maxSubject bounds a run-start subject in a body: longer than any the grammar allows.
const maxSubject = 512

// Admit serves `manager-run-admission` (docs/PROTOCOL.md, the run kinds): a manager admits a run a caller really
// started. In order: the manager authenticates as for a renewal; a revoked run is refused; an
// identical earlier admission is returned as it is; the subject must parse, be this space's
// and (inst) this instance's, be witnessed and not consumed, and name a caller of the manager's
// own owner whose ledger lifecycle, if set, is the subject's. The witness is consumed by a
// create-only marker and the admission written create-only: two replicas agree on "once", and
// anything else admitted under the run id is `conflict`.
func (e *Engine) Admit(ctx context.Context, caller Caller, about audit.Request, data []byte) (*client.AdmissionReply, audit.Request, error) {
	var req admissionRequest
	about, err := e.parseRun(caller, about, data, client.KindRunAdmission, &req)
	if err != nil {
		return nil, about, err
	}
	reply, err := e.admit(ctx, caller, &req.RunAdmission)
	if err == nil && e.Records != nil {
		e.Records.RunAdmitted(ctx, about, reply.Admission.Subject)
	}
	return reply, about, err
}

func (e *Engine) admit(ctx context.Context, caller Caller, req *client.RunAdmission) (*client.AdmissionReply, error) {
	iid, runID, subject := req.InstanceID, req.Run.RunID, req.Run.Subject
	if _, err := e.authorizeCurrent(ctx, caller, &req.Envelope, nil); err != nil {
		return nil, err
	}
	if err := e.refuseRevoked(ctx, runID); err != nil {
		return nil, err
	}
	reply := func(a *admission, rev uint64) *client.AdmissionReply {
		return &client.AdmissionReply{V: 1, Kind: client.KindRunAdmission, RequestID: req.RequestID, RunID: runID, Revision: rev, Admission: a.reply()}
	}
	if a, rev, err := e.readAdmission(ctx, runID); err != nil {
		return nil, err
	} else if a != nil {
		if a.InstanceID != iid || a.Subject != subject {
			return nil, fault.New(fault.Conflict, "run %s was admitted from another run-start or for another manager instance", runID)
		}
		return reply(a, rev), nil // an identical earlier admission, as it is
	}
	start, ok := subjects.ParseRunStart(e.Space, subject)
	switch {
	case !ok:
		return nil, fault.New(fault.PermissionDenied, "run.subject is not a run-start subject of space %s", e.Space)
	case start.Route == subjects.RouteInst && start.Instance != iid:
		return nil, fault.New(fault.PermissionDenied, "run.subject names another manager instance")
	}
	if witnessed, err := e.Witness.Witnessed(ctx, subject); err != nil {
		return nil, fault.Store(err, "reading the witness")
	} else if !witnessed {
		return nil, fault.New(fault.PermissionDenied, "run.subject was not witnessed: no run-start was published on it in the last five minutes")
	}
	marker := encode(map[string]any{"v": 1, "runId": runID, "subject": subject})
	if entry, err := e.Admissions.Get(ctx, subjects.WitnessMarkerKey(subject)); err == nil && string(entry.Value) != string(marker) {
		return nil, errConsumed()
	}
	if start.Owner != caller.Owner {
		return nil, fault.New(fault.PermissionDenied, "run.subject was published by a caller of another owner than this manager's")
	}
	row, found, err := ReadActor(ctx, e.Ledger, start.Owner, start.Actor)
	if err != nil && !errors.Is(err, ErrMalformed) {
		return nil, fault.Store(err, "reading the ledger")
	}
	if found && row.LifecycleUID != "" && row.LifecycleUID != start.UID {
		return nil, fault.New(fault.PermissionDenied, "run.subject names a lifecycle its caller no longer has")
	}
	// The witness is consumed here, once: the first marker stands, and a replica that lost
	// the race reads the other run's.
	if got, _, err := e.createOnce(ctx, subjects.WitnessMarkerKey(subject), marker); err != nil {
		return nil, err
	} else if string(got) != string(marker) {
		return nil, errConsumed()
	}
	a := &admission{Version: 1, Space: e.Space, Endpoint: subjects.GateEndpointManager, RunID: runID, InstanceID: iid,
		Caller:  admittedCaller{Owner: start.Owner, Actor: start.Actor, UID: start.UID, Generation: start.Generation},
		Subject: subject, AdmittedAt: e.Pipeline.Now().UnixMilli()}
	raw, rev, err := e.createOnce(ctx, subjects.AdmissionKey(runID), encode(a))
	if err != nil {
		return nil, err
	}
	stored, err := parseAdmission(raw, runID)
	if err != nil || stored.InstanceID != iid || stored.Subject != subject {
		return nil, fault.New(fault.Conflict, "run %s was admitted from another run-start or for another manager instance", runID)
	}
	return reply(stored, rev), nil
}

// Attempt serves `manager-run-attempt` (docs/PROTOCOL.md, the run kinds): one takeover of an admitted run. The run
// must be admitted for this instance, not revoked and not terminal; the attempt's epoch and
// fencing token must each be the run fence's plus one (1 and 1 for a new run), or `conflict`
// carrying the current fence. It mints the run's driver and mediator and commits on the gate
// and then the run fence, which it advances to this takeover.
func (e *Engine) Attempt(ctx context.Context, caller Caller, about audit.Request, data []byte) (*client.RunMaterial, audit.Request, error) {
	var req attemptRequest
	about, err := e.parseRun(caller, about, data, client.KindRunAttempt, &req)
	if err != nil {
		return nil, about, err
	}
	m, err := e.attempt(ctx, caller, &req.RunAttempt, about)
	return m, about, err
}

func (e *Engine) attempt(ctx context.Context, caller Caller, req *client.RunAttempt, about audit.Request) (*client.RunMaterial, error) {
	a, iid := req.Attempt, req.InstanceID
	g, err := e.authorizeCurrent(ctx, caller, &req.Envelope, nil)
	if err != nil {
		return nil, err
	}
	if _, err := e.admittedHere(ctx, a.RunID, iid); err != nil {
		return nil, err
	}
	if err := e.refuseRevoked(ctx, a.RunID); err != nil {
		return nil, err
	}
	if st, err := e.readStatus(ctx, a.RunID); err != nil {
		return nil, err
	} else if !st.Absent() && terminal(st.Row.State) {
		return nil, fault.New(fault.FailedPrecondition, "run %s is %s: a terminal run gets no new attempt", a.RunID, st.Row.State)
	}
	rf, err := e.observeRunFence(ctx, a.RunID)
	if err != nil {
		return nil, err
	}
	if rf.Row.Revoked {
		return nil, revoked(a.RunID)
	}
	if a.Epoch != rf.Row.Epoch+1 || a.FencingToken != rf.Row.FencingToken+1 {
		f := fault.New(fault.Conflict, "attempt epoch and fencing token must each be the next recorded epoch: run %s is at epoch %d, fencing token %d",
			a.RunID, rf.Row.Epoch, rf.Row.FencingToken)
		f.Details = client.RunFence{Epoch: rf.Row.Epoch, FencingToken: rf.Row.FencingToken, Holder: rf.Row.Holder}
		return nil, f
	}
	next := runFence{V: 1, RunID: a.RunID, InstanceID: iid, Holder: req.Identities.Supervisor.ID + "." + a.TakeoverID, TakeoverID: a.TakeoverID,
		Epoch: a.Epoch, FencingToken: a.FencingToken, DriverID: a.DriverID, MediatorID: a.MediatorID}
	return e.runMint(ctx, caller.Owner, &req.Envelope, about, client.KindRunAttempt, "", g, rf, &next)
}

// renewRunDriver serves renewRunDriver: a manager that holds a run's fence (holdsRunFence)
// renews its driver and mediator, committing on the gate and then the run fence as read.
func (e *Engine) renewRunDriver(ctx context.Context, caller Caller, req *Request, about audit.Request) (*client.RunMaterial, error) {
	g, err := e.authorizeCurrent(ctx, caller, &req.Envelope, nil)
	if err != nil {
		return nil, err
	}
	rf, err := e.holdsRunFence(ctx, req.InstanceID, *req.Run)
	if err != nil {
		return nil, err
	}
	return e.runMint(ctx, caller.Owner, &req.Envelope, about, Kind, OpRenewRunDriver, g, rf, nil)
}

// holdsRunFence is the one predicate a run-driver renewal needs (docs/PROTOCOL.md, the run kinds): the run is
// admitted here and not revoked, the run fence's instance, holder, takeover, epoch, fencing
// token and keys are the hold's, and the status row says running with that holder, epoch and
// fencing token. It returns the run fence as read, for the commit.
func (e *Engine) holdsRunFence(ctx context.Context, iid string, h client.RunHold) (*fence.Observed[runFence], error) {
	if _, err := e.admittedHere(ctx, h.RunID, iid); err != nil {
		return nil, err
	}
	if err := e.refuseRevoked(ctx, h.RunID); err != nil {
		return nil, err
	}
	rf, err := e.observeRunFence(ctx, h.RunID)
	if err != nil {
		return nil, err
	}
	switch {
	case rf.Row.Revoked:
		return nil, revoked(h.RunID)
	case rf.Absent() || rf.Row.InstanceID != iid || rf.Row.hold() != h:
		return nil, fault.New(fault.Conflict, "authority moved: the fence of run %s holds another takeover", h.RunID)
	}
	st, err := e.readStatus(ctx, h.RunID)
	if err != nil {
		return nil, err
	}
	if st.Absent() || st.Row.State != client.RunRunning || st.Row.Holder != h.Holder || st.Row.Epoch != h.Epoch || st.Row.FencingToken != h.FencingToken {
		return nil, fault.New(fault.Conflict, "run %s is not running under this hold: its driver reports running before it renews", h.RunID)
	}
	return rf, nil
}

// runMint mints a run's driver and mediator for owner's instance, committing on the gate g and
// then the run fence rf (advanced to next, or rewritten as read), and shapes the reply.
func (e *Engine) runMint(ctx context.Context, owner string, env *client.Envelope, about audit.Request, kind, op string,
	g *issue.Gate, rf *fence.Observed[runFence], next *runFence) (*client.RunMaterial, error) {
	held := rf.Row
	if next != nil {
		held = *next
	}
	keys := map[subjects.Duty]string{subjects.DutyDriver: held.DriverID, subjects.DutyMediator: held.MediatorID}
	fields := map[subjects.Duty]string{subjects.DutyDriver: "attempt.driverId", subjects.DutyMediator: "attempt.mediatorId"}
	if next == nil {
		fields = map[subjects.Duty]string{subjects.DutyDriver: "the run fence's driverId", subjects.DutyMediator: "the run fence's mediatorId"}
	}
	holder := subjects.Holder{Space: e.Space, Owner: owner, Instance: env.InstanceID, RunID: held.RunID}
	grants, err := e.grants(holder, func(d subjects.Duty) (string, string) { return keys[d], fields[d] }, subjects.DutyDriver, subjects.DutyMediator)
	if err != nil {
		return nil, err
	}
	// The run's keys are claimed for the instance in the mint's commit, by the pipeline: a key
	// another instance holds is refused before anything is signed.
	issued, err := e.Pipeline.Issue(ctx, issue.Plan{Instance: issue.MustInstance(owner, env.InstanceID), Request: about, Grants: grants, Ceiling: ceiling(g.Row, env.InstanceID, nil),
		Registered: true, Trust: trustOf(g.Row), Steps: []issue.Step{issue.Unchanged(g), e.runFenceStep(rf, next)}})
	if err != nil {
		return nil, err
	}
	m := &client.RunMaterial{V: 1, Kind: kind, Operation: op, Owner: owner, Actor: subjects.RunActor(held.RunID),
		RequestID: env.RequestID, InstanceID: env.InstanceID, RunID: held.RunID, Credentials: map[string]client.Credential{},
		IssuedAt: issued.At.UnixMilli(), ExpiresAt: issued.Earliest() * 1000, Hold: held.hold(), RunFenceRevision: issued.Revisions[1]}
	for _, c := range issued.Credentials {
		m.Credentials[string(c.Duty)] = client.Credential{JWT: c.JWT, Exp: c.Exp}
	}
	m.GateRevision = issued.Revisions[0] // the gate commits first, then the run fence
	return m, nil
}

// runRequest is a run request as the plane parses it: a closed body with an envelope, the run
// it names, and its own keys to check.
type runRequest interface {
	envelope() *client.Envelope
	runID() string
	checkOwn() error
}

// parseRun decodes a closed run request of kind into req and checks it: its envelope, then its
// own keys. about comes back describing it, whatever the outcome, with only what passed its
// grammar.
func (e *Engine) parseRun(caller Caller, about audit.Request, data []byte, kind string, req runRequest) (audit.Request, error) {
	err := fault.Decode(data, req)
	if err == nil {
		about = describe(about, req.envelope())
		about.RunID = keepIf(req.runID(), subjects.ValidRunID(req.runID()))
		err = checkRun(caller, req.envelope(), kind, e.Space)
	}
	if err == nil {
		err = req.checkOwn()
	}
	return about, err
}

type admissionRequest struct{ client.RunAdmission }

func (r *admissionRequest) envelope() *client.Envelope { return &r.Envelope }
func (r *admissionRequest) runID() string              { return r.Run.RunID }
func (r *admissionRequest) checkOwn() error {
	switch {
	case !subjects.ValidRunID(r.Run.RunID):
		return fault.Field("run.runId", "want run- followed by 32 lowercase hex")
	case r.Run.Subject == "" || len(r.Run.Subject) > maxSubject:
		return fault.Field("run.subject", "want a run-start subject of at most %d bytes", maxSubject)
	}
	return nil
}

type attemptRequest struct{ client.RunAttempt }

func (r *attemptRequest) envelope() *client.Envelope { return &r.Envelope }
func (r *attemptRequest) runID() string              { return r.Attempt.RunID }
func (r *attemptRequest) checkOwn() error {
	a := r.Attempt
	return checkTakeover("attempt", a.RunID, a.TakeoverID, a.Epoch, a.FencingToken, a.DriverID, a.MediatorID, &r.Envelope)
}

// checkRun checks the envelope of a run request: its head, the identities, the current proof,
// account and epoch, the caller's actor and this space.
func checkRun(caller Caller, env *client.Envelope, kind, space string) error {
	if err := checkHead(env, kind); err != nil {
		return err
	}
	if err := checkIdentities(env); err != nil {
		return err
	}
	if err := checkCurrent(env); err != nil {
		return err
	}
	if env.Actor != caller.Actor {
		return fault.Field("actor", "%s is not the caller's actor %q", fault.Quote(env.Actor), caller.Actor)
	}
	if env.Space != space {
		return fault.New(fault.PermissionDenied, "space %q is not this plane's space %q", env.Space, space)
	}
	return nil
}

// errConsumed refuses a run-start another admission consumed.
func errConsumed() *fault.Error {
	return fault.New(fault.PermissionDenied, "run.subject was already consumed by another admission")
}
