package fault_test

import (
	"bytes"
	"cmp"
	"encoding/json"
	"reflect"
	"strings"
	"testing"

	"github.com/cotal-ai/authplane/client"
	"github.com/cotal-ai/authplane/internal/core/fault"
	"github.com/cotal-ai/authplane/internal/testkit"
)

// seedBodies are the bodies of this package's table tests, accepted and refused, except those
// of 64 KiB: the size bound is the tables' to check, and a body that size takes a thousand times
// longer than a small one, so mutating it would spend the fuzzing time on a few executions.
func seedBodies() []string {
	return []string{
		`{"v":1,"kind":"k","count":7,"epoch":18446744073709551615,"ratio":0.5,"flag":true,"optional":"o",
		"identities":{"supervisor":{"id":"S"},"serve":{"id":"X"}},"tags":["a","b"],"items":[{"id":"i","count":-2}],
		"meta":{"Any-Key":"v"},"request":{"whatever":[1,{"x":null}]}}`,
		` { } `,
		`{"v":1,"bogus":1}`, `{"identities":{"serve":{"id":"x","nope":1}}}`, `{"items":[{"id":"x"},{"id":"y","zz":1}]}`,
		`{"Kind":"x"}`, `{"identities":{"serve":{"ID":"x"}}}`, `{"Skipped":"x"}`, `{"v":1,"v":2}`,
		`{"kind":"a","k\u0069nd":"b"}`, `{"identities":{"serve":{"id":"a","id":"b"}}}`, `{"meta":{"a":"1","a":"2"}}`,
		`{"kind":null}`, `{"optional":null}`, `{"identities":{"serve":{"id":null}}}`, `{"identities":{"supervisor":null}}`,
		`{"tags":["a",null]}`, `{"request":null}`, `{"v":"1"}`, `{"kind":1}`, `{"kind":true}`, `{"flag":"true"}`,
		`{"identities":{"serve":{"id":{}}}}`, `{"kind":["x"]}`, `{"identities":[]}`, `{"identities":"x"}`, `{"tags":{}}`,
		`{"v":1.5}`, `{"v":1e3}`, `{"count":-1}`, `{"count":4294967296}`, `{"epoch":18446744073709551616}`,
		`{"identities":{"serve":{"id":7}}}`, `{"meta":{"a":1}}`, `{"v":`, `hello`, ``, `{"v":1} x`, `{"v":1}{"v":2}`,
		`[{"v":1}]`, `"x"`, `null`, `1`, "{\"kind\":\"\xff\"}", "{\"\xc3\x28\":1}",
		`{"tags":["a",2]}`, `{"items":[{"id":"x","count":1},{"id":"y","count":"1"}]}`,
		`{"bogus":1}`, `{"identities":{"serve":{"id":1}}}`, `[1]`, `{`,
		`{"kind":"manager-service-authority","x":1}`, `{"x":1}`, `[]`, " null\n",
		// Bodies of fault.TestRequest's shapes, and faults of the grammar, alone and in each order.
		`{"v":1,"kind":"manager-service-authority","identities":{"serve":{"id":"x"}},"registrationProof":"p","processEpoch":0,
		"operation":"renew","small":-128,"tiny":255,"half":1.5e3,"session":[1,"2",{"3":null}],"any":{"a":[1,true,null]},
		"counts":{"a":1,"b":-2},"items":[],"nested":[{"id":"n"}],"lists":[[],["a"]],"raws":[1,{"x":2},"s",null]}`,
		"{}\n", `{"tags":[]}`, `{"meta":{}}`, `{"any":null}`, `{"any":1}`, `{"any":"s"}`,
		`{"kind":"a\"b\\c\/d\b\f\n\r\t"}`, `{"kind":"\u00e9\u4e2d\ud83d\ude00"}`, `{"kind":"\ud800"}`, `{"kind":"\udc00x"}`,
		`{"kind":"\ud800\ud800"}`, `{"kind":"\ud800\u0041"}`, `{"kind":"\u00"}`, `{"kind":"\x"}`,
		`{"kind":"` + "\x01" + `"}`, `{"kind":"` + "\x7f" + `"}`, `{"k\u0069nd":"x"}`, "{\"kind\":\"\xe2\x80\xa8\"}",
		`{"v":01}`, `{"v":-0}`, `{"v":-}`, `{"v":1.}`, `{"v":.5}`, `{"v":1e}`, `{"v":1E+2}`, `{"ratio":1e400}`,
		`{"ratio":-0.0e-0}`, `{"half":3.5e38}`, `{"small":128}`, `{"tiny":-1}`, `{"v":tru}`, `{"v":nul}`, `{"flag":fals}`,
		`{"v":1,}`, `{,"v":1}`, `{"v" 1}`, `{"v":1 "kind":"x"}`, `{"v":[1,]}`, `{"tags":["a",]}`, `{"tags":["a" "b"]}`,
		`{"v":1}}`, `{"bogus":{`, `{"v":null,"kind":`, `{'v':1}`, `{v:1}`, `{"v":1}` + "\x00", "\ufeff{}",
		`{"operation":"o","operation":"p"}`, `{"counts":{"a":"1"}}`, `{"nested":[null]}`, `{"lists":[["a",1]]}`,
		`{"raws":[}`, `{"session":{"a":}}`, `{"any":{"a":]}}`, `{"bogus":1,"v":"x"}`, `{"v":"x","bogus":1}`,
		`{"v":"x","v":1}`, `{"` + strings.Repeat("k", 100) + `":1}`, `{"meta":{"` + strings.Repeat("m", 100) + `":1}}`,
		`{"v":` + strings.Repeat("9", 100) + `}`, `{"tags":["a","b","c","d","e","f","g","h","i",1]}`,
	}
}

// fuzzTargets are the struct types bodies decode into: this package's test body of every shape,
// and the plane's request bodies.
var fuzzTargets = []func() any{
	func() any { return new(fault.TestBody) },
	func() any { return new(fault.TestRequest) },
	func() any { return new(client.ServiceAuthority) },
	func() any { return new(client.RunAdmission) },
	func() any { return new(client.RunAttempt) },
	func() any { return new(client.RunRevoke) },
	func() any { return new(client.RunStatus) },
}

// FuzzDecode checks fault.Decode, and fault.Within of its refusal, on any bytes, into every target type: a refusal is a
// bounded bad-request; an accepted body is one JSON object with only known keys, each once and
// none null, that encoding/json reads the same; and what fault.Encode writes of it decodes back to
// the same encoding (or is refused only for a null where an absent field was).
func FuzzDecode(f *testing.F) {
	for _, s := range seedBodies() {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		for _, target := range fuzzTargets {
			v := target()
			err := fault.Decode(data, v)
			raw := target()
			rawErr := fault.Within("request", fault.Decode(data, raw))
			if (err == nil) != (rawErr == nil) {
				t.Fatalf("Decode: %v; Within: %v; want both to agree", err, rawErr)
			}
			if err != nil {
				testkit.Refused(t, err, data)
				if f := testkit.Refused(t, rawErr, data); !strings.HasPrefix(f.Message, "field request") {
					t.Fatalf("Within: got %q, want a message naming the field request", f.Message)
				}
				continue
			}
			checkClosed(t, data, reflect.TypeOf(v).Elem())
			std := target()
			if err := json.Unmarshal(data, std); err != nil || !reflect.DeepEqual(std, v) {
				t.Fatalf("encoding/json reads the accepted body %q differently from fault.Decode (%v)", short(data), err)
			}
			enc, err := fault.Encode(v)
			if err != nil {
				t.Fatalf("fault.Encode of an accepted %T: %v", v, err)
			}
			if len(enc) > fault.MaxBytes { // the zero values of absent fields can take a body over the limit
				continue
			}
			again := target()
			if err := fault.Decode(enc, again); err != nil {
				if f := testkit.Refused(t, err, enc); !strings.Contains(f.Message, "null is not allowed") {
					t.Fatalf("the encoding %s of an accepted body is refused: %v", short(enc), err)
				}
				continue
			}
			if enc2, err := fault.Encode(again); err != nil || !bytes.Equal(enc, enc2) {
				t.Fatalf("round trip: got %s, %v; want %s", short(enc2), err, short(enc))
			}
		}
	})
}

// checkClosed checks an accepted body against t's keys, independently of Decode: one object
// whose every key is a field of t, spelled exactly, once, with no null value.
func checkClosed(tb testing.TB, data []byte, t reflect.Type) {
	tb.Helper()
	known := jsonFields(t)
	dec := json.NewDecoder(bytes.NewReader(data))
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		tb.Fatalf("accepted a body that is not an object: %q", short(data))
	}
	seen := map[string]bool{}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			tb.Fatalf("accepted a body whose keys do not read: %v", err)
		}
		key := tok.(string)
		if _, ok := known[key]; !ok || seen[key] {
			tb.Fatalf("accepted key %.80q of %s: known %v, seen before %v", key, t, ok, seen[key])
		}
		seen[key] = true
		var member json.RawMessage
		if err := dec.Decode(&member); err != nil || string(member) == "null" {
			tb.Fatalf("accepted member %q = %s (%v)", key, short(member), err)
		}
	}
	if _, err := dec.Token(); err != nil {
		tb.Fatalf("accepted a body that does not close: %v", err)
	}
	if _, err := dec.Token(); err == nil {
		tb.Fatalf("accepted a body with something after its object: %q", short(data))
	}
}

// jsonFields are the JSON keys of struct type t, with the fields of untagged embedded structs
// promoted as encoding/json promotes them.
func jsonFields(t reflect.Type) map[string]bool {
	out := map[string]bool{}
	for i := range t.NumField() {
		f := t.Field(i)
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		ft := f.Type
		for ft.Kind() == reflect.Pointer {
			ft = ft.Elem()
		}
		switch {
		case f.Anonymous && name == "" && ft.Kind() == reflect.Struct:
			for k := range jsonFields(ft) {
				out[k] = true
			}
		case f.IsExported() && name != "-":
			out[cmp.Or(name, f.Name)] = true
		}
	}
	return out
}

// FuzzPeek checks fault.Peek of the keys the plane dispatches on: a refusal is a bounded
// bad-request; what it reads is what encoding/json reads of that member of an object.
func FuzzPeek(f *testing.F) {
	for _, s := range seedBodies() {
		f.Add([]byte(s), false)
	}
	f.Add([]byte(`{"actor":"cli","kind":"x"}`), true)
	f.Add([]byte(`{"actor":7}`), true)
	f.Fuzz(func(t *testing.T, data []byte, actor bool) {
		key := "kind"
		if actor {
			key = "actor"
		}
		got, err := fault.Peek(data, key)
		if err != nil {
			testkit.Refused(t, err, data)
			return
		}
		var members map[string]json.RawMessage
		if err := json.Unmarshal(data, &members); err != nil || members == nil {
			t.Fatalf("fault.Peek read %.80q from a body that is not an object: %q", got, short(data))
		}
		var want string
		if raw, ok := members[key]; ok {
			if err := json.Unmarshal(raw, &want); err != nil {
				t.Fatalf("fault.Peek read %.80q from a member that is not a string: %s", got, short(raw))
			}
		}
		if got != want {
			t.Fatalf("fault.Peek(%q): got %.80q, want %.80q", key, got, want)
		}
		if len(data) > fault.MaxBytes {
			t.Fatalf("fault.Peek read a body of %d bytes, over the limit", len(data))
		}
	})
}

// short is at most 200 bytes of b, for a failure's message.
func short(b []byte) string { return fault.Clip(string(b), 200) }
