package manager

import (
	"context"
	"errors"
	"time"

	"github.com/cotal-ai/authplane/internal/fault"
	"github.com/cotal-ai/authplane/internal/gate"
	"github.com/cotal-ai/authplane/internal/mint"
	"github.com/cotal-ai/authplane/internal/records"
	"github.com/cotal-ai/authplane/subjects"
)

// issuance is one mint: which duties, for whom, committed on which gate.
type issuance struct {
	caller Caller
	req    *Request
	note   *records.Request
	// observed is the manager's gate as read (nil only for a first prepare).
	observed *gate.Gate
	// next, when set, is the row the commit writes (prepare's registration); otherwise the
	// commit rewrites observed exactly as read.
	next   *gate.Row
	duties []subjects.Duty
}

// issue runs the commit fence (DESIGN §6.2): sign → record `minted` → commit on the gate at
// the revision read → reply. A credential leaves only if its commit landed; if the gate moved
// (a fence writer got there first) the mint is audited `discarded` and refused `conflict`.
func (e *Engine) issue(ctx context.Context, is issuance) (*Material, error) {
	now := e.Now()
	owner, iid := is.caller.Owner, is.req.InstanceID
	row := is.next
	if row == nil {
		row = &is.observed.Row
	}
	// A supervised instance's every mint is clamped to its assignment's end, and refused
	// once that has passed.
	ceiling := row.SupervisedUntil
	if ceiling != 0 && ceiling <= now.Unix() {
		return nil, fault.New(fault.PermissionDenied, "instance %s was prepared under a platform supervisor assignment that ended at %s; it issues nothing",
			iid, time.Unix(ceiling, 0).UTC().Format(time.RFC3339))
	}

	m := &Material{
		V: 1, Kind: Kind, Operation: is.req.Operation, Owner: owner,
		Actors:      map[string]string{},
		Credentials: map[string]Credential{},
		IssuedAt:    now.UnixMilli(),
		RequestID:   is.req.RequestID, InstanceID: iid, ManagerLifecycleUID: is.req.ManagerLifecycleUID,
		AccountPublicKey: e.Account, ProcessEpoch: row.ProcessEpoch,
	}
	for _, d := range subjects.StandingDuties {
		m.Actors[string(d)] = subjects.DutyActor(d, iid, "")
	}
	minted := make([]records.Credential, 0, len(is.duties))
	earliest := int64(0)
	for _, d := range is.duties {
		actor, grant, err := subjects.Permissions(d, subjects.Holder{Space: e.Space, Owner: owner, Instance: iid})
		if err != nil {
			return nil, fault.Wrap(fault.Internal, err, "no grant for duty %s", d)
		}
		ttl := e.StandingTTL
		if d == subjects.DutyExecutor {
			ttl = min(ttl, ExecutorTTL)
		}
		exp := now.Add(ttl).Unix()
		if ceiling != 0 {
			exp = min(exp, ceiling)
		}
		key := is.req.Identities.Of(d)
		token, err := e.Issuer.Sign(mint.User{Name: subjects.Principal(owner, actor), Key: key, Grant: grant, Expires: time.Unix(exp, 0)})
		if err != nil {
			return nil, fault.Wrap(fault.Internal, err, "signing the %s credential failed", d)
		}
		m.Credentials[string(d)] = Credential{JWT: token, Exp: exp}
		minted = append(minted, records.Credential{Duty: string(d), NKey: key, Exp: exp})
		if earliest == 0 || exp < earliest {
			earliest = exp
		}
	}
	m.ExpiresAt = earliest * 1000

	m.minted = minted

	// Every nkey is on record before its commit, so an end can revoke all of them. If the
	// records cannot be written, nothing commits.
	if err := e.Records.RecordMinted(ctx, *is.note, minted); err != nil {
		return nil, e.discard(is, minted, errStore(err, "recording the mint"))
	}
	if e.BeforeCommit != nil {
		e.BeforeCommit()
	}
	if e.Fenced != nil && e.Fenced() {
		return nil, e.discard(is, minted, fault.New(fault.Unavailable, "this authority plane was fenced by a newer instance before the mint committed; retry shortly"))
	}
	var err error
	if is.next != nil {
		_, err = gate.Transition(ctx, e.Gates, subjects.GateKey(subjects.GateEndpointManager, iid), is.observed, *is.next)
	} else {
		err = gate.Commit(ctx, e.Gates, is.observed)
	}
	switch {
	case errors.Is(err, gate.ErrMoved):
		return nil, e.discard(is, minted, fault.Wrap(fault.Conflict, err,
			"the gate of instance %s moved before issuance (a re-registration or an end landed); nothing was issued", iid))
	case err != nil && fault.CodeOf(err) != fault.Internal:
		return nil, e.discard(is, minted, fault.As(err)) // e.g. the gate now holds a delete marker
	case err != nil:
		return nil, e.discard(is, minted, errStore(err, "committing the mint"))
	}
	e.Records.LogMinted(*is.note, minted)
	return m, nil
}

// discard records a signed mint that did not commit and returns refusal, marked recorded. No
// credential is sent: each is valid only if its commit landed.
func (e *Engine) discard(is issuance, minted []records.Credential, refusal *fault.Error) error {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	e.Records.Record(ctx, records.Decision{Decision: records.Discarded, Request: *is.note,
		Code: string(refusal.Code), Message: refusal.Message, Credentials: minted, Cause: refusal.Cause})
	refusal.Recorded = true
	return refusal
}
