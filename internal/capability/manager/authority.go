package manager

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/cotal-ai/authplane/client"
	"github.com/cotal-ai/authplane/internal/core/audit"
	"github.com/cotal-ai/authplane/internal/core/fault"
	"github.com/cotal-ai/authplane/internal/core/fence"
	"github.com/cotal-ai/authplane/internal/core/issue"
	"github.com/cotal-ai/authplane/subjects"
)

// Engine serves manager-service authority for one space.
type Engine struct {
	Space string
	// Account is the data account's public key: the issuer account of every credential.
	Account string
	// Gates is the fence bucket (gates, run fences); Ledger the actors bucket; Admissions the
	// create-only bucket of run admissions, revocation markers and witness markers; Statuses
	// the run-status bucket; Witness the run-starts witnessed.
	Gates      fence.KV
	Ledger     fence.KV
	Admissions fence.KV
	Statuses   fence.KV
	Witness    Witness
	// Pipeline mints: every credential this engine issues goes through it.
	Pipeline *issue.Pipeline
	// ProofKey keys the registration proofs (ProofKey) when Trust is nil; Trust, when set,
	// says which generation's root keys them now.
	ProofKey  []byte
	Trust     Trust
	proofKeys proofKeys
	// StandingTTL is the lifetime of standing credentials; the executor's is min(5m, it).
	StandingTTL time.Duration
	// MaxInstancesPerOwner bounds an owner's live (non-retired) instances.
	MaxInstancesPerOwner int
	// Assignments vouches for a supervised instance's own renewals (docs/PROTOCOL.md, "manager-authority"); nil refuses
	// them.
	Assignments Assignments
	// Reregistrations, when set, bound the prepares of instances already registered.
	Reregistrations *Reregistrations
	// Records records the run decisions that mint nothing, admissions and revocations (the
	// pipeline records the mints); nil records none.
	Records RunRecords
}

// RunRecords records a run's admission and its revocation (audit.Writer).
type RunRecords interface {
	RunAdmitted(ctx context.Context, req audit.Request, subject string)
	RunRevoked(ctx context.Context, req audit.Request, reason string)
}

// Assignments is what a supervised instance's own renewal stands on instead of its preparer's
// scope: owner's platform supervisor assignment, read now, still assigned to instance iid and
// lifecycle uid, its end not passed.
type Assignments interface {
	Vouch(ctx context.Context, owner, iid, uid string) error
}

// Supervision is what an operation runs under when a platform admin asks on an owner's behalf
// (supervisor-authority, docs/PROTOCOL.md). The admin's checks (its scope, the assignment, the
// ended-assignment fence) are the supervisor's; the operation then needs no `supervise` of its
// caller.
type Supervision struct {
	// By is the platform admin who asked: a supervised prepare's preparedBy.
	By string
	// Until is the assignment's end: a supervised prepare stamps it on the gate as
	// supervisedUntil, and every credential is clamped to it.
	Until time.Time
	// Hook records the supervisor and executor generations between signing and committing.
	Hook func(ctx context.Context, creds []issue.Credential) error
}

// Caller is the principal a request came from: the subject's last two tokens.
type Caller struct {
	Owner string
	Actor string
}

// String returns the caller's `<owner>.<actor>`.
func (c Caller) String() string { return subjects.Principal(c.Owner, c.Actor) }

// ExecutorTTL is the executor duty's lifetime cap.
const ExecutorTTL = 5 * time.Minute

// ServiceAuthority serves a manager-service-authority request from caller. about names the
// endpoint and caller; it comes back with what the request was about as far as it parsed (only
// what passed its grammar), for the records, whatever the outcome.
//
// Refusals: bad-request (body), unimplemented (operations and keys out of scope),
// permission-denied (scope, owner, space, account, identities, proof, an ended supervision),
// failed-precondition (no gate, a frozen or retired gate, a delete marker), conflict (stale
// epoch, gate moved before commit), unavailable and resource-exhausted (stores).
//
// The reply is a *client.Material, or for renewRunDriver a *client.RunMaterial.
func (e *Engine) ServiceAuthority(ctx context.Context, caller Caller, about audit.Request, data []byte) (any, audit.Request, error) {
	req, err := Parse(data)
	if req != nil {
		about = describe(about, &req.Envelope)
		about.Kind = Kind
		about.Operation = keepIf(req.Operation, knownOperations[req.Operation])
		if req.Run != nil {
			about.RunID = keepIf(req.Run.RunID, subjects.ValidRunID(req.Run.RunID))
		}
	}
	if err != nil {
		return nil, about, err
	}
	if req.Actor != caller.Actor {
		return nil, about, fault.Field("actor", "%q is not the caller's actor %q", req.Actor, caller.Actor)
	}
	if req.Space != e.Space {
		return nil, about, fault.New(fault.PermissionDenied, "space %q is not this plane's space %q", req.Space, e.Space)
	}
	var reply any
	if req.Operation == OpRenewRunDriver {
		reply, err = e.renewRunDriver(ctx, caller, req, about)
	} else {
		reply, err = e.operate(ctx, caller, req, about, nil)
	}
	if err != nil {
		return nil, about, err
	}
	return reply, about, nil
}

// Supervised serves req, a parsed manager-service request (prepare, activate, renew or
// renewStandingBundle), for owner's instance as the platform supervisor sup
// (supervisor-authority): the operation's own checks, and then the mint, clamped to sup.Until
// and staged through sup.Hook. Refusals as ServiceAuthority's.
func (e *Engine) Supervised(ctx context.Context, owner string, sup *Supervision, req *Request, about audit.Request) (*client.Material, error) {
	if req.Operation == OpRenewRunDriver {
		return nil, fault.New(fault.PermissionDenied, "a platform supervisor may not ask for operation %s", req.Operation)
	}
	return e.operate(ctx, Caller{Owner: owner, Actor: req.Actor}, req, about, sup)
}

// operate runs req's operation for caller, under sup when a platform supervisor asks.
func (e *Engine) operate(ctx context.Context, caller Caller, req *Request, about audit.Request, sup *Supervision) (*client.Material, error) {
	switch req.Operation {
	case OpPrepare:
		return e.prepare(ctx, caller, req, about, sup)
	case OpActivate:
		return e.activate(ctx, caller, req, about, sup)
	}
	return e.renew(ctx, caller, req, about, sup)
}

// prepare creates the instance's gate open at epoch 0, or re-registers it (epoch and
// registration revision + 1), and mints the supervisor and executor. The gate write is the
// mint's commit: one CAS records the registration and fences the mint.
func (e *Engine) prepare(ctx context.Context, caller Caller, req *Request, about audit.Request, sup *Supervision) (*client.Material, error) {
	preparedBy := caller.String()
	if sup != nil {
		preparedBy = sup.By
	} else if err := e.requireSupervise(ctx, caller); err != nil {
		return nil, err
	}
	g, err := e.observe(ctx, req.InstanceID)
	if err != nil {
		return nil, err
	}
	trust, key, err := e.trust(ctx)
	if err != nil {
		return nil, err
	}
	reg := &issue.Registration{
		LifecycleUID:     req.ManagerLifecycleUID,
		IdentitiesDigest: IdentitiesDigest(*req.Identities),
		PreparedBy:       preparedBy,
		Trust:            trust,
	}
	var row issue.GateRow
	var steps []issue.Step
	var spends []issue.Spend
	if g.Absent() {
		// A new instance: it takes one of its owner's slots, in the same commit as its gate.
		if err := e.checkQuota(ctx, caller.Owner); err != nil {
			return nil, err
		}
		steps = append(steps, e.takeSlot(ctx, caller.Owner, req.InstanceID))
		principal := subjects.Principal(caller.Owner, subjects.ServeActor(req.InstanceID))
		row = issue.GateRow{State: issue.GateOpen, Generation: 1, RegistrationRevision: 1, Principal: principal, Registration: reg}
	} else {
		if err := checkOwnGate(g, caller.Owner, req.InstanceID); err != nil {
			return nil, err
		}
		left, owners, err := e.Reregistrations.take(g.Row.Reregistrations, caller.Owner, req.InstanceID)
		if err != nil {
			return nil, err
		}
		spends = owners
		row = g.Row
		row.ProcessEpoch++
		row.RegistrationRevision++
		row.Registration = reg
		row.Reregistrations = left
	}
	if sup != nil {
		row.SupervisedUntil = sup.Until.Unix()
	}
	// The registration binds all five identities, which later mints sign: the pipeline claims
	// them for the instance in this commit, before the quota and the gate.
	steps = append(steps, issue.Replaced(g, row))
	m, err := e.mint(ctx, caller.Owner, req, about, row, !g.Absent(), steps, spends, sup,
		subjects.DutySupervisor, subjects.DutyExecutor)
	if err != nil {
		return nil, err
	}
	m.RegistrationProof = proof(key, labelRegistration, e.Space, caller.Owner, req.InstanceID, row)
	return m, nil
}

// activate mints serve, goalWriter and sessionLedger for the registration prepare recorded,
// against the registration proof, and returns the proof renewals need.
func (e *Engine) activate(ctx context.Context, caller Caller, req *Request, about audit.Request, sup *Supervision) (*client.Material, error) {
	if sup == nil {
		if err := e.requireSupervise(ctx, caller); err != nil {
			return nil, err
		}
	}
	g, err := e.registered(ctx, req.InstanceID)
	if err != nil {
		return nil, err
	}
	if err := checkOwnGate(g, caller.Owner, req.InstanceID); err != nil {
		return nil, err
	}
	if err := checkRegistration(g, &req.Envelope); err != nil {
		return nil, err
	}
	key, err := e.trustedKey(ctx, g)
	if err != nil {
		return nil, err
	}
	if !proofEqual(*req.RegistrationProof, proof(key, labelRegistration, e.Space, caller.Owner, req.InstanceID, g.Row)) {
		return nil, fault.New(fault.PermissionDenied, "registrationProof is not the proof of the current registration of instance %s", req.InstanceID)
	}
	m, err := e.mint(ctx, caller.Owner, req, about, g.Row, true, []issue.Step{issue.Unchanged(g)}, nil, sup,
		subjects.DutyServe, subjects.DutyGoalWriter, subjects.DutySessionLedger)
	if err != nil {
		return nil, err
	}
	m.NextRegistrationProof = proof(key, labelCurrent, e.Space, caller.Owner, req.InstanceID, g.Row)
	return m, nil
}

// renew serves renew (supervisor and executor) and renewStandingBundle (all five) for a
// principal with `supervise`, a platform supervisor, or the instance's own supervisor or
// executor, whose preparer must still hold `supervise` (on a supervised gate: whose assignment
// must still stand).
func (e *Engine) renew(ctx context.Context, caller Caller, req *Request, about audit.Request, sup *Supervision) (*client.Material, error) {
	g, err := e.authorizeCurrent(ctx, caller, &req.Envelope, sup)
	if err != nil {
		return nil, err
	}
	duties := []subjects.Duty{subjects.DutySupervisor, subjects.DutyExecutor}
	if req.Operation == OpRenewStandingBundle {
		duties = subjects.StandingDuties
	}
	return e.mint(ctx, caller.Owner, req, about, g.Row, true, []issue.Step{issue.Unchanged(g)}, nil, sup, duties...)
}

// mint issues duties of owner's instance through the pipeline, committing with steps (the
// manager's gate last), and shapes the material. row is the gate row the material describes
// (for prepare, the registration it writes); registered: the gate was read registered and open
// (all but an instance's first prepare). A supervised instance's every credential, and every
// credential a platform supervisor asks for, is clamped to its assignment's end, and refused
// once that has passed.
func (e *Engine) mint(ctx context.Context, owner string, req *Request, about audit.Request, row issue.GateRow, registered bool, steps []issue.Step, spends []issue.Spend, sup *Supervision, duties ...subjects.Duty) (*client.Material, error) {
	iid := req.InstanceID
	if slices.Contains(duties, subjects.DutyServe) {
		// The serve duty receives its owner's run-starts: the owner's witness captures them
		// from before it can.
		e.Witness.OpenWitness(ctx, owner)
	}
	grants, err := e.grants(subjects.Holder{Space: e.Space, Owner: owner, Instance: iid}, identityKey(req.Identities), duties...)
	if err != nil {
		return nil, err
	}
	plan := issue.Plan{Instance: issue.MustInstance(owner, iid), Request: about, Grants: grants, Ceiling: ceiling(row, iid, sup), Steps: steps, Spends: spends, Registered: registered,
		Trust: trustOf(row)}
	if req.Operation == OpPrepare {
		for _, d := range subjects.StandingDuties {
			nkey, field := identityKey(req.Identities)(d)
			plan.Binds = append(plan.Binds, issue.Key{NKey: nkey, Field: field})
		}
	}
	if sup != nil {
		plan.Hook = sup.Hook
	}
	issued, err := e.Pipeline.Issue(ctx, plan)
	if err != nil {
		return nil, err
	}
	m := &client.Material{
		V: 1, Kind: Kind, Operation: req.Operation, Owner: owner,
		Actors:      map[string]string{},
		Credentials: map[string]client.Credential{},
		IssuedAt:    issued.At.UnixMilli(),
		ExpiresAt:   issued.Earliest() * 1000,
		RequestID:   req.RequestID, InstanceID: iid, ManagerLifecycleUID: req.ManagerLifecycleUID,
		AccountPublicKey: e.Account, ProcessEpoch: row.ProcessEpoch,
		GateRevision: issued.Revisions[len(issued.Revisions)-1],
	}
	for _, d := range subjects.StandingDuties {
		m.Actors[string(d)] = subjects.DutyActor(d, iid, "")
	}
	for _, c := range issued.Credentials {
		m.Credentials[string(c.Duty)] = client.Credential{JWT: c.JWT, Exp: c.Exp}
	}
	return m, nil
}

// identityKey is the key of a duty among a request's identities, and the field that names it.
func identityKey(ids *client.Identities) func(subjects.Duty) (string, string) {
	return func(d subjects.Duty) (string, string) { return ids.Of(d), "identities." + string(d) }
}

// grants are the credentials of duties for holder, each for the key keyOf names for it (and
// the field that named it).
func (e *Engine) grants(holder subjects.Holder, keyOf func(subjects.Duty) (string, string), duties ...subjects.Duty) ([]issue.Grant, error) {
	var out []issue.Grant
	for _, d := range duties {
		actor, perms, err := subjects.PermissionsOf(d, holder)
		if err != nil {
			return nil, fault.Wrap(fault.Internal, err, "no permissions for duty %s", d)
		}
		ttl := e.StandingTTL
		if d == subjects.DutyExecutor {
			ttl = min(ttl, ExecutorTTL)
		}
		key, field := keyOf(d)
		out = append(out, issue.Grant{Duty: d, Key: key, Field: field, Principal: subjects.Principal(holder.Owner, actor), TTL: ttl, Permissions: perms})
	}
	return out, nil
}

// ceiling is what a supervised instance's every credential is clamped to, whatever door or
// duty: the end of the platform supervisor assignment it was prepared under (docs/PROTOCOL.md, "supervisor-assign" to "supervisor-end"), or
// of the one a platform supervisor asks under now (sup), whichever comes first.
func ceiling(row issue.GateRow, iid string, sup *Supervision) issue.Ceiling {
	until := row.SupervisedUntil
	if sup != nil && (until == 0 || sup.Until.Unix() < until) {
		until = sup.Until.Unix()
	}
	if until == 0 {
		return issue.Ceiling{}
	}
	return issue.Ceiling{At: time.Unix(until, 0),
		What: fmt.Sprintf("the platform supervisor assignment of instance %s", iid)}
}
