package manager

import (
	"context"
	"strings"

	"github.com/cotal-ai/authplane/client"
	"github.com/cotal-ai/authplane/internal/core/fault"
	"github.com/cotal-ai/authplane/internal/core/issue"
	"github.com/cotal-ai/authplane/subjects"
)

// authorizeCurrent authorizes a request past activate (a renewal, a run's admission or
// attempt) from caller for an instance of the caller's owner, and returns its gate as read.
// The caller holds `supervise`, is a platform supervisor (sup, whose checks are its own), or
// is the instance's own supervisor or executor, behind whom stands a person: whoever prepared
// it must still hold `supervise`, read now, or on a supervised gate its assignment must still
// stand. The manager's registration must authenticate the request. A person's ledger row and
// the gate are read at once, and decided on in that order.
func (e *Engine) authorizeCurrent(ctx context.Context, caller Caller, env *client.Envelope, sup *Supervision) (*issue.Gate, error) {
	iid := env.InstanceID
	ownDuty := sup == nil && (caller.Actor == subjects.SupervisorActor(iid) || caller.Actor == subjects.ExecutorActor(iid))
	if !ownDuty && sup == nil {
		gateRead := e.readAhead(ctx, iid)
		if err := e.requireSupervise(ctx, caller); err != nil {
			return nil, err
		}
		return e.authenticateOn(ctx, caller.Owner, env, gateRead)
	}
	g, err := e.authenticate(ctx, caller.Owner, env)
	if err != nil {
		return nil, err
	}
	switch {
	case ownDuty && g.Row.SupervisedUntil != 0:
		// A supervised instance's own duties stand on its assignment, read now.
		if e.Assignments == nil {
			return nil, fault.New(fault.PermissionDenied, "instance %s is supervised and this plane cannot read assignments", iid)
		}
		if err := e.Assignments.Vouch(ctx, caller.Owner, iid, env.ManagerLifecycleUID); err != nil {
			return nil, err
		}
	case ownDuty:
		// Behind an instance's own duties stands a person: whoever prepared it must still hold
		// supervise, read now.
		o, a, ok := strings.Cut(g.Row.Registration.PreparedBy, ".")
		if !ok {
			return nil, fault.New(fault.Internal, "the registration of instance %s names no preparer", iid)
		}
		// The refusal names no one: the preparer is not the caller of this request.
		if ok, err := e.holdsSupervise(ctx, o, a); err != nil {
			return nil, err
		} else if !ok {
			return nil, fault.New(fault.PermissionDenied, "whoever prepared instance %s no longer holds scope %q; its own duties renew only while they do", iid, Supervise)
		}
	}
	return g, nil
}

// readAhead starts reading iid's gate (as registered reads it) and returns the wait for it.
// The read ends with ctx at the latest, whether or not anyone waits for it.
func (e *Engine) readAhead(ctx context.Context, iid string) func() (*issue.Gate, error) {
	type read struct {
		g   *issue.Gate
		err error
	}
	done := make(chan read, 1)
	go func() {
		g, err := e.registered(ctx, iid)
		done <- read{g, err}
	}()
	return func() (*issue.Gate, error) {
		r := <-done
		return r.g, r.err
	}
}

// authenticate checks env against the registration of owner's instance (the original's
// renewal authorizer): this space's data account, the gate registered, open and owner's, the
// process epoch current, the identities and lifecycle the registered ones, and the current
// proof, compared in constant time. It returns the gate as read.
func (e *Engine) authenticate(ctx context.Context, owner string, env *client.Envelope) (*issue.Gate, error) {
	return e.authenticateOn(ctx, owner, env, func() (*issue.Gate, error) { return e.registered(ctx, env.InstanceID) })
}

// authenticateOn is authenticate with the gate read by read, once the account is checked.
func (e *Engine) authenticateOn(ctx context.Context, owner string, env *client.Envelope, read func() (*issue.Gate, error)) (*issue.Gate, error) {
	iid := env.InstanceID
	if *env.AccountPublicKey != e.Account {
		return nil, fault.New(fault.PermissionDenied, "accountPublicKey is not this space's data account")
	}
	g, err := read()
	if err != nil {
		return nil, err
	}
	if err := checkOpen(g, iid); err != nil {
		return nil, err
	}
	if err := checkOwner(g, owner, iid); err != nil {
		return nil, err
	}
	if *env.ProcessEpoch != g.Row.ProcessEpoch {
		return nil, fault.New(fault.Conflict, "processEpoch is stale: instance %s is at epoch %d", iid, g.Row.ProcessEpoch)
	}
	if err := checkRegistration(g, env); err != nil {
		return nil, err
	}
	key, err := e.trustedKey(ctx, g)
	if err != nil {
		return nil, err
	}
	if !proofEqual(*env.RegistrationProof, proof(key, labelCurrent, e.Space, owner, iid, g.Row)) {
		return nil, fault.New(fault.PermissionDenied, "registrationProof is not the current proof of instance %s", iid)
	}
	return g, nil
}
