package subjects

import (
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
	"math/big"
	"regexp"
	"strings"

	"github.com/nats-io/nkeys"
)

var (
	spaceRe      = regexp.MustCompile(`^[a-z0-9][a-z0-9_-]{0,31}$`)
	ownerRe      = regexp.MustCompile(`^[up]_[a-z2-7]{26}$`)
	userOwnerRe  = regexp.MustCompile(`^u_[a-z2-7]{26}$`)
	actorRe      = regexp.MustCompile(`^[A-Za-z0-9_]{1,64}$`)
	uidRe        = regexp.MustCompile(`^[a-z0-9]{26,32}$`)
	requestIDRe  = regexp.MustCompile(`^[A-Za-z0-9_-]{22,64}$`)
	runIDRe      = regexp.MustCompile(`^run-[0-9a-f]{32}$`)
	takeoverIDRe = regexp.MustCompile(`^[0-9a-f]{16}$`)
	proofRe      = regexp.MustCompile(`^sha256:[0-9a-f]{64}$`)
	instNameRe   = regexp.MustCompile(`^[A-Za-z0-9_-]{1,64}$`)
)

// ValidSpace reports whether s is a space name: a subject token that is also part of every
// bucket name.
func ValidSpace(s string) bool { return spaceRe.MatchString(s) }

// ValidOwner reports whether s is an owner token: `u_` (derived from an IdP subject) or `p_`
// (a platform holder) followed by 26 base32-lower characters.
func ValidOwner(s string) bool { return ownerRe.MatchString(s) }

// ValidUserOwner reports whether s is a `u_` owner.
func ValidUserOwner(s string) bool { return userOwnerRe.MatchString(s) }

// ValidActor reports whether s is an actor token.
func ValidActor(s string) bool { return actorRe.MatchString(s) }

// ValidUID reports whether s is an instance id or lifecycle uid.
func ValidUID(s string) bool { return uidRe.MatchString(s) }

// ValidInstanceName reports whether s names a claimed plane identity (`--instance-name`): one
// KV key token of letters, digits, `_` and `-`, at most 64 characters.
func ValidInstanceName(s string) bool { return instNameRe.MatchString(s) }

// ValidRequestID reports whether s is a request id.
func ValidRequestID(s string) bool { return requestIDRe.MatchString(s) }

// ValidRunID reports whether s is a workflow run id.
func ValidRunID(s string) bool { return runIDRe.MatchString(s) }

// ValidTakeoverID reports whether s is a run takeover id.
func ValidTakeoverID(s string) bool { return takeoverIDRe.MatchString(s) }

// ValidProof reports whether s has the shape of a registration proof.
func ValidProof(s string) bool { return proofRe.MatchString(s) }

// ValidUserNKey reports whether s is a public user nkey in its one canonical spelling: 56
// characters that decode and encode back to themselves. (The nkeys library accepts 57- and
// 59-character spellings of one key; five spellings of one key must not pass for five keys.)
func ValidUserNKey(s string) bool { return canonical(nkeys.PrefixByteUser, s) }

// ValidAccountNKey reports whether s is a public account nkey in its canonical spelling.
func ValidAccountNKey(s string) bool { return canonical(nkeys.PrefixByteAccount, s) }

// canonical reports whether s decodes as a public key of prefix and encodes back to s.
func canonical(prefix nkeys.PrefixByte, s string) bool {
	if len(s) != 56 {
		return false
	}
	raw, err := nkeys.Decode(prefix, []byte(s))
	if err != nil {
		return false
	}
	again, err := nkeys.Encode(prefix, raw)
	return err == nil && string(again) == s
}

// NewUID returns a fresh instance id or lifecycle uid: 26 base36 characters from 20 random
// bytes, at least 128 bits of entropy.
func NewUID() string {
	s := new(big.Int).SetBytes(random(20)).Text(36)
	return strings.Repeat("0", max(0, 26-len(s))) + s[max(0, len(s)-32):]
}

// NewRequestID returns a fresh request id: 24 base64url characters (144 bits).
func NewRequestID() string { return base64.RawURLEncoding.EncodeToString(random(18)) }

// NewNonce returns a fresh writer-unique nonce for a state-changing write: 32 hex characters.
func NewNonce() string { return hex.EncodeToString(random(16)) }

// NewSecret returns n fresh random bytes as hex, for capabilities and message ids.
func NewSecret(n int) string { return hex.EncodeToString(random(n)) }

// random returns n bytes from crypto/rand, which never fails on a supported platform.
func random(n int) []byte {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		panic("subjects: crypto/rand failed: " + err.Error())
	}
	return b
}
