package manager

import (
	"context"
	"errors"
	"strings"
	"time"

	"github.com/cotal-ai/authplane/internal/fault"
	"github.com/cotal-ai/authplane/internal/gate"
	"github.com/cotal-ai/authplane/internal/ledger"
	"github.com/cotal-ai/authplane/internal/mint"
	"github.com/cotal-ai/authplane/internal/records"
	"github.com/cotal-ai/authplane/internal/store"
	"github.com/cotal-ai/authplane/subjects"
)

// Recorder writes the records of a mint: `minted` before the commit, `discarded` when the
// commit loses.
type Recorder interface {
	RecordMinted(ctx context.Context, req records.Request, creds []records.Credential) error
	LogMinted(req records.Request, creds []records.Credential)
	Record(ctx context.Context, d records.Decision)
}

// Engine serves manager-service authority for one space.
type Engine struct {
	Space string
	// Account is the data account's public key: the issuer account of every credential.
	Account string
	// Gates is the fence bucket; Ledger the actors bucket.
	Gates  gate.KV
	Ledger ledger.Reader
	Issuer *mint.Issuer
	// ProofKey keys the registration proofs (ProofKey).
	ProofKey []byte
	Records  Recorder
	// StandingTTL is the lifetime of standing credentials; the executor's is min(5m, it).
	StandingTTL time.Duration
	Now         func() time.Time
	// Fenced reports that this plane has been fenced by a newer registration of its own
	// instance; a mint checks it last before committing and is discarded if it says so.
	Fenced func() bool
	// BeforeCommit, when set, runs after a mint is signed and recorded and before it commits
	// (a test seam for the commit fence).
	BeforeCommit func()
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

// Material is the reply to a manager-service-authority request.
type Material struct {
	V                     int                   `json:"v"`
	Kind                  string                `json:"kind"`
	Operation             string                `json:"operation"`
	Owner                 string                `json:"owner"`
	Actors                map[string]string     `json:"actors"`
	Credentials           map[string]Credential `json:"credentials"`
	IssuedAt              int64                 `json:"issuedAt"`  // milliseconds
	ExpiresAt             int64                 `json:"expiresAt"` // milliseconds: the earliest credential expiry
	RegistrationProof     string                `json:"registrationProof,omitempty"`
	NextRegistrationProof string                `json:"nextRegistrationProof,omitempty"`
	RequestID             string                `json:"requestId"`
	InstanceID            string                `json:"instanceId"`
	ManagerLifecycleUID   string                `json:"managerLifecycleUid"`
	AccountPublicKey      string                `json:"accountPublicKey"`
	ProcessEpoch          uint64                `json:"processEpoch"`

	minted []records.Credential
}

// MintedCredentials names the credentials the material carries by their public keys, for
// whoever must record them discarded if it withholds the material.
func (m *Material) MintedCredentials() []records.Credential { return m.minted }

// Credential is one minted user JWT and its expiry (seconds).
type Credential struct {
	JWT string `json:"jwt"`
	Exp int64  `json:"exp"`
}

// ServiceAuthority serves a manager-service-authority request from caller on the
// manager-authority endpoint. note is filled in for the request's records as it parses.
//
// Refusals: bad-request (body), unimplemented (operations and keys out of scope),
// permission-denied (scope, owner, space, account, identities, proof), failed-precondition (no
// gate, a frozen or retired gate, a delete marker), conflict (stale epoch, gate moved before
// commit), unavailable and resource-exhausted (stores).
func (e *Engine) ServiceAuthority(ctx context.Context, caller Caller, data []byte, note *records.Request) (*Material, error) {
	req, err := Parse(data)
	if req != nil {
		// Only what passed its grammar reaches the records: a refused body's fields may be
		// anything a caller chose.
		note.Kind = Kind
		note.Operation = keepIf(req.Operation, knownOperations[req.Operation])
		note.InstanceID = keepIf(req.InstanceID, subjects.ValidUID(req.InstanceID))
		note.RequestID = keepIf(req.RequestID, subjects.ValidRequestID(req.RequestID))
	}
	if err != nil {
		return nil, err
	}
	if req.Actor != caller.Actor {
		return nil, fault.Field("actor", "%q is not the caller's actor %q", req.Actor, caller.Actor)
	}
	if req.Space != e.Space {
		return nil, fault.New(fault.PermissionDenied, "space %q is not this plane's space %q", req.Space, e.Space)
	}
	switch req.Operation {
	case OpPrepare:
		return e.prepare(ctx, caller, req, note)
	case OpActivate:
		return e.activate(ctx, caller, req, note)
	default:
		return e.renew(ctx, caller, req, note)
	}
}

var knownOperations = map[string]bool{
	OpPrepare: true, OpActivate: true, OpRenew: true, OpRenewStandingBundle: true, OpRenewRunDriver: true,
	"session": true, "retire": true, "transferReader": true,
}

func keepIf(s string, ok bool) string {
	if ok {
		return s
	}
	return ""
}

// requireSupervise refuses unless principal's ledger row, read now, holds `supervise`.
func (e *Engine) requireSupervise(ctx context.Context, owner, actor, whose string) error {
	row, found, err := ledger.Read(ctx, e.Ledger, owner, actor)
	if errors.Is(err, ledger.ErrMalformed) {
		found = false
	} else if err != nil {
		return fault.Wrap(fault.Unavailable, err, "the ledger could not be read; retry shortly")
	}
	if !found || !row.Has(ledger.Supervise) {
		return fault.New(fault.PermissionDenied, "%s %s needs scope %q; admin and platform-admin do not imply it", whose, subjects.Principal(owner, actor), ledger.Supervise)
	}
	return nil
}

func (e *Engine) observe(ctx context.Context, iid string) (*gate.Gate, error) {
	return gate.Observe(ctx, e.Gates, subjects.GateKey(subjects.GateEndpointManager, iid))
}

// prepare creates the instance's gate open at epoch 0, or re-registers it (epoch and
// registration revision + 1), and mints the supervisor and executor. The gate write is the
// mint's commit: one CAS records the registration and fences the mint.
func (e *Engine) prepare(ctx context.Context, caller Caller, req *Request, note *records.Request) (*Material, error) {
	if err := e.requireSupervise(ctx, caller.Owner, caller.Actor, "caller"); err != nil {
		return nil, err
	}
	g, err := e.observe(ctx, req.InstanceID)
	if err != nil {
		return nil, err
	}
	principal := subjects.Principal(caller.Owner, subjects.ServeActor(req.InstanceID))
	reg := &gate.Registration{
		LifecycleUID:     req.ManagerLifecycleUID,
		IdentitiesDigest: IdentitiesDigest(*req.Identities),
		PreparedBy:       caller.String(),
	}
	var row gate.Row
	if g == nil {
		row = gate.Row{State: gate.Open, Generation: 1, RegistrationRevision: 1, Principal: principal, Registration: reg}
	} else {
		if err := checkOwnGate(g, caller.Owner, req.InstanceID); err != nil {
			return nil, err
		}
		row = g.Row
		row.ProcessEpoch++
		row.RegistrationRevision++
		row.Registration = reg
	}
	row.Nonce = "" // Transition sets a fresh one
	m, err := e.issue(ctx, issuance{
		caller: caller, req: req, note: note, observed: g, next: &row,
		duties: []subjects.Duty{subjects.DutySupervisor, subjects.DutyExecutor},
	})
	if err != nil {
		return nil, err
	}
	m.RegistrationProof = proof(e.ProofKey, labelRegistration, e.Space, caller.Owner, req.InstanceID, row)
	return m, nil
}

// checkOwner refuses a gate registered to another owner.
func checkOwner(g *gate.Gate, owner, iid string) error {
	if want := subjects.Principal(owner, subjects.ServeActor(iid)); g.Row.Principal != want {
		return fault.New(fault.PermissionDenied, "instance %s is registered to another owner", iid)
	}
	return nil
}

// checkOpen refuses a frozen or retired gate.
func checkOpen(g *gate.Gate, iid string) error {
	if g.Row.State != gate.Open {
		return fault.New(fault.FailedPrecondition, "the gate of instance %s is %s; it issues nothing", iid, g.Row.State)
	}
	return nil
}

// checkOwnGate refuses another owner's gate, then one that is not open: a stranger learns
// nothing about the state of a gate that is not theirs.
func checkOwnGate(g *gate.Gate, owner, iid string) error {
	if err := checkOwner(g, owner, iid); err != nil {
		return err
	}
	return checkOpen(g, iid)
}

// checkRegistration refuses identities or a lifecycle other than the registration's: a valid
// proof must not mint for other nkeys.
func checkRegistration(g *gate.Gate, req *Request) error {
	reg := g.Row.Registration
	if reg == nil {
		return fault.New(fault.FailedPrecondition, "instance %s carries no registration; prepare it first", req.InstanceID)
	}
	if reg.LifecycleUID != req.ManagerLifecycleUID {
		return fault.New(fault.PermissionDenied, "managerLifecycleUid is not the registered lifecycle of instance %s", req.InstanceID)
	}
	if !proofEqual(reg.IdentitiesDigest, IdentitiesDigest(*req.Identities)) {
		return fault.New(fault.PermissionDenied, "identities are not the registered identities of instance %s", req.InstanceID)
	}
	return nil
}

// activate mints serve, goalWriter and sessionLedger for the registration prepare recorded,
// against the registration proof, and returns the proof renewals need.
func (e *Engine) activate(ctx context.Context, caller Caller, req *Request, note *records.Request) (*Material, error) {
	if err := e.requireSupervise(ctx, caller.Owner, caller.Actor, "caller"); err != nil {
		return nil, err
	}
	g, err := e.observe(ctx, req.InstanceID)
	if err != nil {
		return nil, err
	}
	if g == nil {
		return nil, fault.New(fault.FailedPrecondition, "instance %s is not registered; prepare it first", req.InstanceID)
	}
	if err := checkOwnGate(g, caller.Owner, req.InstanceID); err != nil {
		return nil, err
	}
	if err := checkRegistration(g, req); err != nil {
		return nil, err
	}
	if !proofEqual(*req.RegistrationProof, proof(e.ProofKey, labelRegistration, e.Space, caller.Owner, req.InstanceID, g.Row)) {
		return nil, fault.New(fault.PermissionDenied, "registrationProof is not the proof of the current registration of instance %s", req.InstanceID)
	}
	m, err := e.issue(ctx, issuance{
		caller: caller, req: req, note: note, observed: g,
		duties: []subjects.Duty{subjects.DutyServe, subjects.DutyGoalWriter, subjects.DutySessionLedger},
	})
	if err != nil {
		return nil, err
	}
	m.NextRegistrationProof = proof(e.ProofKey, labelCurrent, e.Space, caller.Owner, req.InstanceID, g.Row)
	return m, nil
}

// renew serves renew (supervisor and executor) and renewStandingBundle (all five) for a
// principal with `supervise`, or for the instance's own supervisor or executor, whose preparer
// must still hold `supervise`.
func (e *Engine) renew(ctx context.Context, caller Caller, req *Request, note *records.Request) (*Material, error) {
	ownDuty := caller.Actor == subjects.SupervisorActor(req.InstanceID) || caller.Actor == subjects.ExecutorActor(req.InstanceID)
	if !ownDuty {
		if err := e.requireSupervise(ctx, caller.Owner, caller.Actor, "caller"); err != nil {
			return nil, err
		}
	}
	if *req.AccountPublicKey != e.Account {
		return nil, fault.New(fault.PermissionDenied, "accountPublicKey is not this space's data account")
	}
	g, err := e.observe(ctx, req.InstanceID)
	if err != nil {
		return nil, err
	}
	if g == nil {
		return nil, fault.New(fault.FailedPrecondition, "instance %s is not registered; prepare it first", req.InstanceID)
	}
	if err := checkOpen(g, req.InstanceID); err != nil {
		return nil, err
	}
	if err := checkOwner(g, caller.Owner, req.InstanceID); err != nil {
		return nil, err
	}
	if *req.ProcessEpoch != g.Row.ProcessEpoch {
		return nil, fault.New(fault.Conflict, "processEpoch is stale: instance %s is at epoch %d", req.InstanceID, g.Row.ProcessEpoch)
	}
	if err := checkRegistration(g, req); err != nil {
		return nil, err
	}
	if !proofEqual(*req.RegistrationProof, proof(e.ProofKey, labelCurrent, e.Space, caller.Owner, req.InstanceID, g.Row)) {
		return nil, fault.New(fault.PermissionDenied, "registrationProof is not the current proof of instance %s", req.InstanceID)
	}
	if ownDuty {
		// Behind an instance's own duties stands a person: whoever prepared it must still hold
		// supervise, read now.
		o, a, ok := strings.Cut(g.Row.Registration.PreparedBy, ".")
		if !ok {
			return nil, fault.New(fault.Internal, "the registration of instance %s names no preparer", req.InstanceID)
		}
		if err := e.requireSupervise(ctx, o, a, "the preparer of this instance,"); err != nil {
			return nil, err
		}
	}
	duties := []subjects.Duty{subjects.DutySupervisor, subjects.DutyExecutor}
	if req.Operation == OpRenewStandingBundle {
		duties = subjects.StandingDuties
	}
	return e.issue(ctx, issuance{caller: caller, req: req, note: note, observed: g, duties: duties})
}

// errStore turns a store failure into the refusal a caller can act on.
func errStore(err error, what string) *fault.Error {
	if errors.Is(err, store.ErrFull) {
		return fault.Wrap(fault.ResourceExhausted, err, "%s: the store is full", what)
	}
	return fault.Wrap(fault.Unavailable, err, "%s failed; retry shortly", what)
}
