package manager

import (
	"context"
	"crypto/hkdf"
	"crypto/hmac"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"sync"

	"github.com/nats-io/nkeys"

	"github.com/cotal-ai/authplane/client"
	"github.com/cotal-ai/authplane/internal/core/fault"
	"github.com/cotal-ai/authplane/internal/core/issue"
	"github.com/cotal-ai/authplane/subjects"
)

// Proof labels: what `prepare` returns (and `activate` needs), and what `activate` returns
// (and renewals need).
const (
	labelRegistration = "registration"
	labelCurrent      = "current"
)

// proofInfo is the HKDF label the proof key is derived under.
const proofInfo = "cotal-auth/manager-registration-proof/v1"

// ProofKey derives the proof key from the data account's signing key: HKDF-SHA256 over its
// seed under a fixed label, so the seed itself never keys anything but signatures.
func ProofKey(signer nkeys.KeyPair) ([]byte, error) {
	seed, err := signer.Seed()
	if err != nil {
		return nil, fmt.Errorf("proof key: %w", err)
	}
	return hkdf.Key(sha256.New, seed, nil, proofInfo, 32)
}

// Trust is which generation of the data account's signing keys keys the registration proofs:
// the last emergency rotation's (docs/OPERATIONS.md, "Rotate the signing keys").
type Trust interface {
	// Trust returns that generation and its root, read now.
	Trust(ctx context.Context) (uint64, nkeys.KeyPair, error)
}

// proofKeys derives and keeps each generation's proof key.
type proofKeys struct {
	mu   sync.Mutex
	keys map[uint64][]byte
}

// trust returns the generation that keys the proofs now and its proof key: generation 0's
// ProofKey when the engine has no Trust.
func (e *Engine) trust(ctx context.Context) (uint64, []byte, error) {
	if e.Trust == nil {
		return 0, e.ProofKey, nil
	}
	gen, root, err := e.Trust.Trust(ctx)
	if err != nil {
		return 0, nil, err
	}
	e.proofKeys.mu.Lock()
	defer e.proofKeys.mu.Unlock()
	if key, ok := e.proofKeys.keys[gen]; ok {
		return gen, key, nil
	}
	key, err := ProofKey(root)
	if err != nil {
		return 0, nil, fault.Wrap(fault.Internal, err, "deriving the proof key")
	}
	if e.proofKeys.keys == nil {
		e.proofKeys.keys = map[uint64][]byte{}
	}
	e.proofKeys.keys[gen] = key
	return gen, key, nil
}

// trustedKey returns the proof key that checks g's proofs: the one of the trust root now. A
// registration made under a root an emergency rotation replaced is refused.
func (e *Engine) trustedKey(ctx context.Context, g *issue.Gate) ([]byte, error) {
	trust, key, err := e.trust(ctx)
	if err != nil {
		return nil, err
	}
	if reg := g.Row.Registration; reg != nil && reg.Trust != trust {
		return nil, fault.New(fault.Expired, "the signing key this registration was issued under was removed by an emergency rotation; prepare again")
	}
	return key, nil
}

// trustOf is the trust generation r's registration was made under.
func trustOf(r issue.GateRow) uint64 {
	if r.Registration == nil {
		return 0
	}
	return r.Registration.Trust
}

// IdentitiesDigest is SHA-256 over the five duty nkeys in the order supervisor, executor,
// serve, goalWriter, sessionLedger.
func IdentitiesDigest(ids client.Identities) string {
	h := sha256.New()
	for _, d := range subjects.StandingDuties {
		h.Write([]byte(ids.Of(d)))
		h.Write([]byte{'\n'})
	}
	return "sha256:" + hex.EncodeToString(h.Sum(nil))
}

// proofClaims is what a proof binds: the registration as the gate carries it. It names no
// caller, so the instance's own duties can renew with it.
type proofClaims struct {
	Space                string `json:"space"`
	Owner                string `json:"owner"`
	InstanceID           string `json:"instanceId"`
	LifecycleUID         string `json:"lifecycleUid"`
	IdentitiesDigest     string `json:"identitiesDigest"`
	RegistrationRevision uint64 `json:"registrationRevision"`
	ProcessEpoch         uint64 `json:"processEpoch"`
}

// proof computes the proof of label over the registration on gate row r.
func proof(key []byte, label, space, owner, iid string, r issue.GateRow) string {
	msg, err := json.Marshal(proofClaims{
		Space: space, Owner: owner, InstanceID: iid,
		LifecycleUID:         r.Registration.LifecycleUID,
		IdentitiesDigest:     r.Registration.IdentitiesDigest,
		RegistrationRevision: r.RegistrationRevision,
		ProcessEpoch:         r.ProcessEpoch,
	})
	if err != nil {
		panic("manager: proof claims do not marshal: " + err.Error())
	}
	mac := hmac.New(sha256.New, key)
	mac.Write([]byte("cotal/manager-proof/v1\x00" + label + "\x00"))
	mac.Write(msg)
	return "sha256:" + hex.EncodeToString(mac.Sum(nil))
}

// proofEqual compares two proofs in constant time.
func proofEqual(a, b string) bool {
	return subtle.ConstantTimeCompare([]byte(a), []byte(b)) == 1
}
