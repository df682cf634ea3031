package fault

// Request bodies and the plane's stored rows are decoded as closed JSON: exactly the
// keys the target struct names, each once and of its type, nothing else. The parse is
// github.com/go-json-experiment/json (encoding/json/v2), which matches keys case-sensitively and
// refuses a duplicate name; this package adds the unknown-key and null refusals, and turns its
// errors into refusals in the words of docs/PROTOCOL.md ("Bodies"): every one a
// BadRequest, naming the field.

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"unicode/utf8"

	jsonv2 "github.com/go-json-experiment/json"
	"github.com/go-json-experiment/json/jsontext"
)

// MaxBytes is the largest body the plane reads.
const MaxBytes = 64 << 10

// maxRow is the largest row any bucket can hold: the largest message NATS allows (max_payload's
// ceiling). A row type whose size grows with a flag bounds the flag by it, or by the broker's
// own max_payload, which is smaller.
const maxRow = 64 << 20

// errNull marks a null where a value of the field's type belongs.
var errNull = errors.New("null")

// closed are the options of every parse: an unknown key is an error. v2 refuses a duplicate
// name and matches names case-sensitively by default. The body's UTF-8 is checked before the
// parse, so what AllowInvalidUTF8 still allows is an escaped surrogate that pairs with no other:
// read as U+FFFD, as encoding/json reads it.
var closed = jsonv2.JoinOptions(jsonv2.RejectUnknownMembers(true), jsontext.AllowInvalidUTF8(true))

// closedNoNull adds the refusal of a null, which v2 would otherwise read as "leave the value as
// it is". Its check runs on every value, so it is used only on a body that holds the word null.
var closedNoNull = jsonv2.JoinOptions(closed, jsonv2.WithUnmarshalers(jsonv2.UnmarshalFromFunc(func(dec *jsontext.Decoder, _ any) error {
	if dec.PeekKind() == 'n' {
		return errNull
	}
	return errors.ErrUnsupported
})))

// Decode parses data into v, a pointer to a struct whose fields carry `json` tags. It refuses a
// body over MaxBytes, anything that is not one JSON object, invalid UTF-8, an unknown or
// duplicate key (matched case-sensitively, unlike encoding/json), a null, and a value of the
// wrong type. Fields of type json.RawMessage are left for the caller to parse. Presence is the
// caller's to check: use pointer fields where absent and zero differ. A body that is not JSON is
// refused as such even when a field before the fault would be refused.
func Decode(data []byte, v any) error { return decode(data, v, MaxBytes) }

// DecodeRow parses the stored row data into v, closed as a request body is, and refuses a row over
// limit bytes. A row is not a request: the plane wrote it, and some grow with a flag (an owner's
// instances with --max-instances-per-owner), so each row type has a limit of its own, at most
// maxRow. Its error is a plain error about the row, never a refusal: a row that does not decode
// is the plane's fault, not the caller's.
func DecodeRow(data []byte, v any, limit int) error {
	err := decode(data, v, limit)
	var f *Error
	if errors.As(err, &f) {
		return fmt.Errorf("stored row: %s", strings.Replace(f.Message, "body is", "row is", 1))
	}
	return err
}

func decode(data []byte, v any, limit int) error {
	if err := outer(data, limit); err != nil {
		return err
	}
	if rv := reflect.ValueOf(v); rv.Kind() != reflect.Pointer || rv.Elem().Kind() != reflect.Struct {
		return fmt.Errorf("fault.Decode needs a pointer to a struct, got %T", v)
	}
	opts := closed
	if bytes.Contains(data, []byte("null")) { // a null can be spelled no other way
		opts = closedNoNull
	}
	err := jsonv2.Unmarshal(data, v, opts)
	if err == nil {
		return nil
	}
	if !grammatical(data) {
		return notJSON() // a fault past the refused field: the grammar comes first
	}
	var syn *jsontext.SyntacticError
	if errors.As(err, &syn) && errors.Is(syn.Err, jsontext.ErrDuplicateName) {
		return Field(at(data, syn.JSONPointer), "duplicate key")
	}
	var sem *jsonv2.SemanticError
	if !errors.As(err, &sem) {
		return notJSON()
	}
	switch {
	case sem.JSONPointer == "":
		return New(BadRequest, "body is not a JSON object")
	case sem.Err == jsonv2.ErrUnknownName:
		return Field(at(data, sem.JSONPointer), "unknown field")
	case errors.Is(sem.Err, errNull):
		return Field(at(data, sem.JSONPointer), "null is not allowed; leave the field out")
	case sem.GoType == nil || sem.JSONKind == 0:
		return fmt.Errorf("body: %w", err) // a Go type this package cannot fill: a programming error
	}
	want, got := kindName(sem.GoType), kindNames[sem.JSONKind]
	if got == "a number" && isNumber(sem.GoType) {
		got = "the number " + Clip(string(sem.JSONValue), MaxQuote)
	}
	return Field(at(data, sem.JSONPointer), "want %s, got %s", want, got)
}

// outer applies the checks every body gets before it is parsed: its size and its UTF-8.
func outer(data []byte, limit int) error {
	if len(data) > limit {
		return New(BadRequest, "body is %d bytes, over the limit of %d", len(data), limit)
	}
	if !utf8.Valid(data) {
		return New(BadRequest, "body is not valid UTF-8")
	}
	return nil
}

// grammatical reports whether data is one JSON value, its names repeated or not.
func grammatical(data []byte) bool {
	return jsontext.Value(data).IsValid(jsontext.AllowDuplicateNames(true), jsontext.AllowInvalidUTF8(true))
}

func notJSON() *Error { return New(BadRequest, "body is not JSON") }

// at spells the JSON pointer p into data as a refusal names a field: `identities.serve.id`,
// `items[1].zz`, a caller's key cut to MaxQuote bytes. It reads data to tell an array's
// index from an object's key.
func at(data []byte, p jsontext.Pointer) string {
	dec := jsontext.NewDecoder(bytes.NewReader(data), jsontext.AllowDuplicateNames(true), jsontext.AllowInvalidUTF8(true))
	var path strings.Builder
	for name := range p.Tokens() {
		open, err := dec.ReadToken()
		if err == nil && open.Kind() == '[' {
			path.WriteString("[" + name + "]")
			n, _ := strconv.Atoi(name)
			for range n {
				_ = dec.SkipValue()
			}
			continue
		}
		if path.Len() > 0 {
			path.WriteByte('.')
		}
		path.WriteString(Clip(name, MaxQuote))
		for err == nil && open.Kind() == '{' {
			var key jsontext.Token
			if key, err = dec.ReadToken(); err != nil || key.Kind() != '"' || key.String() == name {
				break
			}
			err = dec.SkipValue()
		}
	}
	return path.String()
}

// kindNames are the JSON kinds as a refusal names what the caller sent.
var kindNames = map[jsontext.Kind]string{
	'"': "a string", '0': "a number", 't': "a boolean", 'f': "a boolean", '{': "an object", '[': "an array", 'n': "null",
}

func isNumber(t reflect.Type) bool {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	return t.Kind() >= reflect.Int && t.Kind() <= reflect.Float64
}

func kindName(t reflect.Type) string {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	switch t.Kind() {
	case reflect.String:
		return "a string"
	case reflect.Bool:
		return "a boolean"
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		return "an integer"
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return "a non-negative integer"
	case reflect.Float32, reflect.Float64:
		return "a number"
	case reflect.Slice, reflect.Array:
		return "an array"
	case reflect.Struct, reflect.Map:
		return "an object"
	}
	return t.String()
}

// Within returns a bad-request refusal err about a value nested at path of a larger body, with
// path prefixed to the field it names; any other error comes back as it is.
func Within(path string, err error) error {
	var f *Error
	if errors.As(err, &f) && f.Code == BadRequest && path != "" {
		if rest, ok := strings.CutPrefix(f.Message, "field "); ok {
			return New(f.Code, "field %s.%s", path, rest)
		}
		return New(f.Code, "field %s: %s", path, strings.TrimPrefix(f.Message, "body is "))
	}
	return err
}

// Peek returns the string member key of a JSON object body, for dispatching on it before the
// closed parse. It applies Decode's outer checks (size, UTF-8, JSON, an object) and matches key
// exactly; when the key repeats, the last one counts (the closed parse refuses the repeat). A
// missing key is "", a non-string one a refusal.
func Peek(data []byte, key string) (string, error) {
	if err := outer(data, MaxBytes); err != nil {
		return "", err
	}
	dec := peekers.Get().(*jsontext.Decoder)
	defer peekers.Put(dec)
	defer dec.Reset(new(bytes.Buffer)) // not to keep data alive in the pool
	dec.Reset(bytes.NewBuffer(data), jsontext.AllowDuplicateNames(true), jsontext.AllowInvalidUTF8(true))
	if dec.PeekKind() != '{' {
		if grammatical(data) {
			return "", New(BadRequest, "body is not a JSON object")
		}
		return "", notJSON()
	}
	var val string
	var found, str bool
	_, err := dec.ReadToken() // '{'
	for err == nil && dec.PeekKind() == '"' {
		var name jsontext.Value
		if name, err = dec.ReadValue(); err != nil {
			break
		}
		if !isName(name, key) {
			err = dec.SkipValue()
			continue
		}
		if found, str = true, dec.PeekKind() == '"'; !str {
			err = dec.SkipValue()
			continue
		}
		var tok jsontext.Token
		tok, err = dec.ReadToken()
		val = tok.String()
	}
	if err == nil {
		_, err = dec.ReadToken() // '}'
	}
	if err == nil {
		if _, end := dec.ReadToken(); end != io.EOF {
			err = errors.New("data after the object")
		}
	}
	switch {
	case err != nil:
		return "", notJSON()
	case found && !str:
		return "", Field(key, "want a string")
	}
	return val, nil
}

// peekers are Peek's decoders, reused: a decoder is larger than a body.
var peekers = sync.Pool{New: func() any { return new(jsontext.Decoder) }}

// isName reports whether the quoted name is key, escaped or not.
func isName(name jsontext.Value, key string) bool {
	if bytes.IndexByte(name, '\\') < 0 {
		return len(name) == len(key)+2 && string(name[1:len(name)-1]) == key
	}
	unquoted, err := jsontext.AppendUnquote(nil, name)
	return err == nil && string(unquoted) == key
}

// Encode marshals v as JSON without HTML escaping: a `<` a caller sent stays one byte in a
// reply or a record, not six.
func Encode(v any) ([]byte, error) {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return nil, err
	}
	return bytes.TrimSuffix(b.Bytes(), []byte{'\n'}), nil
}
