package supervisor

import (
	"context"
	"encoding/json"
	"strings"
	"time"

	"github.com/cotal-ai/authplane/client"
	"github.com/cotal-ai/authplane/internal/capability/manager"
	"github.com/cotal-ai/authplane/internal/core/audit"
	"github.com/cotal-ai/authplane/internal/core/fault"
	"github.com/cotal-ai/authplane/internal/core/issue"
	"github.com/cotal-ai/authplane/subjects"
)

// authorityBody is a supervisor-authority request as the plane parses it; the inner request is
// a manager-service-authority request, parsed by the manager's closed parser.
type authorityBody struct {
	V                  int             `json:"v"`
	Kind               string          `json:"kind"`
	Owner              string          `json:"owner"`
	AssignmentRevision *uint64         `json:"assignmentRevision"`
	Request            json.RawMessage `json:"request"`
}

// supervisable are the operations a platform supervisor may ask for.
var supervisable = map[string]bool{
	manager.OpPrepare: true, manager.OpActivate: true, manager.OpRenew: true, manager.OpRenewStandingBundle: true,
}

// Authority serves supervisor-authority for caller, a platform admin acting on an owner's
// behalf. In order: the body; the checks of the original (its refusal order, kept): platform admin, the
// assignment names this owner, space and account, is not ended (the ended text), is assigned
// at the revision named, has not passed its end, grants exactly `supervise`, and covers the
// request's space, instance and lifecycle; the operation is one a supervisor may ask for, and
// the gate, if any, is the owner's; then the ended-assignment fence (a frozen or retired gate,
// and every recorded generation must resolve); then the operation through the manager engine,
// every expiry clamped to the assignment's end, its generations recorded between signing and
// the commit fence.
//
// Refusals: bad-request (body), permission-denied (each check above; an ended lifecycle with
// the ended text), failed-precondition (a different ceiling), conflict, already-exists,
// resource-exhausted, unavailable and internal as manager-authority's.
func (s *Supervisor) Authority(ctx context.Context, caller manager.Caller, about audit.Request, data []byte) (*client.Material, audit.Request, error) {
	var env authorityBody
	if err := fault.Decode(data, &env); err != nil {
		return nil, about, err
	}
	about = aboutTarget(about, env.Kind, client.KindSupervisorAuthority, "")
	switch {
	case env.V != 1:
		return nil, about, fault.Field("v", "want 1")
	case env.Kind != client.KindSupervisorAuthority:
		return nil, about, fault.Field("kind", "want %q", client.KindSupervisorAuthority)
	case !subjects.ValidUserOwner(env.Owner):
		return nil, about, fault.Field("owner", "want u_ followed by 26 base32-lower characters")
	case env.AssignmentRevision == nil || *env.AssignmentRevision == 0:
		return nil, about, fault.Field("assignmentRevision", "want the assignment's revision, at least 1")
	case env.Request == nil:
		return nil, about, fault.Field("request", "missing")
	}
	req, err := manager.Parse(env.Request)
	if req != nil { // only what passed its grammar reaches the records
		if supervisable[req.Operation] {
			about.Operation = req.Operation
		}
		if subjects.ValidUID(req.InstanceID) {
			about.InstanceID = req.InstanceID
		}
		if subjects.ValidRequestID(req.RequestID) {
			about.RequestID = req.RequestID
		}
	}
	if err != nil {
		return nil, about, fault.Within("request", err)
	}
	if req.Actor != "cli" {
		return nil, about, fault.Field("request.actor", `want "cli": a platform supervisor's request is the CLI's`)
	}

	if err := s.requirePlatformAdmin(ctx, caller); err != nil {
		return nil, about, err
	}
	o, err := s.readAssignment(ctx, env.Owner)
	if err != nil {
		return nil, about, err
	}
	a := o.Row
	switch {
	case a.over():
		return nil, about, endedRefusal(env.Owner, nil)
	case o.Revision != *env.AssignmentRevision:
		return nil, about, fault.New(fault.PermissionDenied, "assignmentRevision %d is not the revision of owner %s's assignment in force", *env.AssignmentRevision, env.Owner)
	case a.ExpiresAt <= s.Now().Unix():
		return nil, about, lapsed(env.Owner)
	case !exactlySupervise(a.Scope):
		return nil, about, fault.New(fault.PermissionDenied, "the platform supervisor assignment of owner %s does not grant exactly %q", env.Owner, "supervise")
	case req.Space != a.Space || req.InstanceID != a.InstanceID || req.ManagerLifecycleUID != a.LifecycleUID:
		return nil, about, fault.New(fault.PermissionDenied, "the request's space, instance and lifecycle are not those of owner %s's assignment", env.Owner)
	case !supervisable[req.Operation]:
		return nil, about, fault.New(fault.PermissionDenied, "a platform supervisor may not ask for operation %s", req.Operation)
	}
	l := lifecycleOf(a)
	if err := s.endedFence(ctx, l); err != nil {
		return nil, about, err
	}
	sup := &manager.Supervision{By: caller.String(), Until: time.Unix(a.ExpiresAt, 0), Hook: s.stage(l, a.ExpiresAt)}
	m, err := s.Engine.Supervised(ctx, a.Owner, sup, req, about)
	return m, about, err
}

// endedFence refuses a lifecycle that has ended whatever its assignment row says now: a gate
// that is frozen or retired (an end's first and fourth steps), or a recorded generation that no
// longer resolves (its third). A gate of another owner is refused as such.
func (s *Supervisor) endedFence(ctx context.Context, l lifecycle) error {
	g, err := issue.GateOf(s.Gates, subjects.GateEndpointManager, l.iid).Observe(ctx)
	if err != nil {
		return fault.Store(err, "reading the gate of instance %s", l.iid)
	}
	if !g.Absent() {
		if !strings.HasPrefix(g.Row.Principal, l.owner+".") {
			return fault.New(fault.PermissionDenied, "instance %s is registered to another owner", l.iid)
		}
		if g.Row.State != issue.GateOpen {
			return endedRefusal(l.owner, nil)
		}
	}
	return s.resolveGenerations(ctx, l)
}
