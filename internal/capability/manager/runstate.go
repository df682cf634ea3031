package manager

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/cotal-ai/authplane/client"
	"github.com/cotal-ai/authplane/internal/core/fault"
	"github.com/cotal-ai/authplane/internal/core/fence"
	"github.com/cotal-ai/authplane/internal/core/issue"
	"github.com/cotal-ai/authplane/internal/core/store"
	"github.com/cotal-ai/authplane/subjects"
)

// What the plane keeps of a run (docs/PROTOCOL.md, the run kinds and "run-revoke"): its admission and revocation marker
// (create-only, in the admission bucket), its run fence (the plane's, in the fence bucket) and
// its status (in the run-status bucket).

// Witness is the run-starts captured, each in its owner's witness stream for five minutes.
// Witnessed says whether one was published on a subject; OpenWitness makes sure an owner's
// run-starts are captured from now on (its failure leaves them unwitnessed, so refused at
// admission, and is tried again at the next call).
type Witness interface {
	Witnessed(ctx context.Context, subject string) (bool, error)
	OpenWitness(ctx context.Context, owner string)
}

// runFence is `runfence.manager.<runId>`: who holds the run. Created at the first attempt,
// advanced by CAS at each takeover, set revoked by a revocation; every write stamps a fresh
// nonce, so a run mint commits on it only if nothing moved it since it was read. No minted
// credential can write it.
type runFence struct {
	V            int    `json:"v"`
	RunID        string `json:"runId"`
	InstanceID   string `json:"instanceId"`
	Holder       string `json:"holder"`
	TakeoverID   string `json:"takeoverId"`
	Epoch        uint64 `json:"epoch"`
	FencingToken uint64 `json:"fencingToken"`
	DriverID     string `json:"driverId"`
	MediatorID   string `json:"mediatorId"`
	Revoked      bool   `json:"revoked"`
	Nonce        string `json:"nonce"`
}

// maxRunRow bounds a stored run fence, admission or status row (a run-start subject in an
// admission is at most maxSubject bytes).
const maxRunRow = 4 << 10

// admission is `admission.v1.manager.<runId>`: the run a caller really started, admitted for
// one instance, create-only. This is the stored schema; the reply (client.Admission) is made
// from it and may change on its own.
type admission struct {
	Version    int            `json:"version"`
	Space      string         `json:"space"`
	Endpoint   string         `json:"endpoint"`
	RunID      string         `json:"runId"`
	InstanceID string         `json:"instanceId"`
	Caller     admittedCaller `json:"caller"`
	Subject    string         `json:"subject"`
	AdmittedAt int64          `json:"admittedAt"` // milliseconds
}

// admittedCaller is who started an admitted run, from its run-start subject.
type admittedCaller struct {
	Owner      string `json:"owner"`
	Actor      string `json:"actor"`
	UID        string `json:"uid"`
	Generation string `json:"generation"`
}

// reply is the admission as a reply carries it.
func (a *admission) reply() client.Admission {
	return client.Admission{Version: a.Version, Space: a.Space, Endpoint: a.Endpoint, RunID: a.RunID, InstanceID: a.InstanceID,
		Caller:  client.AdmittedCaller{Owner: a.Caller.Owner, Actor: a.Caller.Actor, UID: a.Caller.UID, Generation: a.Caller.Generation},
		Subject: a.Subject, AdmittedAt: a.AdmittedAt}
}

// parseAdmission decodes and checks a stored admission of runID.
func parseAdmission(data []byte, runID string) (*admission, error) {
	var a admission
	if err := fault.DecodeRow(data, &a, maxRunRow); err != nil {
		return nil, err
	}
	if a.Version != 1 || a.RunID != runID {
		return nil, errors.New("not a version 1 admission of this run")
	}
	return &a, nil
}

// status is `run.manager.<runId>.status` in the run-status bucket: what the run's current
// driver last reported (the stored schema; the reply's client.RunStatusRecord is made from it).
type status struct {
	V                    int    `json:"v"`
	ObservedSpecRevision uint64 `json:"observedSpecRevision"`
	State                string `json:"state"`
	Holder               string `json:"holder"`
	Epoch                uint64 `json:"epoch"`
	FencingToken         uint64 `json:"fencingToken"`
	JournalHigh          uint64 `json:"journalHigh"`
	At                   int64  `json:"at"` // milliseconds
}

// reply is the status as a reply carries it.
func (s status) reply() client.RunStatusRecord {
	return client.RunStatusRecord{V: s.V, ObservedSpecRevision: s.ObservedSpecRevision, State: s.State, Holder: s.Holder,
		Epoch: s.Epoch, FencingToken: s.FencingToken, JournalHigh: s.JournalHigh, At: s.At}
}

// hold is what the fence says of who holds the run.
func (f runFence) hold() client.RunHold {
	return client.RunHold{RunID: f.RunID, Holder: f.Holder, TakeoverID: f.TakeoverID, Epoch: f.Epoch,
		FencingToken: f.FencingToken, DriverID: f.DriverID, MediatorID: f.MediatorID}
}

func (e *Engine) runFenceOf(runID string) *fence.Fence[runFence] {
	return fence.New(e.Gates, subjects.RunFenceKey(runID), func(data []byte) (runFence, error) {
		var f runFence
		if err := fault.DecodeRow(data, &f, maxRunRow); err != nil {
			return runFence{}, err
		}
		if f.V != 1 || f.RunID != runID || f.Nonce == "" {
			return runFence{}, errors.New("not a version 1 run fence of this run")
		}
		return f, nil
	}, func(f *runFence) { f.Nonce = subjects.NewNonce() })
}

// observeRunFence reads a run's fence.
func (e *Engine) observeRunFence(ctx context.Context, runID string) (*fence.Observed[runFence], error) {
	o, err := e.runFenceOf(runID).Observe(ctx)
	if err != nil {
		return nil, fault.Store(err, "reading the run fence of %s", runID)
	}
	return o, nil
}

// revokedText is the refusal of anything for a revoked run.
func revoked(runID string) *fault.Error {
	return fault.New(fault.PermissionDenied, "run %s was revoked; it gets no admission, attempt or renewal", runID)
}

// runFenceStep is the commit step of a run mint on the run fence observed before signing: a
// rewrite as read (next nil) or a takeover (next set). A fence that moved because the run was
// revoked refuses permission-denied.
func (e *Engine) runFenceStep(o *fence.Observed[runFence], next *runFence) issue.Step {
	runID := o.Row.RunID
	if o.Absent() && next != nil {
		runID = next.RunID
	}
	return issue.Step{Fence: subjects.RunFenceKey(runID), Commit: func(ctx context.Context) (uint64, error) {
		var done *fence.Observed[runFence]
		var err error
		if next != nil {
			done, err = o.Write(ctx, *next)
		} else {
			done, err = o.Commit(ctx)
		}
		if errors.Is(err, fence.ErrMoved) {
			if now, rerr := e.runFenceOf(runID).Observe(ctx); rerr == nil && now.Row.Revoked {
				return 0, revoked(runID)
			}
		}
		if err != nil {
			return 0, err
		}
		return done.Revision, nil
	}}
}

// readAdmission reads a run's admission: nil when there is none.
func (e *Engine) readAdmission(ctx context.Context, runID string) (*admission, uint64, error) {
	entry, err := e.Admissions.Get(ctx, subjects.AdmissionKey(runID))
	switch {
	case errors.Is(err, store.ErrNotFound):
		return nil, 0, nil
	case err != nil:
		return nil, 0, fault.Store(err, "reading the admission of run %s", runID)
	}
	a, err := parseAdmission(entry.Value, runID)
	if err != nil {
		return nil, 0, fault.Wrap(fault.Internal, err, "the admission of run %s is malformed", runID)
	}
	return a, entry.Revision, nil
}

// admittedHere reads a run's admission and refuses one that is missing or another instance's.
func (e *Engine) admittedHere(ctx context.Context, runID, iid string) (*admission, error) {
	a, _, err := e.readAdmission(ctx, runID)
	switch {
	case err != nil:
		return nil, err
	case a == nil:
		return nil, fault.New(fault.PermissionDenied, "run %s has no admission record", runID)
	case a.InstanceID != iid || a.Space != e.Space:
		return nil, fault.New(fault.PermissionDenied, "run %s was admitted for another manager instance", runID)
	}
	return a, nil
}

// readRevocation reads a run's revocation marker as stored: nil when there is none.
func (e *Engine) readRevocation(ctx context.Context, runID string) ([]byte, error) {
	entry, err := e.Admissions.Get(ctx, subjects.RevokedKey(runID))
	switch {
	case errors.Is(err, store.ErrNotFound):
		return nil, nil
	case err != nil:
		return nil, fault.Store(err, "reading the revocation of run %s", runID)
	}
	return entry.Value, nil
}

// refuseRevoked refuses a run that carries a revocation marker.
func (e *Engine) refuseRevoked(ctx context.Context, runID string) error {
	marker, err := e.readRevocation(ctx, runID)
	if err != nil {
		return err
	}
	if marker != nil {
		return revoked(runID)
	}
	return nil
}

// runStatusOf is the fence of a run's status row.
func (e *Engine) runStatusOf(runID string) *fence.Fence[status] {
	return fence.New(e.Statuses, subjects.RunStatusKey(runID), func(data []byte) (status, error) {
		var s status
		if err := fault.DecodeRow(data, &s, maxRunRow); err != nil {
			return status{}, err
		}
		if s.V != 1 || !validState(s.State) {
			return status{}, fmt.Errorf("not a version 1 status (state %q)", s.State)
		}
		return s, nil
	}, nil)
}

// readStatus reads a run's status (an absent observation when none was reported).
func (e *Engine) readStatus(ctx context.Context, runID string) (*fence.Observed[status], error) {
	o, err := e.runStatusOf(runID).Observe(ctx)
	if err != nil {
		return nil, fault.Store(err, "reading the status of run %s", runID)
	}
	return o, nil
}

func validState(s string) bool {
	return s == client.RunRunning || s == client.RunReleased || s == client.RunCompleted || s == client.RunFailed
}

func terminal(s string) bool { return s == client.RunCompleted || s == client.RunFailed }

// createOnce writes value at key of the admission bucket if it was never written, and returns
// what the key holds afterwards: value when it landed, or the first value written. A lost race
// is not an error: the first write wins; a write of unknown outcome is settled by the fence.
func (e *Engine) createOnce(ctx context.Context, key string, value []byte) ([]byte, uint64, error) {
	f := fence.New(e.Admissions, key, func(b []byte) (json.RawMessage, error) { return b, nil }, nil)
	o, err := f.Observe(ctx)
	if err == nil && o.Absent() {
		var landed *fence.Observed[json.RawMessage]
		if landed, err = o.Write(ctx, json.RawMessage(value)); err == nil {
			return landed.Raw, landed.Revision, nil
		}
		if errors.Is(err, fence.ErrMoved) { // another writer got there first: theirs stands
			o, err = f.Observe(ctx)
		}
	}
	if err != nil {
		return nil, 0, fault.Store(err, "writing %s", key)
	}
	return o.Raw, o.Revision, nil
}

// encode is the JSON of a stored record.
func encode(v any) []byte {
	data, err := json.Marshal(v)
	if err != nil {
		panic("manager: a record does not marshal: " + err.Error())
	}
	return data
}
