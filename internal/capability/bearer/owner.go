package bearer

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base32"
	"fmt"
	"strings"
	"unicode/utf8"
)

// ownerEncoding is RFC 4648 base32, lowercase, unpadded: an owner token.
var ownerEncoding = base32.NewEncoding("abcdefghijklmnopqrstuvwxyz234567").WithPadding(base32.NoPadding)

// DeriveOwner is the owner of IdP subject sub of issuer (docs/PROTOCOL.md, "Subjects and callers"): `u_` and the base32 of the
// first 16 bytes of HMAC-SHA256(secret, "cotal-owner-v1:" + JSON([issuer, sub])), the JSON
// byte for byte what JavaScript's JSON.stringify writes, so an existing space's owners carry
// over from the original.
func DeriveOwner(secret []byte, issuer, sub string) string {
	mac := hmac.New(sha256.New, secret)
	mac.Write([]byte("cotal-owner-v1:[" + jsString(issuer) + "," + jsString(sub) + "]"))
	return "u_" + ownerEncoding.EncodeToString(mac.Sum(nil)[:16])
}

// jsString is s as JSON.stringify writes a string: quotes and backslashes escaped, the control
// characters as \b \f \n \r \t or \u00xx, and everything else as it is (no HTML escaping, and
// U+2028 and U+2029 literal, where encoding/json escapes both). s must be valid UTF-8.
func jsString(s string) string {
	var b strings.Builder
	b.WriteByte('"')
	for i, r := range s {
		switch {
		case r == '"':
			b.WriteString(`\"`)
		case r == '\\':
			b.WriteString(`\\`)
		case r == '\b':
			b.WriteString(`\b`)
		case r == '\f':
			b.WriteString(`\f`)
		case r == '\n':
			b.WriteString(`\n`)
		case r == '\r':
			b.WriteString(`\r`)
		case r == '\t':
			b.WriteString(`\t`)
		case r < 0x20:
			fmt.Fprintf(&b, `\u%04x`, r)
		case r == utf8.RuneError && !strings.HasPrefix(s[i:], "\uFFFD"): // U+FFFD itself is valid, and written as it is
			panic("idp: jsString of invalid UTF-8")
		default:
			b.WriteRune(r)
		}
	}
	b.WriteByte('"')
	return b.String()
}
