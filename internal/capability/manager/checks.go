package manager

import (
	"context"
	"errors"

	"github.com/cotal-ai/authplane/client"
	"github.com/cotal-ai/authplane/internal/core/fault"
	"github.com/cotal-ai/authplane/internal/core/issue"
	"github.com/cotal-ai/authplane/subjects"
)

// requireSupervise refuses the caller unless its ledger row, read now, holds `supervise`.
func (e *Engine) requireSupervise(ctx context.Context, caller Caller) error {
	ok, err := e.holdsSupervise(ctx, caller.Owner, caller.Actor)
	if err != nil {
		return err
	}
	if !ok {
		return fault.New(fault.PermissionDenied, "caller %s needs scope %q; admin and platform-admin do not imply it", caller, Supervise)
	}
	return nil
}

// holdsSupervise reports whether principal owner.actor's ledger row, read now, holds
// `supervise`; a malformed row holds nothing.
func (e *Engine) holdsSupervise(ctx context.Context, owner, actor string) (bool, error) {
	row, found, err := ReadActor(ctx, e.Ledger, owner, actor)
	switch {
	case errors.Is(err, ErrMalformed):
		return false, nil
	case err != nil:
		return false, fault.Store(err, "reading the ledger")
	}
	return found && row.Has(Supervise), nil
}

// observe reads the manager gate of iid (an absent observation when it was never written).
func (e *Engine) observe(ctx context.Context, iid string) (*issue.Gate, error) {
	g, err := issue.GateOf(e.Gates, subjects.GateEndpointManager, iid).Observe(ctx)
	if err != nil {
		return nil, fault.Store(err, "reading the gate of instance %s", iid)
	}
	return g, nil
}

// registered reads the manager gate of iid and refuses one that was never written.
func (e *Engine) registered(ctx context.Context, iid string) (*issue.Gate, error) {
	g, err := e.observe(ctx, iid)
	if err != nil {
		return nil, err
	}
	if g.Absent() {
		return nil, fault.New(fault.FailedPrecondition, "instance %s is not registered; prepare it first", iid)
	}
	return g, nil
}

// checkOwner refuses a gate registered to another owner.
func checkOwner(g *issue.Gate, owner, iid string) error {
	if want := subjects.Principal(owner, subjects.ServeActor(iid)); g.Row.Principal != want {
		return fault.New(fault.PermissionDenied, "instance %s is registered to another owner", iid)
	}
	return nil
}

// checkOpen refuses a frozen or retired gate.
func checkOpen(g *issue.Gate, iid string) error {
	if g.Row.State != issue.GateOpen {
		return fault.New(fault.FailedPrecondition, "the gate of instance %s is %s; it issues nothing", iid, g.Row.State)
	}
	return nil
}

// checkOwnGate refuses another owner's gate, then one that is not open: a stranger learns
// nothing about the state of a gate that is not theirs.
func checkOwnGate(g *issue.Gate, owner, iid string) error {
	if err := checkOwner(g, owner, iid); err != nil {
		return err
	}
	return checkOpen(g, iid)
}

// checkRegistration refuses identities or a lifecycle other than the registration's: a valid
// proof must not mint for other nkeys.
func checkRegistration(g *issue.Gate, req *client.Envelope) error {
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
