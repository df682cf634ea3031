package bearer

import (
	"encoding/hex"
	"encoding/json"
	"strings"
	"testing"
)

// Vectors computed by Node.js 20 with the original's derivation: HMAC-SHA256 over
// "cotal-owner-v1:" + JSON.stringify([issuer, sub]), the first 16 bytes in base32 (RFC 4648,
// lowercase, unpadded), secret 00 01 … 1f. Odd characters on purpose: quotes, backslashes,
// HTML, U+2028/U+2029, control characters, astral-plane runes.
const vectors = `{"issuer":"https://idp.example","sub":"user-1","json":"[\"https://idp.example\",\"user-1\"]","owner":"u_g5mclrofwa6pirb3p4yeigemze"}
{"issuer":"https://idp.example","sub":"","json":"[\"https://idp.example\",\"\"]","owner":"u_ssskuexf25ex4xszz5q2rzuz2q"}
{"issuer":"https://idp.example/","sub":"ümlaut-ß","json":"[\"https://idp.example/\",\"ümlaut-ß\"]","owner":"u_iuhzjirnjvvc7esdrgpcjpsh6y"}
{"issuer":"https://idp.example","sub":"a\"quote\\backslash","json":"[\"https://idp.example\",\"a\\\"quote\\\\backslash\"]","owner":"u_2g4ekqb43kfwnh6lpxxtkon2tm"}
{"issuer":"https://idp.example","sub":"<script>&amp;</script>","json":"[\"https://idp.example\",\"<script>&amp;</script>\"]","owner":"u_g4akiskxfp6hh42jh7kbk3fc6u"}
{"issuer":"https://idp.example","sub":"line\u2028sep\u2029para","json":"[\"https://idp.example\",\"line\u2028sep\u2029para\"]","owner":"u_nuwqhimc4tmrbdbe3k4eexqim4"}
{"issuer":"https://idp.example","sub":"ctl\u0000\u0001\u001f\b\f\n\r\t","json":"[\"https://idp.example\",\"ctl\\u0000\\u0001\\u001f\\b\\f\\n\\r\\t\"]","owner":"u_die6lemj3rzmqe7kfh4kacmwte"}
{"issuer":"https://idp.example","sub":"emoji 😀 and 中文","json":"[\"https://idp.example\",\"emoji 😀 and 中文\"]","owner":"u_s3nohtwgd2f66pnwzuq4b7h2y4"}
{"issuer":"https://idp.example","sub":"\u007f\u0080\u00a0","json":"[\"https://idp.example\",\"\u007f\u0080\u00a0\"]","owner":"u_p7vgw5zsvodp366a5wdn3ldbjq"}
{"issuer":"https://idp.example","sub":"slash/ and \u2027 and \u202a","json":"[\"https://idp.example\",\"slash/ and \u2027 and \u202a\"]","owner":"u_jubjhuq2pwepen62jtpwjnfrjy"}
{"issuer":"iss with \"quotes\"","sub":"sub","json":"[\"iss with \\\"quotes\\\"\",\"sub\"]","owner":"u_5sbqoiohvifaz5yype5es5jxjy"}
{"issuer":"https://idp.example","sub":"replacement \ufffd char","json":"[\"https://idp.example\",\"replacement \ufffd char\"]","owner":"u_yw5aufkiqon4q2ajhpi42kumyu"}`

func TestOwnersDeriveAsTheOriginalDerivesThem(t *testing.T) {
	secret, err := hex.DecodeString("000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(vectors, "\n") {
		var v struct{ Issuer, Sub, JSON, Owner string }
		if err := json.Unmarshal([]byte(line), &v); err != nil {
			t.Fatalf("vector %s: %v", line, err)
		}
		if got := "[" + jsString(v.Issuer) + "," + jsString(v.Sub) + "]"; got != v.JSON {
			t.Errorf("JSON of %q: got %q, want JavaScript's %q", v.Sub, got, v.JSON)
		}
		if got := DeriveOwner(secret, v.Issuer, v.Sub); got != v.Owner {
			t.Errorf("owner of %q: got %s, want %s", v.Sub, got, v.Owner)
		}
	}
}
