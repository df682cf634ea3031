package supervisor

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/cotal-ai/authplane/client"
	"github.com/cotal-ai/authplane/internal/capability/manager"
	"github.com/cotal-ai/authplane/internal/core/audit"
	"github.com/cotal-ai/authplane/internal/core/fault"
	"github.com/cotal-ai/authplane/internal/core/fence"
	"github.com/cotal-ai/authplane/internal/core/issue"
	"github.com/cotal-ai/authplane/subjects"
)

// Assignment is `assignment.<owner>` in the platform bucket: the reply to supervisor-assign
// (client.Assignment: the original's host record, plus who assigned it) with a writer-unique
// nonce, and without the revision, which is the KV revision (never stored). Instance, lifecycle
// and expiresAt never change. Its state goes assigned → ending (an end began) → ended (the
// end's outcome is settled), and never back.
type Assignment struct {
	client.Assignment `json:",inline"`
	Nonce             string `json:"nonce"`
}

// The states of an assignment, as stored.
const (
	// StateAssigned: in force.
	StateAssigned = "assigned"
	// StateEnding: an end began; it authorizes nothing, and no new assignment for the owner is
	// made until a repeat of the end completes it.
	StateEnding = "ending"
	// StateEnded: the end's outcome is settled (every key revoked at the broker, or recorded as
	// not possible). Terminal.
	StateEnded = "ended"
)

// kindAssignment is the `kind` of a stored assignment row.
const kindAssignment = "platform-supervisor"

// maxAssignmentRow bounds a stored assignment.
const maxAssignmentRow = 4 << 10

// parseAssignment decodes and checks a stored assignment.
func parseAssignment(data []byte) (Assignment, error) {
	var a Assignment
	if err := fault.DecodeRow(data, &a, maxAssignmentRow); err != nil {
		return Assignment{}, err
	}
	switch {
	case a.V != 1 || a.Kind != kindAssignment:
		return Assignment{}, errors.New("not a version 1 platform-supervisor row")
	case a.State != StateAssigned && a.State != StateEnding && a.State != StateEnded:
		return Assignment{}, fmt.Errorf("state %q", a.State)
	case a.Nonce == "":
		return Assignment{}, errors.New("no nonce")
	case a.Revision != 0:
		return Assignment{}, errors.New("a stored revision")
	}
	return a, nil
}

// over reports whether the assignment authorizes nothing more: its end began.
func (a Assignment) over() bool { return a.State != StateAssigned }

// assignmentOf is the fence of owner's assignment in the platform bucket.
func (s *Supervisor) assignmentOf(owner string) *fence.Fence[Assignment] {
	return fence.New(s.Platform, subjects.AssignmentKey(owner), parseAssignment, func(a *Assignment) { a.Nonce = subjects.NewNonce() })
}

// observedAssignment is an assignment as read: the row and its revision.
type observedAssignment = fence.Observed[Assignment]

// record is the reply form of an observed assignment: the row and its revision.
func record(o *observedAssignment) *client.Assignment {
	a := o.Row.Assignment
	a.Scope, a.Revision = slices.Clone(a.Scope), o.Revision
	return &a
}

// auditOf names an observed assignment in a record.
func auditOf(o *observedAssignment) audit.Assignment {
	a := o.Row
	return audit.Assignment{Owner: a.Owner, InstanceID: a.InstanceID, LifecycleUID: a.LifecycleUID, ExpiresAt: a.ExpiresAt, State: a.State, Revision: o.Revision}
}

// endedRefusal is the refusal of everything an ended assignment once allowed (the original's
// platformSupervisorEnded): the text names the owner the caller named.
func endedRefusal(owner string, cause error) *fault.Error {
	return fault.Wrap(fault.PermissionDenied, cause, "platform supervisor assignment for owner %s has ended; its lifecycle has ended and material issued under it authorizes nothing", owner)
}

// lapsed is the refusal once an assignment's expiresAt has passed.
func lapsed(owner string) *fault.Error {
	return fault.New(fault.PermissionDenied, "platform supervisor lifecycle has ended for owner %s", owner)
}

// requirePlatformAdmin refuses the caller unless its ledger row, read now, holds
// `platform-admin`.
func (s *Supervisor) requirePlatformAdmin(ctx context.Context, caller manager.Caller) error {
	row, found, err := manager.ReadActor(ctx, s.Ledger, caller.Owner, caller.Actor)
	switch {
	case errors.Is(err, manager.ErrMalformed):
		found = false
	case err != nil:
		return fault.Store(err, "reading the ledger")
	}
	if !found || !row.Has(manager.PlatformAdmin) {
		return fault.New(fault.PermissionDenied, "caller %s needs scope %q; supervise and admin do not imply it", caller, manager.PlatformAdmin)
	}
	return nil
}

// readAssignment reads owner's assignment and refuses one that does not exist or does not
// name this owner, space and data account.
func (s *Supervisor) readAssignment(ctx context.Context, owner string) (*observedAssignment, error) {
	o, err := s.assignmentOf(owner).Observe(ctx)
	if err != nil {
		return nil, fault.Store(err, "reading the platform supervisor assignment of owner %s", owner)
	}
	if o.Absent() {
		return nil, fault.New(fault.PermissionDenied, "owner %s has no platform supervisor assignment", owner)
	}
	if a := o.Row; a.Owner != owner || a.Space != s.Space || a.AccountPublicKey != s.Account {
		return nil, fault.New(fault.PermissionDenied, "the platform supervisor assignment of owner %s names another owner, space or account", owner)
	}
	return o, nil
}

// Assign serves supervisor-assign for caller: it writes `assignment.<owner>` assigned to the
// body's instance and lifecycle until expiresAt, and records `assigned`. A repeat of the
// assignment in force returns it unchanged. about comes back with what the body was about.
//
// Refusals: bad-request (body; expiresAt past or beyond --max-assignment-ttl),
// permission-denied (no platform-admin; the instance is another owner's; the lifecycle has
// ended, with the ended text), failed-precondition (an assignment in force for another
// lifecycle: end it first; a delete marker), unavailable (stores).
func (s *Supervisor) Assign(ctx context.Context, caller manager.Caller, about audit.Request, data []byte) (*client.Assignment, audit.Request, error) {
	var req client.Assign
	if err := fault.Decode(data, &req); err != nil {
		return nil, about, err
	}
	about = aboutTarget(about, req.Kind, client.KindAssign, req.InstanceID)
	if err := checkTarget(req.V, req.Kind, client.KindAssign, req.Owner, req.InstanceID, req.LifecycleUID); err != nil {
		return nil, about, err
	}
	now := s.Now()
	switch {
	case req.ExpiresAt <= now.Unix():
		return nil, about, fault.Field("expiresAt", "want a time in the future (seconds since the epoch)")
	case time.Unix(req.ExpiresAt, 0).After(now.Add(s.MaxTTL)):
		return nil, about, fault.Field("expiresAt", "want at most --max-assignment-ttl (%s) from now", s.MaxTTL)
	}
	if err := s.requirePlatformAdmin(ctx, caller); err != nil {
		return nil, about, err
	}
	// The instance's gate: a retired gate is an ended lifecycle, never re-opened.
	g, err := issue.GateOf(s.Gates, subjects.GateEndpointManager, req.InstanceID).Observe(ctx)
	if err != nil {
		return nil, about, fault.Store(err, "reading the gate of instance %s", req.InstanceID)
	}
	if !g.Absent() {
		if g.Row.Principal != subjects.Principal(req.Owner, subjects.ServeActor(req.InstanceID)) {
			return nil, about, fault.New(fault.PermissionDenied, "instance %s is registered to another owner", req.InstanceID)
		}
		if g.Row.State == issue.GateRetired {
			return nil, about, endedRefusal(req.Owner, nil)
		}
	}
	want := Assignment{Assignment: client.Assignment{V: 1, Kind: kindAssignment, Owner: req.Owner, Space: s.Space,
		AccountPublicKey: s.Account, InstanceID: req.InstanceID, LifecycleUID: req.LifecycleUID, State: StateAssigned,
		ExpiresAt: req.ExpiresAt, Scope: []string{manager.Supervise}, AssignedBy: caller.String()}}
	o, err := s.assignmentOf(req.Owner).Update(ctx, func(cur *observedAssignment) (Assignment, error) {
		a := cur.Row
		switch {
		case cur.Absent():
			return want, nil
		case a.over() && (a.InstanceID == want.InstanceID || a.LifecycleUID == want.LifecycleUID):
			return Assignment{}, endedRefusal(req.Owner, nil)
		case a.State == StateEnding:
			// A new lifecycle never buries an unfinished end: its keys might never be revoked.
			return Assignment{}, fault.New(fault.FailedPrecondition, "owner %s's assignment of instance %s (lifecycle %s) is still ending; repeat supervisor-end for it to complete the end first", req.Owner, a.InstanceID, a.LifecycleUID)
		case a.State == StateEnded:
			return want, nil // the ended lifecycle stays ended; this is a new one
		case a.InstanceID == want.InstanceID && a.LifecycleUID == want.LifecycleUID && a.ExpiresAt == want.ExpiresAt:
			return Assignment{}, fence.ErrKeep // a repeat of the assignment in force
		}
		return Assignment{}, fault.New(fault.FailedPrecondition, "owner %s has a platform supervisor assignment in force for another lifecycle or end; end it first (an assignment never changes)", req.Owner)
	})
	if err != nil {
		return nil, about, fault.Store(err, "writing the platform supervisor assignment of owner %s", req.Owner)
	}
	s.Audit.Assigned(ctx, about, auditOf(o))
	return record(o), about, nil
}

// Vouch is what a supervised instance's own renewal stands on (docs/PROTOCOL.md, "manager-authority"): owner's assignment,
// read now, is still assigned to instance iid and lifecycle uid, and has not passed its end;
// and the lifecycle's recorded generations still resolve (an end retired them, whatever the
// assignment row says now).
func (s *Supervisor) Vouch(ctx context.Context, owner, iid, uid string) error {
	o, err := s.readAssignment(ctx, owner)
	if err != nil {
		return err
	}
	a := o.Row
	switch {
	case a.InstanceID != iid || a.LifecycleUID != uid:
		return fault.New(fault.PermissionDenied, "the platform supervisor assignment of owner %s is not for instance %s and this lifecycle", owner, iid)
	case a.over():
		return endedRefusal(owner, nil)
	case a.ExpiresAt <= s.Now().Unix():
		return lapsed(owner)
	}
	return s.resolveGenerations(ctx, lifecycleOf(a))
}

// exactlySupervise reports whether scope is exactly ["supervise"].
func exactlySupervise(scope []string) bool { return slices.Equal(scope, []string{manager.Supervise}) }

// aboutTarget is about with what a supervisor body names, as far as it passed its grammar.
func aboutTarget(about audit.Request, kind, wantKind, iid string) audit.Request {
	if kind == wantKind {
		about.Kind = kind
	}
	if subjects.ValidUID(iid) {
		about.InstanceID = iid
	}
	return about
}

// checkTarget refuses a supervisor body (assign, end) whose version, kind, owner, instance or
// lifecycle is off its grammar, naming the field.
func checkTarget(v int, kind, wantKind, owner, iid, uid string) error {
	switch {
	case v != 1:
		return fault.Field("v", "want 1")
	case kind != wantKind:
		return fault.Field("kind", "want %q", wantKind)
	case !subjects.ValidUserOwner(owner):
		return fault.Field("owner", "want u_ followed by 26 base32-lower characters")
	case !subjects.ValidUID(iid):
		return fault.Field("instanceId", "want [a-z0-9]{26,32}")
	case !subjects.ValidUID(uid):
		return fault.Field("lifecycleUid", "want [a-z0-9]{26,32}")
	}
	return nil
}
