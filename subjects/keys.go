package subjects

import "strconv"

// Bucket names, one family each (docs/OPERATIONS.md, "What it runs": the stores). All live in the plane account.

// AuthBucket holds the fences: gates, run fences and revocation sets.
func AuthBucket(space string) string { return "cotal_auth_" + space }

// ActorsBucket holds the actor ledger.
func ActorsBucket(space string) string { return "cotal_actors_" + space }

// IssuedBucket holds issued evidence and attempt rows.
func IssuedBucket(space string) string { return "cotal_issued_" + space }

// AcceptedBucket holds write-once accepted rows.
func AcceptedBucket(space string) string { return "cotal_accepted_" + space }

// AdmissionBucket holds run admissions, revocation markers and witness markers.
func AdmissionBucket(space string) string { return "cotal_admission_" + space }

// RecordsBucket holds run status rows.
func RecordsBucket(space string) string { return "cotal_records_" + space }

// PlatformBucket holds platform supervisor assignments.
func PlatformBucket(space string) string { return "cotal_platform_" + space }

// KeysBucket holds the bearer issuer keys shared by replicas.
func KeysBucket(space string) string { return "cotal_keys_" + space }

// SecretsBucket holds claimed instance identities.
func SecretsBucket(space string) string { return "cotal_secrets_" + space }

// WitnessStream captures owner's imported run-start requests: one stream per owner, so no
// owner's run-starts can evict another's.
func WitnessStream(space, owner string) string { return WitnessStreamPrefix(space) + owner }

// WitnessStreamPrefix is what every owner's witness stream name of space starts with.
func WitnessStreamPrefix(space string) string { return SharedWitnessStream(space) + "_" }

// SharedWitnessStream is the one witness stream every owner shared before each got its own;
// a start removes it (its subjects overlap every owner's).
func SharedWitnessStream(space string) string { return "cotal_witness_" + space }

// MintedStream holds one `minted` record per set of keys minted together (MintedSubject).
func MintedStream(space string) string { return "cotal_minted_" + space }

// AuditStream holds `refused`, `discarded`, `assigned` and `ended` records.
func AuditStream(space string) string { return "cotal_audit_" + space }

// KV keys.

// Gate endpoint names.
const (
	GateEndpointManager = "manager"
	GateEndpointAuth    = "auth"
)

// GateKey is the key of an endpoint gate: `epgate.<endpoint>.<iid>` in AuthBucket.
func GateKey(endpoint, iid string) string { return "epgate." + endpoint + "." + iid }

// RunFenceKey is the key of a run fence in AuthBucket.
func RunFenceKey(runID string) string { return "runfence.manager." + runID }

// SignersKey is the key of an account's live signing keys in AuthBucket.
func SignersKey(account string) string { return "signers." + account }

// NKeyClaimKey is the key of the claim on a user nkey in AuthBucket: the one instance that
// registered it first, for life.
func NKeyClaimKey(nkey string) string { return "nkey." + nkey }

// InstancesKey is the key of the list of an owner's live manager instances in AuthBucket: the
// per-owner quota.
func InstancesKey(owner string) string { return "instances." + owner }

// BudgetKey is the key of name's stored token bucket of one tenant budget in AuthBucket:
// `budget.<budget>.<name>` (an owner, an instance id).
func BudgetKey(budget, name string) string { return "budget." + budget + "." + name }

// ActorKey is the key of a ledger row in ActorsBucket.
func ActorKey(owner, actor string) string { return "actor." + owner + "." + actor }

// AssignmentKey is the key of an owner's platform supervisor assignment in PlatformBucket.
func AssignmentKey(owner string) string { return "assignment." + owner }

// EvidenceKey is the key of one issued generation's evidence in IssuedBucket:
// `v1.<owner>.<actor>.<uid>.<generation>`.
func EvidenceKey(owner, actor, uid, generation string) string {
	return "v1." + owner + "." + actor + "." + uid + "." + generation
}

// AttemptKey is the key of the attempt row of the evidence at evidenceKey in IssuedBucket.
func AttemptKey(evidenceKey string) string { return "attempt." + evidenceKey }

// AcceptedKey is the key of a write-once accepted row in AcceptedBucket.
func AcceptedKey(token string) string { return "accepted.v1." + token }

// AdmissionKey is the key of a run admission in AdmissionBucket.
func AdmissionKey(runID string) string { return "admission.v1.manager." + runID }

// RevokedKey is the key of a run revocation marker in AdmissionBucket.
func RevokedKey(runID string) string { return "revoked.v1.manager." + runID }

// RunStatusKey is the key of a run status row in RecordsBucket.
func RunStatusKey(runID string) string { return "run.manager." + runID + ".status" }

// IdentityKey is the key of a claimed instance identity in SecretsBucket.
func IdentityKey(name string) string { return "identity." + name }

// RegisteredKey is the key, in SecretsBucket, of the mark that the instance claimed under name
// registered its gate.
func RegisteredKey(name string) string { return "registered." + name }

// SigningGenKey is the key of one generation of an account's signing keys in KeysBucket: its
// root's seed, create-only.
func SigningGenKey(account string, gen uint64) string {
	return "signing." + account + "." + strconv.FormatUint(gen, 10)
}

// RotationKey is the key of an account's signing-key rotation in AuthBucket: which generation
// signs, which keys the proofs, and the rotation under way.
func RotationKey(account string) string { return "rotation." + account }
