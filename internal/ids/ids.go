// Package ids makes the identifiers the plane and its tools hand out: instance ids and
// lifecycle uids, request ids, writer nonces and capabilities, all from crypto/rand.
package ids

import (
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
	"math/big"
	"strings"
)

// UID returns a fresh instance id or lifecycle uid (docs/PROTOCOL.md, "Subjects and callers"): 26 base36 characters from 20
// random bytes, at least 128 bits of entropy.
func UID() string {
	s := new(big.Int).SetBytes(random(20)).Text(36)
	return strings.Repeat("0", max(0, 26-len(s))) + s[max(0, len(s)-32):]
}

// RequestID returns a fresh request id: 24 base64url characters (144 bits).
func RequestID() string { return base64.RawURLEncoding.EncodeToString(random(18)) }

// Nonce returns a fresh writer-unique nonce for a state-changing write: 32 hex characters.
func Nonce() string { return hex.EncodeToString(random(16)) }

// Secret returns n fresh random bytes as hex, for capabilities and message ids.
func Secret(n int) string { return hex.EncodeToString(random(n)) }

// random returns n bytes from crypto/rand, which never fails on a supported platform.
func random(n int) []byte {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		panic("ids: crypto/rand failed: " + err.Error())
	}
	return b
}
