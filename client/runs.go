package client

import "encoding/json"

// Kinds of the run requests on manager-authority (docs/PROTOCOL.md, the run kinds and "run-revoke"); a revoke also has its own
// endpoint, run-revoke.
const (
	KindRunAdmission = "manager-run-admission"
	KindRunAttempt   = "manager-run-attempt"
	KindRunStatus    = "manager-run-status"
	KindRunRevoke    = "manager-run-revoke"
)

// Run states a driver reports. Completed and failed are terminal.
const (
	RunRunning   = "running"
	RunReleased  = "released"
	RunCompleted = "completed"
	RunFailed    = "failed"
)

// RunAdmission asks the plane to admit a run a caller started: the envelope (with the current
// proof, account and epoch) and `run{runId, subject}`, the run-start subject the caller
// published.
type RunAdmission struct {
	Envelope
	Run RunStart `json:"run"`
}

// RunStart names a run and the run-start that started it.
type RunStart struct {
	RunID   string `json:"runId"`
	Subject string `json:"subject"`
}

// Admission is an admitted run, as stored (`admission.v1.manager.<runId>`).
type Admission struct {
	Version    int            `json:"version"`
	Space      string         `json:"space"`
	Endpoint   string         `json:"endpoint"`
	RunID      string         `json:"runId"`
	InstanceID string         `json:"instanceId"`
	Caller     AdmittedCaller `json:"caller"`
	Subject    string         `json:"subject"`
	AdmittedAt int64          `json:"admittedAt"` // milliseconds
}

// AdmittedCaller is who started an admitted run, from its run-start subject.
type AdmittedCaller struct {
	Owner      string `json:"owner"`
	Actor      string `json:"actor"`
	UID        string `json:"uid"`
	Generation string `json:"generation"`
}

// AdmissionReply answers an admission: the record, new or the identical earlier one.
type AdmissionReply struct {
	V         int       `json:"v"`
	Kind      string    `json:"kind"`
	RequestID string    `json:"requestId"`
	RunID     string    `json:"runId"`
	Revision  uint64    `json:"revision"`
	Admission Admission `json:"admission"`
}

// RunAttempt asks for a run's driver and mediator credentials for one takeover: the envelope
// and `attempt`.
type RunAttempt struct {
	Envelope
	Attempt Attempt `json:"attempt"`
}

// Attempt is one takeover of a run: its epoch and fencing token must each be the run fence's
// plus one (1 and 1 for a new run), and the driver and mediator keys are the manager's own.
type Attempt struct {
	RunID        string `json:"runId"`
	TakeoverID   string `json:"takeoverId"`
	Epoch        uint64 `json:"epoch"`
	FencingToken uint64 `json:"fencingToken"`
	DriverID     string `json:"driverId"`
	MediatorID   string `json:"mediatorId"`
}

// RunMaterial answers an attempt or a renewRunDriver: the run's driver and mediator credentials,
// the hold on the run fence they were committed under, and that commit's revision.
type RunMaterial struct {
	V           int                   `json:"v"`
	Kind        string                `json:"kind"`
	Operation   string                `json:"operation,omitempty"`
	Owner       string                `json:"owner"`
	Actor       string                `json:"actor"`
	RequestID   string                `json:"requestId"`
	InstanceID  string                `json:"instanceId"`
	RunID       string                `json:"runId"`
	Credentials map[string]Credential `json:"credentials"`
	IssuedAt    int64                 `json:"issuedAt"`  // milliseconds
	ExpiresAt   int64                 `json:"expiresAt"` // milliseconds
	Hold        RunHold               `json:"hold"`
	// GateRevision and RunFenceRevision are the instance gate's and the run fence's revisions
	// at the mint's commit (it commits on the gate first, then the run fence).
	GateRevision     uint64 `json:"gateRevision"`
	RunFenceRevision uint64 `json:"runFenceRevision"`
}

// RunFence is what a `conflict` refusal of an attempt carries in its details: the run fence
// as it is, so a manager taking over learns what to send plus one.
type RunFence struct {
	Epoch        uint64 `json:"epoch"`
	FencingToken uint64 `json:"fencingToken"`
	Holder       string `json:"holder"`
}

// RunStatus is a driver's report of its run, sent as the run's own principal with the hold it
// was given.
type RunStatus struct {
	V                    int    `json:"v"`
	Kind                 string `json:"kind"`
	Space                string `json:"space"`
	RunID                string `json:"runId"`
	State                string `json:"state"`
	Holder               string `json:"holder"`
	Epoch                uint64 `json:"epoch"`
	FencingToken         uint64 `json:"fencingToken"`
	ObservedSpecRevision uint64 `json:"observedSpecRevision"`
	JournalHigh          uint64 `json:"journalHigh"`
}

// RunStatusRecord is a run's status as stored (`run.manager.<runId>.status`).
type RunStatusRecord struct {
	V                    int    `json:"v"`
	ObservedSpecRevision uint64 `json:"observedSpecRevision"`
	State                string `json:"state"`
	Holder               string `json:"holder"`
	Epoch                uint64 `json:"epoch"`
	FencingToken         uint64 `json:"fencingToken"`
	JournalHigh          uint64 `json:"journalHigh"`
	At                   int64  `json:"at"` // milliseconds
}

// StatusReply answers a status report with the status as written.
type StatusReply struct {
	V        int             `json:"v"`
	Kind     string          `json:"kind"`
	RunID    string          `json:"runId"`
	Status   RunStatusRecord `json:"status"`
	Revision uint64          `json:"revision"`
}

// RunRevoke revokes a run for good: the envelope (with the manager's current proof) and
// `revoke{runId, reason}`.
type RunRevoke struct {
	Envelope
	Revoke Revoke `json:"revoke"`
}

// Revoke names the run to revoke and why.
type Revoke struct {
	RunID  string `json:"runId"`
	Reason string `json:"reason"`
}

// Revocation is a run's revocation marker (`revoked.v1.manager.<runId>`): the first one
// written wins.
type Revocation struct {
	Version   int    `json:"version"`
	RunID     string `json:"runId"`
	Reason    string `json:"reason"`
	By        string `json:"by"`
	RevokedAt int64  `json:"revokedAt"` // milliseconds
}

// RevokeReply answers a revoke with the marker that won, byte for byte as stored: a repeat, or
// a revoke that lost a race, gets the first one.
type RevokeReply struct {
	V          int             `json:"v"`
	Kind       string          `json:"kind"`
	RequestID  string          `json:"requestId"`
	RunID      string          `json:"runId"`
	Revocation json.RawMessage `json:"revocation"`
	// RunFenceRevision is the revision at which the run fence says revoked.
	RunFenceRevision uint64 `json:"runFenceRevision"`
}
