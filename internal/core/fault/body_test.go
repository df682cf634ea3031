package fault

import (
	"encoding/json"
	"errors"
	"reflect"
	"strings"
	"testing"
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

// TestBody and TestRequest let the fuzz targets, an external test, use the shapes below.
type (
	TestBody    = testBody
	TestRequest = testRequest
)

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

// accepted is a body of testBody with every field.
const accepted = `{"v":1,"kind":"k","count":7,"epoch":18446744073709551615,"ratio":0.5,"flag":true,"optional":"o",
		"identities":{"supervisor":{"id":"S"},"serve":{"id":"X"}},"tags":["a","b"],"items":[{"id":"i","count":-2}],
		"meta":{"Any-Key":"v"},"request":{"whatever":[1,{"x":null}]}}`

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

// TestInner is exported: neither encoding/json nor v2 can allocate an embedded pointer to an
// unexported struct.
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

func TestDecodeAcceptsAClosedBodyOfEveryShape(t *testing.T) {
	var got testBody
	if err := Decode([]byte(accepted), &got); err != nil {
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

// What Decode accepts it reads as encoding/json reads it: promoted and shadowed fields, raw
// members byte for byte, numbers of every width, escapes, and an escaped surrogate that pairs
// with no other as U+FFFD.
func TestDecodeReadsWhatItAcceptsAsEncodingJSONDoes(t *testing.T) {
	for _, data := range []string{
		`{"v":1,"kind":"manager-service-authority","identities":{"serve":{"id":"x"}},"registrationProof":"p","processEpoch":0,
		"operation":"renew","small":-128,"tiny":255,"half":1.5e3,"session":[1,"2",{"3":null}],"any":{"a":[1,true]},
		"counts":{"a":1,"b":-2},"items":[],"nested":[{"id":"n"}],"lists":[[],["a"]],"raws":[1,{"x":2},"s"]}`,
		`{"kind":"a\"b\\c\/d\b\f\n\r\t"}`, `{"kind":"\u00e9\u4e2d\ud83d\ude00"}`, `{"kind":"\ud800"}`, `{"kind":"\udc00x"}`,
		`{"kind":"\ud800\ud800"}`, `{"kind":"\ud800\u0041"}`, "\t\r\n {\"v\" :\t-0 } \n", `{"half":-0.0e-0}`, `{"items":[],"lists":[]}`, `{"kind":"null","session":[null]}`,
	} {
		got, want := new(testRequest), new(testRequest)
		if err := Decode([]byte(data), got); err != nil {
			t.Fatalf("%q: got %v, want nil", data, err)
		}
		if err := json.Unmarshal([]byte(data), want); err != nil || !reflect.DeepEqual(got, want) {
			t.Errorf("%q: got %+v, encoding/json %+v (%v)", data, got, want, err)
		}
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

// The refusals are the texts of docs/PROTOCOL.md ("Refusals every endpoint may answer"), word
// for word: the parse is the library's, the words are the plane's.
func TestDecodeRefusesAnythingButAClosedBodyNamingTheField(t *testing.T) {
	deep := func(n int) string { return strings.Repeat("[", n) + strings.Repeat("]", n) }
	tests := []struct {
		name string
		data string
		want string
	}{
		{"unknown key", `{"v":1,"bogus":1}`, "field bogus: unknown field"},
		{"unknown nested key", `{"identities":{"serve":{"id":"x","nope":1}}}`, "field identities.serve.nope: unknown field"},
		{"unknown key in an array element", `{"items":[{"id":"x"},{"id":"y","zz":1}]}`, "field items[1].zz: unknown field"},
		{"key differing only in case", `{"Kind":"x"}`, "field Kind: unknown field"},
		{"nested key differing only in case", `{"identities":{"serve":{"ID":"x"}}}`, "field identities.serve.ID: unknown field"},
		{"the name of a json:\"-\" field", `{"Skipped":"x"}`, "field Skipped: unknown field"},
		{"unknown key of digits", `{"0":1}`, "field 0: unknown field"},
		{"unknown key, cut", `{"` + strings.Repeat("k", 100) + `":1}`, "field " + strings.Repeat("k", 61) + "…: unknown field"},
		{"duplicate key", `{"v":1,"v":2}`, "field v: duplicate key"},
		{"duplicate key spelled with an escape", `{"kind":"a","k\u0069nd":"b"}`, "field kind: duplicate key"},
		{"duplicate nested key", `{"identities":{"serve":{"id":"a","id":"b"}}}`, "field identities.serve.id: duplicate key"},
		{"duplicate map key", `{"meta":{"a":"1","a":"2"}}`, "field meta.a: duplicate key"},
		{"null", `{"kind":null}`, "field kind: null is not allowed; leave the field out"},
		{"null for an optional field", `{"optional":null}`, "field optional: null is not allowed; leave the field out"},
		{"null nested", `{"identities":{"serve":{"id":null}}}`, "field identities.serve.id: null is not allowed; leave the field out"},
		{"null for an object", `{"identities":{"supervisor":null}}`, "field identities.supervisor: null is not allowed; leave the field out"},
		{"null in an array", `{"tags":["a",null]}`, "field tags[1]: null is not allowed; leave the field out"},
		{"null for a raw member", `{"request":null}`, "field request: null is not allowed; leave the field out"},
		{"string for a number", `{"v":"1"}`, "field v: want an integer, got a string"},
		{"number for a string", `{"kind":1}`, "field kind: want a string, got a number"},
		{"boolean for a string", `{"kind":true}`, "field kind: want a string, got a boolean"},
		{"string for a boolean", `{"flag":"true"}`, "field flag: want a boolean, got a string"},
		{"object for a string", `{"identities":{"serve":{"id":{}}}}`, "field identities.serve.id: want a string, got an object"},
		{"array for a string", `{"kind":["x"]}`, "field kind: want a string, got an array"},
		{"array for an object", `{"identities":[]}`, "field identities: want an object, got an array"},
		{"string for an object", `{"identities":"x"}`, "field identities: want an object, got a string"},
		{"object for an array", `{"tags":{}}`, "field tags: want an array, got an object"},
		{"float for an integer", `{"v":1.5}`, "field v: want an integer, got the number 1.5"},
		{"exponent for an integer", `{"v":1e3}`, "field v: want an integer, got the number 1e3"},
		{"negative for an unsigned", `{"count":-1}`, "field count: want a non-negative integer, got the number -1"},
		{"overflow of an unsigned", `{"count":4294967296}`, "field count: want a non-negative integer, got the number 4294967296"},
		{"overflow of a uint64", `{"epoch":18446744073709551616}`, "field epoch: want a non-negative integer, got the number 18446744073709551616"},
		{"overflow of a float64", `{"ratio":1e400}`, "field ratio: want a number, got the number 1e400"},
		{"overflow, cut", `{"v":` + strings.Repeat("9", 100) + `}`, "field v: want an integer, got the number " + strings.Repeat("9", 61) + "…"},
		{"wrong type nested", `{"identities":{"serve":{"id":7}}}`, "field identities.serve.id: want a string, got a number"},
		{"wrong type in a map", `{"meta":{"a":1}}`, "field meta.a: want a string, got a number"},
		{"wrong type under a key of digits", `{"meta":{"0":1}}`, "field meta.0: want a string, got a number"},
		{"not JSON", `{"v":`, "body is not JSON"},
		{"not JSON at all", `hello`, "body is not JSON"},
		{"empty", ``, "body is not JSON"},
		{"trailing garbage", `{"v":1} x`, "body is not JSON"},
		{"two objects", `{"v":1}{"v":2}`, "body is not JSON"},
		{"unknown key, then not JSON", `{"bogus":1,`, "body is not JSON"},
		{"wrong type, then not JSON", `{"v":"x"} {`, "body is not JSON"},
		{"duplicate key, then not JSON", `{"v":1,"v":2,}`, "body is not JSON"},
		{"nested deeper than 10,000", `{"request":` + deep(10000) + `}`, "body is not JSON"},
		{"top-level array", `[{"v":1}]`, "body is not a JSON object"},
		{"top-level string", `"x"`, "body is not a JSON object"},
		{"top-level null", `null`, "body is not a JSON object"},
		{"top-level number", `1`, "body is not a JSON object"},
		{"top-level array too deep", deep(10001), "body is not JSON"},
		{"invalid UTF-8 in a value", "{\"kind\":\"\xff\"}", "body is not valid UTF-8"},
		{"invalid UTF-8 in a key", "{\"\xc3\x28\":1}", "body is not valid UTF-8"},
		{"over 64 KiB", `{"kind":"` + strings.Repeat("x", MaxBytes) + `"}`, "body is 65547 bytes, over the limit of 65536"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var v testBody
			f := checkBadRequest(t, Decode([]byte(tt.data), &v), "")
			if f.Message != tt.want {
				t.Errorf("got %q, want %q", f.Message, tt.want)
			}
		})
	}
}

// checkBadRequest checks err is a bad-request refusal whose message names field (as
// "field <path>:"), or, for field "", any message, and returns it.
func checkBadRequest(t *testing.T, err error, field string) *Error {
	t.Helper()
	var f *Error
	if !errors.As(err, &f) {
		t.Fatalf("got %v (%T), want a *Error", err, err)
	}
	if f.Code != BadRequest {
		t.Errorf("got code %q, want %q", f.Code, BadRequest)
	}
	if want := "field " + field + ":"; field != "" && !strings.HasPrefix(f.Message, want) {
		t.Errorf("got message %q, want it to start %q", f.Message, want)
	}
	return f
}

// A body cut anywhere is not JSON, whatever its valid part already held.
func TestDecodeRefusesEveryCutOfABodyAsNotJSON(t *testing.T) {
	for _, data := range []string{accepted, `{"identities":{"serve":{"id":"x"}},"meta":{"a":"1"},"tags":[]}`, `{"kind":"\u00e9\ud83d\ude00"}`} {
		for i := range len(data) {
			var v testBody
			if f := checkBadRequest(t, Decode([]byte(data[:i]), &v), ""); f.Message != "body is not JSON" {
				t.Errorf("%q: got %q, want \"body is not JSON\"", data[:i], f.Message)
			}
		}
	}
}

// Nesting is bounded as encoding/json bounds it: 10,000 levels.
func TestDecodeAcceptsNestingTo10000Levels(t *testing.T) {
	var v testBody
	if err := Decode([]byte(`{"request":`+strings.Repeat("[", 9999)+strings.Repeat("]", 9999)+`}`), &v); err != nil {
		t.Fatalf("got %v, want nil", err)
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

func TestWithinPrefixesTheFieldPath(t *testing.T) {
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
			checkBadRequest(t, Within("request", Decode([]byte(tt.raw), &v)), tt.field)
		})
	}
}

// A stored row is closed as a body is, under its own limit, and what is wrong with it is a plain
// error about the row: the plane wrote it, so it is never a caller's refusal.
func TestDecodeRowIsClosedUnderItsLimitAndNeverARefusal(t *testing.T) {
	var v testBody
	if err := DecodeRow([]byte(`{"kind":"`+strings.Repeat("x", MaxBytes)+`"}`), &v, maxRow); err != nil {
		t.Fatalf("a row over a body's limit, under its own: got %v, want nil", err)
	}
	for data, want := range map[string]string{
		`{"kind":"xxxxxx"}`: "stored row: row is 17 bytes, over the limit of 16",
		`{"bogus":1}`:       "stored row: field bogus: unknown field",
		`[]`:                "stored row: row is not a JSON object",
		`{`:                 "stored row: row is not JSON",
	} {
		err := DecodeRow([]byte(data), &testBody{}, 16)
		if err == nil || err.Error() != want || errors.As(err, new(*Error)) {
			t.Errorf("%s: got %v (%T), want the plain error %q", data, err, err, want)
		}
	}
}

func TestDecodeNeedsAPointerToAStruct(t *testing.T) {
	var m map[string]any
	err := Decode([]byte(`{}`), &m)
	if err == nil {
		t.Fatalf("Decode into %T: got nil, want an error", &m)
	}
	if CodeOf(err) != Internal {
		t.Errorf("Decode into %T: got code %q, want a programming error (internal), not a refusal", &m, CodeOf(err))
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
		{"trailing data", `{"kind":"x"} x`, "", "", false},
		{"two objects", `{"kind":"x"}{}`, "", "", false},
		{"repeated: the last", `{"kind":"x","kind":"y"}`, "y", "", true},
		{"spelled with an escape", `{"k\u0069nd":"x"}`, "x", "", true},
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
				if msg := As(err).Message; msg != "body is not a JSON object" {
					t.Errorf("got %q, want \"body is not a JSON object\"", msg)
				}
			}
		})
	}
}
