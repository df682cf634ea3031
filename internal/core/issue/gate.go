package issue

// The endpoint gate (`epgate.<endpoint>.<iid>` in the auth bucket): its row,
// the fence every mint of an instance commits on. A mint is valid only if a CAS rewriting the
// gate exactly as it was read lands, and every fence write through GateOf changes the row's bytes
// (a fresh nonce), so no mint commits after one. The CAS itself is the fence package's.

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"

	"github.com/cotal-ai/authplane/internal/core/fault"
	"github.com/cotal-ai/authplane/internal/core/fence"
	"github.com/cotal-ai/authplane/subjects"
)

// States of a gate. GateRetired is terminal.
const (
	GateOpen    = "open"
	GateFrozen  = "frozen"
	GateRetired = "retired"
)

// OpRetirement is the kind of the op a gate retired by this plane carries (a row written
// elsewhere may carry another kind).
const OpRetirement = "retirement"

// GateRow is a gate's stored value (a closed schema: anything else is corruption).
type GateRow struct {
	State                 string        `json:"state"`
	Generation            uint64        `json:"generation"`
	ProcessEpoch          uint64        `json:"processEpoch"`
	RegistrationRevision  uint64        `json:"registrationRevision"`
	NameAuthorityRevision uint64        `json:"nameAuthorityRevision"`
	Principal             string        `json:"principal"`
	Op                    *GateOp       `json:"op,omitempty"`
	Registration          *Registration `json:"registration,omitempty"`
	// Nonce is new on every state-changing write, so a write whose outcome is unknown can be
	// settled by re-reading, and a row never returns to bytes it once had.
	Nonce string `json:"nonce"`
	// SupervisedUntil (seconds) is the end of the platform supervisor assignment a supervised
	// instance was prepared under: every mint for the instance is clamped to it.
	SupervisedUntil int64 `json:"supervisedUntil,omitempty"`
	// Reregistrations is the instance's budget of re-registrations
	// (--reregistrations-per-instance), taken in the registration's own write of the gate.
	Reregistrations *Bucket `json:"reregistrations,omitempty"`
}

// GateOp is the operation that froze or retired a gate.
type GateOp struct {
	OpID      string `json:"opId"`
	Kind      string `json:"kind"`
	Successor string `json:"successor,omitempty"`
}

// Registration is what `prepare` recorded about a manager instance.
type Registration struct {
	LifecycleUID     string `json:"lifecycleUid"`
	IdentitiesDigest string `json:"identitiesDigest"`
	PreparedBy       string `json:"preparedBy"`
	// Trust is the generation of the data account's signing keys whose root keyed the
	// registration's proofs (0 until an emergency rotation replaces it): a renewal of a
	// registration made under an older one is refused `expired`.
	Trust uint64 `json:"trust,omitempty"`
}

// Gate is a gate as observed: its row, the exact bytes read, and their revision.
type Gate = fence.Observed[GateRow]

// GateOf returns the gate of endpoint's instance iid in the fence bucket kv. Every row written
// through it gets a fresh nonce, so every fence write changes the gate's bytes and no mint
// observed before it can commit after it.
func GateOf(kv fence.KV, endpoint, iid string) *fence.Fence[GateRow] {
	return fence.New(kv, subjects.GateKey(endpoint, iid), ParseGate, func(r *GateRow) { r.Nonce = subjects.NewNonce() })
}

// maxGateRow bounds a stored gate row.
const maxGateRow = 4 << 10

// ParseGate decodes and checks a stored row.
func ParseGate(data []byte) (GateRow, error) {
	var r GateRow
	if err := fault.DecodeRow(data, &r, maxGateRow); err != nil {
		return GateRow{}, err
	}
	switch {
	case r.State != GateOpen && r.State != GateFrozen && r.State != GateRetired:
		return GateRow{}, fmt.Errorf("state %q", r.State)
	case r.State == GateOpen && r.Op != nil:
		return GateRow{}, errors.New("an open gate carries an op")
	case r.State != GateOpen && r.Op == nil:
		return GateRow{}, fmt.Errorf("a %s gate carries no op", r.State)
	case r.Nonce == "":
		return GateRow{}, errors.New("no nonce")
	}
	if o, a, ok := strings.Cut(r.Principal, "."); !ok || o == "" || a == "" || strings.Contains(a, ".") {
		return GateRow{}, fmt.Errorf("principal %q", r.Principal)
	}
	return r, nil
}

// RetirementOpID is the op id of the retirement of lifecycle uid (the original's
// managedRetirementOpId): the first 26 hex characters of SHA-256 over "retire:" + uid, so every
// retry of one lifecycle's end names the same operation.
func RetirementOpID(uid string) string {
	sum := sha256.Sum256([]byte("retire:" + uid))
	return hex.EncodeToString(sum[:])[:26]
}
