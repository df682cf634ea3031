package manager

import (
	"encoding/json"

	"github.com/cotal-ai/authplane/client"
	"github.com/cotal-ai/authplane/internal/body"
	"github.com/cotal-ai/authplane/internal/fault"
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

	// Run belongs to renewRunDriver, which lands with the runs work.
	Run json.RawMessage `json:"run"`
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
	if err := body.Decode(data, &r); err != nil {
		return nil, err
	}
	if err := r.check(); err != nil {
		return &r, err
	}
	return &r, nil
}

func (r *Request) check() error {
	if r.V != 1 {
		return fault.Field("v", "want 1")
	}
	if r.Kind != Kind {
		return fault.Field("kind", "want %q", Kind)
	}
	switch r.Operation {
	case OpPrepare, OpActivate, OpRenew, OpRenewStandingBundle:
	case OpRenewRunDriver:
		return fault.New(fault.Unimplemented, "operation renewRunDriver lands with workflow runs; not implemented by this plane yet")
	case "session", "retire", "transferReader":
		return fault.New(fault.Unimplemented, "operation %s is not implemented by this plane", r.Operation)
	case "":
		return fault.Field("operation", "missing")
	default:
		return fault.Field("operation", "want prepare, activate, renew or renewStandingBundle")
	}
	for name, raw := range map[string]json.RawMessage{"session": r.Session, "retirement": r.Retirement, "contractArtifacts": r.ContractArtifacts, "transferReader": r.TransferReader} {
		if raw != nil {
			return fault.New(fault.Unimplemented, "key %s is not implemented by this plane", name)
		}
	}
	if r.Run != nil {
		return fault.Field("run", "only renewRunDriver carries run")
	}
	grammar := []struct {
		field string
		ok    bool
		want  string
	}{
		{"space", subjects.ValidSpace(r.Space), "[a-z0-9][a-z0-9_-]{0,31}"},
		{"actor", subjects.ValidActor(r.Actor), "[A-Za-z0-9_]{1,64}"},
		{"instanceId", subjects.ValidUID(r.InstanceID), "[a-z0-9]{26,32}"},
		{"managerLifecycleUid", subjects.ValidUID(r.ManagerLifecycleUID), "[a-z0-9]{26,32}"},
		{"requestId", subjects.ValidRequestID(r.RequestID), "[A-Za-z0-9_-]{22,64}"},
	}
	for _, g := range grammar {
		if !g.ok {
			return fault.Field(g.field, "want %s", g.want)
		}
	}
	if r.Identities == nil {
		return fault.Field("identities", "missing")
	}
	seen := map[string]string{}
	for _, d := range subjects.StandingDuties {
		id := r.Identities.Of(d)
		if !subjects.ValidUserNKey(id) {
			return fault.Field("identities."+string(d)+".id", "want a public user nkey (U followed by 55 base32 characters)")
		}
		if other, dup := seen[id]; dup {
			return fault.Field("identities."+string(d)+".id", "the same nkey as identities.%s: one nkey cannot collapse separate authority lifetimes", other)
		}
		seen[id] = string(d)
	}

	renewal := r.Operation == OpRenew || r.Operation == OpRenewStandingBundle
	switch {
	case r.Operation == OpPrepare && r.RegistrationProof != nil:
		return fault.Field("registrationProof", "prepare carries no proof")
	case r.Operation != OpPrepare && r.RegistrationProof == nil:
		return fault.Field("registrationProof", "missing")
	case r.RegistrationProof != nil && !subjects.ValidProof(*r.RegistrationProof):
		return fault.Field("registrationProof", "want sha256: followed by 64 lowercase hex")
	case renewal && r.AccountPublicKey == nil:
		return fault.Field("accountPublicKey", "missing")
	case renewal && r.ProcessEpoch == nil:
		return fault.Field("processEpoch", "missing")
	case !renewal && r.AccountPublicKey != nil:
		return fault.Field("accountPublicKey", "only renewals carry it")
	case !renewal && r.ProcessEpoch != nil:
		return fault.Field("processEpoch", "only renewals carry it")
	case r.AccountPublicKey != nil && !subjects.ValidAccountNKey(*r.AccountPublicKey):
		return fault.Field("accountPublicKey", "want a public account nkey")
	}
	return nil
}
