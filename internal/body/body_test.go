package body

import (
	"encoding/json"
	"errors"
	"reflect"
	"strings"
	"testing"

	"github.com/cotal-ai/authplane/internal/fault"
)

type testIdentity struct {
	ID string `json:"id"`
}

type testIdentities struct {
	Supervisor *testIdentity `json:"supervisor,omitempty"`
	Serve      testIdentity  `json:"serve"`
}

type testItem struct {
	ID    string `json:"id"`
	Count int    `json:"count"`
}

// testBody exercises every shape a request body has: scalars of each kind, a nested object,
// optional pointers, arrays of scalars and of objects, a map and a raw member.
type testBody struct {
	V          int               `json:"v"`
	Kind       string            `json:"kind"`
	Count      uint32            `json:"count"`
	Epoch      uint64            `json:"epoch"`
	Ratio      float64           `json:"ratio"`
	Flag       bool              `json:"flag"`
	Optional   *string           `json:"optional,omitempty"`
	Identities testIdentities    `json:"identities"`
	Tags       []string          `json:"tags"`
	Items      []testItem        `json:"items"`
	Meta       map[string]string `json:"meta"`
	Request    json.RawMessage   `json:"request"`
	Skipped    string            `json:"-"`
}

func TestDecodeAcceptsAClosedBodyOfEveryShape(t *testing.T) {
	data := `{"v":1,"kind":"k","count":7,"epoch":18446744073709551615,"ratio":0.5,"flag":true,"optional":"o",
		"identities":{"supervisor":{"id":"S"},"serve":{"id":"X"}},"tags":["a","b"],"items":[{"id":"i","count":-2}],
		"meta":{"Any-Key":"v"},"request":{"whatever":[1,{"x":null}]}}`
	var got testBody
	if err := Decode([]byte(data), &got); err != nil {
		t.Fatalf("Decode: got %v, want nil", err)
	}
	o := "o"
	want := testBody{
		V: 1, Kind: "k", Count: 7, Epoch: 18446744073709551615, Ratio: 0.5, Flag: true, Optional: &o,
		Identities: testIdentities{Supervisor: &testIdentity{ID: "S"}, Serve: testIdentity{ID: "X"}},
		Tags:       []string{"a", "b"},
		Items:      []testItem{{ID: "i", Count: -2}},
		Meta:       map[string]string{"Any-Key": "v"},
		Request:    json.RawMessage(`{"whatever":[1,{"x":null}]}`),
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("Decode: got %+v, want %+v", got, want)
	}
}

func TestDecodeAcceptsAbsentFieldsAndAnEmptyObject(t *testing.T) {
	var got testBody
	if err := Decode([]byte(` { } `), &got); err != nil {
		t.Fatalf("Decode: got %v, want nil", err)
	}
	if !reflect.DeepEqual(got, testBody{}) {
		t.Errorf("Decode: got %+v, want the zero value", got)
	}
}

func TestDecodeRefusesAnythingButAClosedBodyNamingTheField(t *testing.T) {
	tests := []struct {
		name string
		data string
		// field is what the message must name; "" for a refusal of the whole body.
		field string
	}{
		{"unknown key", `{"v":1,"bogus":1}`, "bogus"},
		{"unknown nested key", `{"identities":{"serve":{"id":"x","nope":1}}}`, "identities.serve.nope"},
		{"unknown key in an array element", `{"items":[{"id":"x"},{"id":"y","zz":1}]}`, "items[1].zz"},
		{"key differing only in case", `{"Kind":"x"}`, "Kind"},
		{"nested key differing only in case", `{"identities":{"serve":{"ID":"x"}}}`, "identities.serve.ID"},
		{"the name of a json:\"-\" field", `{"Skipped":"x"}`, "Skipped"},
		{"duplicate key", `{"v":1,"v":2}`, "v"},
		{"duplicate key spelled with an escape", `{"kind":"a","k\u0069nd":"b"}`, "kind"},
		{"duplicate nested key", `{"identities":{"serve":{"id":"a","id":"b"}}}`, "identities.serve.id"},
		{"duplicate map key", `{"meta":{"a":"1","a":"2"}}`, "meta.a"},
		{"null", `{"kind":null}`, "kind"},
		{"null for an optional field", `{"optional":null}`, "optional"},
		{"null nested", `{"identities":{"serve":{"id":null}}}`, "identities.serve.id"},
		{"null for an object", `{"identities":{"supervisor":null}}`, "identities.supervisor"},
		{"null in an array", `{"tags":["a",null]}`, "tags[1]"},
		{"null for a raw member", `{"request":null}`, "request"},
		{"string for a number", `{"v":"1"}`, "v"},
		{"number for a string", `{"kind":1}`, "kind"},
		{"boolean for a string", `{"kind":true}`, "kind"},
		{"string for a boolean", `{"flag":"true"}`, "flag"},
		{"object for a string", `{"identities":{"serve":{"id":{}}}}`, "identities.serve.id"},
		{"array for a string", `{"kind":["x"]}`, "kind"},
		{"array for an object", `{"identities":[]}`, "identities"},
		{"string for an object", `{"identities":"x"}`, "identities"},
		{"object for an array", `{"tags":{}}`, "tags"},
		{"float for an integer", `{"v":1.5}`, "v"},
		{"exponent for an integer", `{"v":1e3}`, "v"},
		{"negative for an unsigned", `{"count":-1}`, "count"},
		{"overflow of an unsigned", `{"count":4294967296}`, "count"},
		{"overflow of a uint64", `{"epoch":18446744073709551616}`, "epoch"},
		{"wrong type nested", `{"identities":{"serve":{"id":7}}}`, "identities.serve.id"},
		{"wrong type in a map", `{"meta":{"a":1}}`, "meta.a"},
		{"not JSON", `{"v":`, ""},
		{"not JSON at all", `hello`, ""},
		{"empty", ``, ""},
		{"trailing garbage", `{"v":1} x`, ""},
		{"two objects", `{"v":1}{"v":2}`, ""},
		{"top-level array", `[{"v":1}]`, ""},
		{"top-level string", `"x"`, ""},
		{"top-level null", `null`, ""},
		{"top-level number", `1`, ""},
		{"invalid UTF-8 in a value", "{\"kind\":\"\xff\"}", ""},
		{"invalid UTF-8 in a key", "{\"\xc3\x28\":1}", ""},
		{"over 64 KiB", `{"kind":"` + strings.Repeat("x", MaxBytes) + `"}`, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var v testBody
			err := Decode([]byte(tt.data), &v)
			checkBadRequest(t, err, tt.field)
		})
	}
}

// checkBadRequest checks err is a bad-request refusal whose message names field (as
// "field <path>:"), or, for field "", names no field.
func checkBadRequest(t *testing.T, err error, field string) {
	t.Helper()
	var f *fault.Error
	if !errors.As(err, &f) {
		t.Fatalf("got %v (%T), want a *fault.Error", err, err)
	}
	if f.Code != fault.BadRequest {
		t.Errorf("got code %q, want %q", f.Code, fault.BadRequest)
	}
	if field == "" {
		if f.Message == "" {
			t.Errorf("got an empty message, want one")
		}
		return
	}
	if want := "field " + field + ":"; !strings.HasPrefix(f.Message, want) {
		t.Errorf("got message %q, want it to start %q", f.Message, want)
	}
}

// A wrong type inside an array must name the element the way every other refusal does
// (`items[1].zz` for an unknown key, `tags[1]` for a null), not just the array.
func TestDecodeNamesTheArrayElementOfAWrongType(t *testing.T) {
	tests := []struct {
		name  string
		data  string
		field string
	}{
		{"in an array of strings", `{"tags":["a",2]}`, "tags[1]"},
		{"in an array of objects", `{"items":[{"id":"x","count":1},{"id":"y","count":"1"}]}`, "items[1].count"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var v testBody
			checkBadRequest(t, Decode([]byte(tt.data), &v), tt.field)
		})
	}
}

func TestDecodeAllowsABodyOfExactlyTheLimit(t *testing.T) {
	prefix, suffix := `{"kind":"`, `"}`
	data := prefix + strings.Repeat("x", MaxBytes-len(prefix)-len(suffix)) + suffix
	if len(data) != MaxBytes {
		t.Fatalf("test body is %d bytes, want %d", len(data), MaxBytes)
	}
	var v testBody
	if err := Decode([]byte(data), &v); err != nil {
		t.Errorf("Decode of exactly %d bytes: got %v, want nil", MaxBytes, err)
	}
	over := prefix + strings.Repeat("x", MaxBytes-len(prefix)-len(suffix)+1) + suffix
	checkBadRequest(t, Decode([]byte(over), &v), "")
}

func TestDecodeRawPrefixesTheFieldPath(t *testing.T) {
	tests := []struct {
		name  string
		raw   string
		field string
	}{
		{"unknown key", `{"bogus":1}`, "request.bogus"},
		{"nested wrong type", `{"identities":{"serve":{"id":1}}}`, "request.identities.serve.id"},
		{"not an object", `[1]`, "request"},
		{"not JSON", `{`, "request"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var v testBody
			checkBadRequest(t, DecodeRaw("request", json.RawMessage(tt.raw), &v), tt.field)
		})
	}
}

func TestDecodeNeedsAPointerToAStruct(t *testing.T) {
	var m map[string]any
	err := Decode([]byte(`{}`), &m)
	if err == nil {
		t.Fatalf("Decode into %T: got nil, want an error", &m)
	}
	if fault.CodeOf(err) != fault.Internal {
		t.Errorf("Decode into %T: got code %q, want a programming error (internal), not a refusal", &m, fault.CodeOf(err))
	}
}

func TestPeekReadsOneStringMember(t *testing.T) {
	tests := []struct {
		name  string
		data  string
		want  string
		field string // "" with refused: a whole-body refusal
		ok    bool
	}{
		{"present", `{"kind":"manager-service-authority","x":1}`, "manager-service-authority", "", true},
		{"absent", `{"x":1}`, "", "", true},
		{"not a string", `{"kind":1}`, "", "kind", false},
		{"case differs", `{"Kind":"x"}`, "", "", true},
		{"not an object", `[]`, "", "", false},
		{"null", `null`, "", "", false},
		{"null with spaces", " null\n", "", "", false},
		{"not JSON", `{`, "", "", false},
		{"invalid UTF-8", "{\"kind\":\"\xff\"}", "", "", false},
		{"over 64 KiB", `{"kind":"` + strings.Repeat("x", MaxBytes) + `"}`, "", "", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := Peek([]byte(tt.data), "kind")
			if tt.ok {
				if err != nil || got != tt.want {
					t.Errorf("Peek: got %q, %v; want %q, nil", got, err, tt.want)
				}
				return
			}
			checkBadRequest(t, err, tt.field)
			if tt.name == "null" || tt.name == "null with spaces" {
				if msg := fault.As(err).Message; msg != "body is not a JSON object" {
					t.Errorf("got %q, want \"body is not a JSON object\"", msg)
				}
			}
		})
	}
}
