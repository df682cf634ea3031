package client

import "github.com/cotal-ai/authplane/subjects"

// KindServiceAuthority is the `kind` of a manager-service-authority request (docs/PROTOCOL.md, "manager-service-authority").
const KindServiceAuthority = "manager-service-authority"

// Operations of manager-service-authority.
const (
	OpPrepare             = "prepare"
	OpActivate            = "activate"
	OpRenew               = "renew"
	OpRenewStandingBundle = "renewStandingBundle"
	OpRenewRunDriver      = "renewRunDriver"
)

// Identity is one duty's public nkey.
type Identity struct {
	ID string `json:"id"`
}

// Identities are the five duty nkeys a manager generated; only public keys cross the wire.
type Identities struct {
	Supervisor    Identity `json:"supervisor"`
	Executor      Identity `json:"executor"`
	Serve         Identity `json:"serve"`
	GoalWriter    Identity `json:"goalWriter"`
	SessionLedger Identity `json:"sessionLedger"`
}

// Of returns the nkey of duty d ("" for a duty that is not a standing one).
func (ids Identities) Of(d subjects.Duty) string {
	switch d {
	case subjects.DutySupervisor:
		return ids.Supervisor.ID
	case subjects.DutyExecutor:
		return ids.Executor.ID
	case subjects.DutyServe:
		return ids.Serve.ID
	case subjects.DutyGoalWriter:
		return ids.GoalWriter.ID
	case subjects.DutySessionLedger:
		return ids.SessionLedger.ID
	}
	return ""
}

// Envelope is what every manager-authority request about one manager instance carries
// (docs/PROTOCOL.md, "manager-service-authority"): who sends it, for which instance and lifecycle, and with which duty keys; and, past
// prepare, the proof, account and epoch the manager was given. Pointer fields are the ones a
// request may leave out.
type Envelope struct {
	V                   int         `json:"v"`
	Kind                string      `json:"kind"`
	Space               string      `json:"space"`
	Actor               string      `json:"actor"`
	InstanceID          string      `json:"instanceId"`
	ManagerLifecycleUID string      `json:"managerLifecycleUid"`
	RequestID           string      `json:"requestId"`
	Identities          *Identities `json:"identities"`
	RegistrationProof   *string     `json:"registrationProof,omitempty"`
	AccountPublicKey    *string     `json:"accountPublicKey,omitempty"`
	ProcessEpoch        *uint64     `json:"processEpoch,omitempty"`
}

// ServiceAuthority is the body of a manager-service-authority request: the envelope and the
// keys of its operation.
type ServiceAuthority struct {
	Envelope
	Operation string `json:"operation"`
	// Run is renewRunDriver's: the run fence the manager holds.
	Run *RunHold `json:"run,omitempty"`
}

// RunHold is a manager's hold on a run: what its attempt set the run fence to.
type RunHold struct {
	RunID        string `json:"runId"`
	Holder       string `json:"holder"`
	TakeoverID   string `json:"takeoverId"`
	Epoch        uint64 `json:"epoch"`
	FencingToken uint64 `json:"fencingToken"`
	DriverID     string `json:"driverId"`
	MediatorID   string `json:"mediatorId"`
}

// Material is the reply to a manager-service-authority request: a credential per duty minted,
// and what the manager sends back on its next request.
type Material struct {
	V           int                   `json:"v"`
	Kind        string                `json:"kind"`
	Operation   string                `json:"operation"`
	Owner       string                `json:"owner"`
	Actors      map[string]string     `json:"actors"`
	Credentials map[string]Credential `json:"credentials"`
	// IssuedAt and ExpiresAt are in milliseconds; ExpiresAt is the earliest credential expiry.
	IssuedAt  int64 `json:"issuedAt"`
	ExpiresAt int64 `json:"expiresAt"`
	// RegistrationProof is prepare's (activate needs it); NextRegistrationProof is activate's
	// (renewals need it).
	RegistrationProof     string `json:"registrationProof,omitempty"`
	NextRegistrationProof string `json:"nextRegistrationProof,omitempty"`
	RequestID             string `json:"requestId"`
	InstanceID            string `json:"instanceId"`
	ManagerLifecycleUID   string `json:"managerLifecycleUid"`
	AccountPublicKey      string `json:"accountPublicKey"`
	ProcessEpoch          uint64 `json:"processEpoch"`
	// GateRevision is the revision the instance's gate was at when these credentials committed
	// on it (for prepare, the registration's own write): a credential is valid only if that
	// commit landed, so every fence write that forbids it has a later revision.
	GateRevision uint64 `json:"gateRevision"`
}

// Credential is one minted user JWT and its expiry (seconds).
type Credential struct {
	JWT string `json:"jwt"`
	Exp int64  `json:"exp"`
}

// Renewal is what renewals carry: the current proof, the data account and the process epoch.
type Renewal struct {
	Proof   string
	Account string
	Epoch   uint64
}

// Renewal returns what renewals of the registration an activate reply m answers must carry.
func (m *Material) Renewal() Renewal {
	return Renewal{Proof: m.NextRegistrationProof, Account: m.AccountPublicKey, Epoch: m.ProcessEpoch}
}

// ErrorBody is the JSON body of a refusal.
type ErrorBody struct {
	Error WireError `json:"error"`
}

// WireError is a refusal on the wire: a code of docs/PROTOCOL.md ("Replies and refusals"), a message, and details some
// refusals carry (a run conflict carries the current run fence).
type WireError struct {
	Code    string `json:"code"`
	Message string `json:"message"`
	Details any    `json:"details,omitempty"`
}
