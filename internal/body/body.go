// Package body decodes request bodies as closed JSON: exactly the keys the target struct
// names, each of its type, nothing else. Every refusal is a fault.BadRequest naming the field.
package body

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"unicode/utf8"

	"github.com/cotal-ai/authplane/internal/fault"
)

// MaxBytes is the largest body the plane reads.
const MaxBytes = 64 << 10

var rawType = reflect.TypeFor[json.RawMessage]()

// Decode parses data into v, a pointer to a struct whose fields carry `json` tags. It refuses a
// body over MaxBytes, anything that is not one JSON object, invalid UTF-8, an unknown or
// duplicate key (matched case-sensitively, unlike encoding/json), a null, and a value of the
// wrong type. Fields of type json.RawMessage are left for the caller to parse. Presence is the
// caller's to check: use pointer fields where absent and zero differ.
//
// It reads the body in one pass (after a check of its UTF-8), checking the JSON grammar, the
// closed schema and the types as it fills v. A body that is not JSON is refused as such even
// when a field before the fault was already refused: only then is the body read a second time.
func Decode(data []byte, v any) error { return DecodeLimit(data, v, MaxBytes) }

// DecodeLimit is Decode with limit bytes for MaxBytes: for a stored row, which the plane wrote
// and whose size its type bounds (package rows).
func DecodeLimit(data []byte, v any, limit int) error {
	if err := outer(data, limit); err != nil {
		return err
	}
	rv := reflect.ValueOf(v)
	if rv.Kind() != reflect.Pointer || rv.Elem().Kind() != reflect.Struct {
		return fmt.Errorf("body.Decode needs a pointer to a struct, got %T", v)
	}
	d := decoder{data: data}
	err := d.top(func() error {
		if d.data[d.pos] != '{' {
			return errNotObject
		}
		return d.object(rv.Elem())
	})
	switch {
	case err == nil:
		return nil
	case errors.Is(err, errSyntax):
		return notJSON()
	case errors.Is(err, errNotObject):
		return fault.New(fault.BadRequest, "body is not a JSON object")
	case !json.Valid(data):
		return notJSON() // a fault past the refused field: the grammar comes first
	}
	return err
}

// outer applies the checks every body gets before it is read: its size and its UTF-8.
func outer(data []byte, limit int) error {
	if len(data) > limit {
		return fault.New(fault.BadRequest, "body is %d bytes, over the limit of %d", len(data), limit)
	}
	if !utf8.Valid(data) {
		return fault.New(fault.BadRequest, "body is not valid UTF-8")
	}
	return nil
}

func notJSON() *fault.Error { return fault.New(fault.BadRequest, "body is not JSON") }

// DecodeRaw is Decode for a value that arrived as a json.RawMessage inside a larger body;
// field names in its refusals are prefixed with path.
func DecodeRaw(path string, raw json.RawMessage, v any) error {
	return Within(path, Decode(raw, v))
}

// Within returns a bad-request refusal err about a value nested at path of a larger body, with
// path prefixed to the field it names; any other error comes back as it is.
func Within(path string, err error) error {
	var f *fault.Error
	if errors.As(err, &f) && f.Code == fault.BadRequest && path != "" {
		if rest, ok := strings.CutPrefix(f.Message, "field "); ok {
			return fault.New(f.Code, "field %s.%s", path, rest)
		}
		return fault.New(f.Code, "field %s: %s", path, strings.TrimPrefix(f.Message, "body is "))
	}
	return err
}

func kindName(t reflect.Type) string {
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

func join(path, key string) string {
	if path == "" {
		return key
	}
	return path + "." + key
}

// Peek returns the string member key of a JSON object body, for dispatching on it before the
// closed parse. It applies Decode's outer checks (size, UTF-8, JSON, an object) and matches key
// exactly; when the key repeats, the last one counts (the closed parse refuses the repeat). A
// missing key is "", a non-string one a refusal.
func Peek(data []byte, key string) (string, error) {
	if err := outer(data, MaxBytes); err != nil {
		return "", err
	}
	d := decoder{data: data}
	var found, str bool
	var val string
	err := d.top(func() error {
		if d.data[d.pos] != '{' {
			return errNotObject
		}
		return d.members(func(k []byte) error {
			if string(k) != key {
				return d.skip()
			}
			found, str = true, d.data[d.pos] == '"'
			if !str {
				return d.skip()
			}
			s, err := d.strBytes()
			val = string(s)
			return err
		})
	})
	switch {
	case errors.Is(err, errSyntax):
		return "", notJSON()
	case errors.Is(err, errNotObject):
		return "", fault.New(fault.BadRequest, "body is not a JSON object")
	case err != nil:
		return "", err
	case found && !str:
		return "", fault.Field(key, "want a string")
	}
	return val, nil
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
