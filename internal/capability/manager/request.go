package manager

import (
	"encoding/json"

	"github.com/cotal-ai/authplane/client"
	"github.com/cotal-ai/authplane/internal/core/audit"
	"github.com/cotal-ai/authplane/internal/core/fault"
	"github.com/cotal-ai/authplane/subjects"
)

// Kind is the `kind` of a manager-service-authority request.
const Kind = client.KindServiceAuthority

// Operations.
const (
	OpPrepare             = client.OpPrepare
	OpActivate            = client.OpActivate
	OpRenew               = client.OpRenew
	OpRenewStandingBundle = client.OpRenewStandingBundle
	OpRenewRunDriver      = client.OpRenewRunDriver
)

// Request is a manager-service-authority request as the plane parses it: the wire body, and
// the keys of the original this plane recognises but does not implement.
type Request struct {
	client.ServiceAuthority

	// The original's other keys: recognised, and answered `unimplemented`.
	Session           json.RawMessage `json:"session"`
	Retirement        json.RawMessage `json:"retirement"`
	ContractArtifacts json.RawMessage `json:"contractArtifacts"`
	TransferReader    json.RawMessage `json:"transferReader"`
}

// Parse decodes a closed manager-service-authority body and checks every grammar. Every refusal
// is bad-request naming the field, except an operation or key this plane does not implement
// (unimplemented).
func Parse(data []byte) (*Request, error) {
	var r Request
	if err := fault.Decode(data, &r); err != nil {
		return nil, err
	}
	if err := r.check(); err != nil {
		return &r, err
	}
	return &r, nil
}

var knownOperations = map[string]bool{
	OpPrepare: true, OpActivate: true, OpRenew: true, OpRenewStandingBundle: true, OpRenewRunDriver: true,
	"session": true, "retire": true, "transferReader": true,
}

func (r *Request) check() error {
	if err := checkHead(&r.Envelope, Kind); err != nil {
		return err
	}
	switch r.Operation {
	case OpPrepare, OpActivate, OpRenew, OpRenewStandingBundle, OpRenewRunDriver:
	case "session", "retire", "transferReader":
		return fault.New(fault.Unimplemented, "operation %s is not implemented by this plane", r.Operation)
	case "":
		return fault.Field("operation", "missing")
	default:
		return fault.Field("operation", "want prepare, activate, renew, renewStandingBundle or renewRunDriver")
	}
	for name, raw := range map[string]json.RawMessage{"session": r.Session, "retirement": r.Retirement, "contractArtifacts": r.ContractArtifacts, "transferReader": r.TransferReader} {
		if raw != nil {
			return fault.New(fault.Unimplemented, "key %s is not implemented by this plane", name)
		}
	}
	if err := checkIdentities(&r.Envelope); err != nil {
		return err
	}
	switch r.Operation {
	case OpPrepare:
		if r.RegistrationProof != nil {
			return fault.Field("registrationProof", "prepare carries no proof")
		}
	case OpActivate:
		if r.RegistrationProof == nil {
			return fault.Field("registrationProof", "missing")
		}
		if !subjects.ValidProof(*r.RegistrationProof) {
			return fault.Field("registrationProof", "want sha256: followed by 64 lowercase hex")
		}
	default:
		if err := checkCurrent(&r.Envelope); err != nil {
			return err
		}
	}
	if first := r.Operation == OpPrepare || r.Operation == OpActivate; first && r.AccountPublicKey != nil {
		return fault.Field("accountPublicKey", "only renewals carry it")
	} else if first && r.ProcessEpoch != nil {
		return fault.Field("processEpoch", "only renewals carry it")
	}
	switch {
	case r.Operation == OpRenewRunDriver && r.Run == nil:
		return fault.Field("run", "missing")
	case r.Operation != OpRenewRunDriver && r.Run != nil:
		return fault.Field("run", "only renewRunDriver carries run")
	case r.Run != nil:
		return checkHold(r.Run, &r.Envelope)
	}
	return nil
}

// checkHead checks what every envelope starts with: its version, its kind, and the grammar of
// its space, actor, instance, lifecycle and request id.
func checkHead(e *client.Envelope, kind string) error {
	if e.V != 1 {
		return fault.Field("v", "want 1")
	}
	if e.Kind != kind {
		return fault.Field("kind", "want %q", kind)
	}
	grammar := []struct {
		field string
		ok    bool
		want  string
	}{
		{"space", subjects.ValidSpace(e.Space), "[a-z0-9][a-z0-9_-]{0,31}"},
		{"actor", subjects.ValidActor(e.Actor), "[A-Za-z0-9_]{1,64}"},
		{"instanceId", subjects.ValidUID(e.InstanceID), "[a-z0-9]{26,32}"},
		{"managerLifecycleUid", subjects.ValidUID(e.ManagerLifecycleUID), "[a-z0-9]{26,32}"},
		{"requestId", subjects.ValidRequestID(e.RequestID), "[A-Za-z0-9_-]{22,64}"},
	}
	for _, g := range grammar {
		if !g.ok {
			return fault.Field(g.field, "want %s", g.want)
		}
	}
	return nil
}

// checkIdentities checks the envelope's five duty nkeys: present, canonical, distinct.
func checkIdentities(e *client.Envelope) error {
	if e.Identities == nil {
		return fault.Field("identities", "missing")
	}
	seen := map[string]string{}
	for _, d := range subjects.StandingDuties {
		id := e.Identities.Of(d)
		if !subjects.ValidUserNKey(id) {
			return fault.Field("identities."+string(d)+".id", "want a public user nkey (U followed by 55 base32 characters)")
		}
		if other, dup := seen[id]; dup {
			return fault.Field("identities."+string(d)+".id", "the same nkey as identities.%s: one nkey cannot collapse separate authority lifetimes", other)
		}
		seen[id] = string(d)
	}
	return nil
}

// checkCurrent checks what every request past activate carries: the current proof, the data
// account and the process epoch the manager was given.
func checkCurrent(e *client.Envelope) error {
	switch {
	case e.RegistrationProof == nil:
		return fault.Field("registrationProof", "missing")
	case !subjects.ValidProof(*e.RegistrationProof):
		return fault.Field("registrationProof", "want sha256: followed by 64 lowercase hex")
	case e.AccountPublicKey == nil:
		return fault.Field("accountPublicKey", "missing")
	case !subjects.ValidAccountNKey(*e.AccountPublicKey):
		return fault.Field("accountPublicKey", "want a public account nkey")
	case e.ProcessEpoch == nil:
		return fault.Field("processEpoch", "missing")
	}
	return nil
}

// checkRunKeys checks a run's driver and mediator keys: canonical, distinct from each other
// and from the manager's five.
func checkRunKeys(field string, driver, mediator string, e *client.Envelope) error {
	for _, k := range []struct{ name, id string }{{"driverId", driver}, {"mediatorId", mediator}} {
		if !subjects.ValidUserNKey(k.id) {
			return fault.Field(field+"."+k.name, "want a public user nkey (U followed by 55 base32 characters)")
		}
		for _, d := range subjects.StandingDuties {
			if e.Identities.Of(d) == k.id {
				return fault.Field(field+"."+k.name, "the same nkey as identities.%s: one nkey cannot collapse separate authority lifetimes", d)
			}
		}
	}
	if driver == mediator {
		return fault.Field(field+".mediatorId", "the same nkey as the driver: one nkey cannot collapse separate authority lifetimes")
	}
	return nil
}

// checkTakeover checks what a takeover names under field (run or attempt): the run, a takeover
// id, an epoch and fencing token of 1 or more, and the driver and mediator keys.
func checkTakeover(field, runID, takeoverID string, epoch, token uint64, driver, mediator string, e *client.Envelope) error {
	switch {
	case !subjects.ValidRunID(runID):
		return fault.Field(field+".runId", "want run- followed by 32 lowercase hex")
	case !subjects.ValidTakeoverID(takeoverID):
		return fault.Field(field+".takeoverId", "want 16 lowercase hex")
	case epoch < 1:
		return fault.Field(field+".epoch", "want 1 or more")
	case token < 1:
		return fault.Field(field+".fencingToken", "want 1 or more")
	}
	return checkRunKeys(field, driver, mediator, e)
}

// checkHold checks renewRunDriver's `run`: the hold an attempt gave, whose holder is the
// supervisor's nkey and the takeover id.
func checkHold(h *client.RunHold, e *client.Envelope) error {
	if err := checkTakeover("run", h.RunID, h.TakeoverID, h.Epoch, h.FencingToken, h.DriverID, h.MediatorID, e); err != nil {
		return err
	}
	if h.Holder != e.Identities.Supervisor.ID+"."+h.TakeoverID {
		return fault.Field("run.holder", "want the supervisor's nkey and the takeover id: <supervisor>.<takeoverId>")
	}
	return nil
}

// describe fills about with what e says of itself, only what passed its grammar: a refused
// body's fields may be anything a caller chose.
func describe(about audit.Request, e *client.Envelope) audit.Request {
	about.InstanceID = keepIf(e.InstanceID, subjects.ValidUID(e.InstanceID))
	about.RequestID = keepIf(e.RequestID, subjects.ValidRequestID(e.RequestID))
	return about
}

func keepIf(s string, ok bool) string {
	if ok {
		return s
	}
	return ""
}
