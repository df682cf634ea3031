package body

import (
	"encoding/json"
	"errors"
	"reflect"
	"strings"
	"testing"

	"github.com/cotal-ai/authplane/internal/fault"
)

// testEnvelope and testRequest have the shape of a manager request: embedded structs whose
// fields are promoted, a field the outer struct shadows, pointers where absent and zero
// differ, raw members, a value of any type, and numbers of every width.
type testEnvelope struct {
	V          int             `json:"v"`
	Kind       string          `json:"kind"`
	Identities *testIdentities `json:"identities"`
	Proof      *string         `json:"registrationProof,omitempty"`
	Epoch      *uint64         `json:"processEpoch,omitempty"`
	Shadowed   string          `json:"operation"`
}

// TestInner is exported: encoding/json cannot allocate an embedded pointer to an unexported
// struct, and neither decoder tries.
type TestInner struct {
	testEnvelope
	Operation string  `json:"operation"`
	Small     int8    `json:"small"`
	Tiny      uint8   `json:"tiny"`
	Half      float32 `json:"half"`
}

type testRequest struct {
	*TestInner
	Session json.RawMessage   `json:"session"`
	Any     any               `json:"any"`
	Counts  map[string]int    `json:"counts"`
	Items   []testItem        `json:"items"`
	Nested  *[]*testIdentity  `json:"nested"`
	Lists   [][]string        `json:"lists"`
	Raws    []json.RawMessage `json:"raws"`
}

// agree decodes data with Decode and with the reference into every test type, and fails
// unless both give the same value, or the same refusal; Peek likewise.
func agree(t *testing.T, data []byte) {
	t.Helper()
	for _, target := range []func() any{func() any { return &testBody{} }, func() any { return &testRequest{} }} {
		got, want := target(), target()
		gotErr, wantErr := Decode(data, got), refDecode(data, want)
		if !sameOutcome(gotErr, wantErr) {
			t.Fatalf("%q into %T: got %v, the reference %v", data, got, gotErr, wantErr)
		}
		if gotErr == nil && !reflect.DeepEqual(got, want) {
			t.Fatalf("%q into %T: got %+v, the reference %+v", data, got, got, want)
		}
	}
	got, gotErr := Peek(data, "kind")
	want, wantErr := refPeek(data, "kind")
	if got != want || !sameOutcome(gotErr, wantErr) {
		t.Fatalf("Peek %q: got %q, %v; the reference %q, %v", data, got, gotErr, want, wantErr)
	}
}

func sameOutcome(a, b error) bool {
	if a == nil || b == nil {
		return a == nil && b == nil
	}
	var fa, fb *fault.Error
	if !errors.As(a, &fa) || !errors.As(b, &fb) {
		return false
	}
	return fa.Code == fb.Code && fa.Message == fb.Message
}

// agreeSeeds are bodies of every shape the decoders meet: valid ones, and every kind of fault
// of the grammar, the schema and the types, alone and in each order.
var agreeSeeds = []string{
	`{"v":1,"kind":"k","count":7,"epoch":18446744073709551615,"ratio":0.5,"flag":true,"optional":"o",
		"identities":{"supervisor":{"id":"S"},"serve":{"id":"X"}},"tags":["a","b"],"items":[{"id":"i","count":-2}],
		"meta":{"Any-Key":"v"},"request":{"whatever":[1,{"x":null}]}}`,
	`{"v":1,"kind":"manager-service-authority","identities":{"serve":{"id":"x"}},"registrationProof":"p","processEpoch":0,
		"operation":"renew","small":-128,"tiny":255,"half":1.5e3,"session":[1,"2",{"3":null}],"any":{"a":[1,true,null]},
		"counts":{"a":1,"b":-2},"items":[],"nested":[{"id":"n"}],"lists":[[],["a"]],"raws":[1,{"x":2},"s",null]}`,
	` { } `, "{}\n", `{"tags":[]}`, `{"tags":["a"]}`, `{"meta":{}}`, `{"any":null}`, `{"any":1}`, `{"any":"s"}`,
	`{"kind":"a\"b\\c\/d\b\f\n\r\t"}`, `{"kind":"\u00e9\u4e2d\ud83d\ude00"}`, `{"kind":"\ud800"}`, `{"kind":"\udc00x"}`,
	`{"kind":"\ud800\ud800"}`, `{"kind":"\ud800\u0041"}`, `{"kind":"\uD83D\uDE00"}`, `{"kind":"\u00"}`, `{"kind":"\x"}`,
	`{"kind":"` + "\x01" + `"}`, `{"kind":"` + "\x7f" + `"}`, `{"k\u0069nd":"x"}`, `{"kind":"a","k\u0069nd":"b"}`,
	`{"kind":"é"}`, "{\"kind\":\"\xe2\x80\xa8\"}", `{"v":01}`, `{"v":-0}`, `{"v":-}`, `{"v":1.}`, `{"v":.5}`, `{"v":1e}`,
	`{"v":1E+2}`, `{"v":-1}`, `{"count":0}`, `{"ratio":1e400}`, `{"ratio":-0.0e-0}`, `{"half":3.5e38}`, `{"small":128}`,
	`{"tiny":-1}`, `{"v":true}`, `{"v":tru}`, `{"v":nul}`, `{"flag":false}`, `{"flag":fals}`, `{"v":1,}`, `{,"v":1}`,
	`{"v" 1}`, `{"v":1 "kind":"x"}`, `{"v":[1,]}`, `{"tags":["a",]}`, `{"tags":["a" "b"]}`, `{"v":1}}`, `{"v":1`,
	`{"bogus":1,`, `{"bogus":{`, `{"bogus":1} x`, `{"v":"1"} {`, `{"v":null,"kind":`, `{'v':1}`, `{v:1}`, `{"v":1}` + "\x00",
	"\ufeff{}", "\t\r\n {\"v\" :\t1 } \n", `[]`, `[1]`, `"s"`, `1`, `true`, `null`, ` null `, `nul`, ``, ` `, `{`, `}`,
	`{"identities":{"serve":{"id":"x","nope":1}}}`, `{"items":[{"id":"x"},{"id":"y","zz":1}]}`, `{"Kind":"x"}`,
	`{"Skipped":"x"}`, `{"meta":{"a":"1","a":"2"}}`, `{"meta":{"a":1}}`, `{"tags":["a",null]}`, `{"request":null}`,
	`{"identities":[]}`, `{"identities":"x"}`, `{"tags":{}}`, `{"tags":"x"}`, `{"identities":{"serve":{"id":{}}}}`,
	`{"kind":["x"]}`, `{"count":4294967296}`, `{"epoch":18446744073709551616}`, `{"v":1.5}`, `{"v":1e3}`,
	`{"operation":"o","operation":"p"}`, `{"counts":{"a":"1"}}`, `{"nested":[null]}`, `{"nested":null}`,
	`{"lists":[["a",1]]}`, `{"raws":[}`, `{"session":{"a":}}`, `{"any":{"a":]}}`, `{"bogus":1,"v":"x"}`,
	`{"v":"x","bogus":1}`, `{"v":"x","v":1}`, `{"` + strings.Repeat("k", 100) + `":1}`, `{"meta":{"` + strings.Repeat("m", 100) + `":1}}`,
	`{"v":` + strings.Repeat("9", 100) + `}`, `{"tags":["a","b","c","d","e","f","g","h","i",1]}`,
	`{"request":` + strings.Repeat("[", 9999) + strings.Repeat("]", 9999) + `}`,
	`{"request":` + strings.Repeat("[", 10000) + strings.Repeat("]", 10000) + `}`,
	`{"bogus":` + strings.Repeat("[", 10000) + strings.Repeat("]", 10000) + `}`,
	strings.Repeat("[", 10001) + strings.Repeat("]", 10001),
}

func TestDecodeAgreesWithTheFourPassReference(t *testing.T) {
	for _, seed := range agreeSeeds {
		agree(t, []byte(seed))
		// Every prefix of a short body: each kind of truncation, in every place.
		if len(seed) < 400 {
			for i := range len(seed) {
				agree(t, []byte(seed[:i]))
			}
		}
	}
}

// FuzzDecodeAgreesWithTheFourPassReference: go test -fuzz FuzzDecode ./internal/body
func FuzzDecodeAgreesWithTheFourPassReference(f *testing.F) {
	for _, seed := range agreeSeeds {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, data []byte) { agree(t, data) })
}
