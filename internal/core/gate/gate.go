// Package gate is the endpoint gate (`epgate.<endpoint>.<iid>` in the auth bucket): its row,
// the fence every mint of an instance commits on. A mint is valid only if a CAS rewriting the
// gate exactly as it was read lands, and every fence write through Of changes the row's bytes
// (a fresh nonce), so no mint commits after one. The CAS itself is the fence package's.
package gate

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"

	"github.com/cotal-ai/authplane/internal/core/body"
	"github.com/cotal-ai/authplane/internal/core/budget"
	"github.com/cotal-ai/authplane/internal/core/fence"
	"github.com/cotal-ai/authplane/subjects"
)

// States of a gate. Retired is terminal.
const (
	Open    = "open"
	Frozen  = "frozen"
	Retired = "retired"
)

// OpRetirement is the kind of the op a gate retired by this plane carries (a row written
// elsewhere may carry another kind).
const OpRetirement = "retirement"

// Row is a gate's stored value (a closed schema: anything else is corruption).
type Row struct {
	State                 string        `json:"state"`
	Generation            uint64        `json:"generation"`
	ProcessEpoch          uint64        `json:"processEpoch"`
	RegistrationRevision  uint64        `json:"registrationRevision"`
	NameAuthorityRevision uint64        `json:"nameAuthorityRevision"`
	Principal             string        `json:"principal"`
	Op                    *Op           `json:"op,omitempty"`
	Registration          *Registration `json:"registration,omitempty"`
	// Nonce is new on every state-changing write, so a write whose outcome is unknown can be
	// settled by re-reading, and a row never returns to bytes it once had.
	Nonce string `json:"nonce"`
	// SupervisedUntil (seconds) is the end of the platform supervisor assignment a supervised
	// instance was prepared under: every mint for the instance is clamped to it.
	SupervisedUntil int64 `json:"supervisedUntil,omitempty"`
	// Reregistrations is the instance's budget of re-registrations
	// (--reregistrations-per-instance), taken in the registration's own write of the gate.
	Reregistrations *budget.Bucket `json:"reregistrations,omitempty"`
}

// Op is the operation that froze or retired a gate.
type Op struct {
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
type Gate = fence.Observed[Row]

// Of returns the gate of endpoint's instance iid in the fence bucket kv. Every row written
// through it gets a fresh nonce, so every fence write changes the gate's bytes and no mint
// observed before it can commit after it.
func Of(kv fence.KV, endpoint, iid string) *fence.Fence[Row] {
	return fence.New(kv, subjects.GateKey(endpoint, iid), Parse, func(r *Row) { r.Nonce = subjects.NewNonce() })
}

// maxRow bounds a stored gate row.
const maxRow = 4 << 10

// Parse decodes and checks a stored row.
func Parse(data []byte) (Row, error) {
	var r Row
	if err := body.DecodeRow(data, &r, maxRow); err != nil {
		return Row{}, err
	}
	switch {
	case r.State != Open && r.State != Frozen && r.State != Retired:
		return Row{}, fmt.Errorf("state %q", r.State)
	case r.State == Open && r.Op != nil:
		return Row{}, errors.New("an open gate carries an op")
	case r.State != Open && r.Op == nil:
		return Row{}, fmt.Errorf("a %s gate carries no op", r.State)
	case r.Nonce == "":
		return Row{}, errors.New("no nonce")
	}
	if o, a, ok := strings.Cut(r.Principal, "."); !ok || o == "" || a == "" || strings.Contains(a, ".") {
		return Row{}, fmt.Errorf("principal %q", r.Principal)
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
