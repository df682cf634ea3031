package body

// The decoder as it was before it read a body in one pass (four: UTF-8, json.Valid, a token
// walk, json.Unmarshal), kept as the reference the one-pass decoder must agree with on every
// body: the same value, or the same refusal.

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"reflect"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/cotal-ai/authplane/internal/fault"
)

func refDecode(data []byte, v any) error {
	if len(data) > MaxBytes {
		return fault.New(fault.BadRequest, "body is %d bytes, over the limit of %d", len(data), MaxBytes)
	}
	if !utf8.Valid(data) {
		return fault.New(fault.BadRequest, "body is not valid UTF-8")
	}
	if !json.Valid(data) {
		return fault.New(fault.BadRequest, "body is not JSON")
	}
	rv := reflect.ValueOf(v)
	if rv.Kind() != reflect.Pointer || rv.Elem().Kind() != reflect.Struct {
		return fmt.Errorf("body.Decode needs a pointer to a struct, got %T", v)
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	first, err := dec.Token()
	if err != nil {
		return fault.New(fault.BadRequest, "body is not JSON")
	}
	if d, ok := first.(json.Delim); !ok || d != '{' {
		return fault.New(fault.BadRequest, "body is not a JSON object")
	}
	if err := refWalkObject(dec, rv.Elem().Type(), ""); err != nil {
		return err
	}
	return refUnmarshal(data, v)
}

func refUnmarshal(data []byte, v any) error {
	err := json.Unmarshal(data, v)
	if err == nil {
		return nil
	}
	var te *json.UnmarshalTypeError
	if errors.As(err, &te) {
		return fault.Field(fault.Clip(te.Field, fault.MaxQuote), "want %s, got %s", kindName(te.Type), fault.Clip(te.Value, fault.MaxQuote))
	}
	return fault.Wrap(fault.BadRequest, err, "body does not decode")
}

// refWalkObject checks the members of an object whose '{' was just read, against struct type t.
func refWalkObject(dec *json.Decoder, t reflect.Type, path string) error {
	fields := refJSONFields(t)
	seen := map[string]bool{}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return fault.New(fault.BadRequest, "body is not JSON")
		}
		key := tok.(string)
		name := join(path, fault.Clip(key, fault.MaxQuote)) // a caller's key: bounded wherever it is repeated
		ft, known := fields[key]
		if t.Kind() == reflect.Map {
			ft, known = t.Elem(), true
		}
		if !known {
			return fault.Field(name, "unknown field")
		}
		if seen[key] {
			return fault.Field(name, "duplicate key")
		}
		seen[key] = true
		if err := refWalkValue(dec, ft, name); err != nil {
			return err
		}
	}
	_, err := dec.Token() // '}'
	return err
}

func refWalkValue(dec *json.Decoder, t reflect.Type, path string) error {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	tok, err := dec.Token()
	if err != nil {
		return fault.New(fault.BadRequest, "body is not JSON")
	}
	if tok == nil {
		return fault.Field(path, "null is not allowed; leave the field out")
	}
	delim, isDelim := tok.(json.Delim)
	if t == rawType || t.Kind() == reflect.Interface {
		if isDelim {
			return refSkip(dec)
		}
		return nil
	}
	if !isDelim {
		return refCheckScalar(tok, t, path)
	}
	switch {
	case delim == '{' && (t.Kind() == reflect.Struct || t.Kind() == reflect.Map && t.Key().Kind() == reflect.String):
		return refWalkObject(dec, t, path)
	case delim == '[' && t.Kind() == reflect.Slice:
		for i := 0; dec.More(); i++ {
			if err := refWalkValue(dec, t.Elem(), path+"["+strconv.Itoa(i)+"]"); err != nil {
				return err
			}
		}
		_, err := dec.Token() // ']'
		return err
	}
	if delim == '{' {
		return fault.Field(path, "want %s, got an object", kindName(t))
	}
	return fault.Field(path, "want %s, got an array", kindName(t))
}

// refCheckScalar refuses a scalar token that t cannot hold, naming the field with its index
// (encoding/json's own type errors drop array indexes).
func refCheckScalar(tok json.Token, t reflect.Type, path string) error {
	want := kindName(t)
	switch v := tok.(type) {
	case string:
		if t.Kind() != reflect.String {
			return fault.Field(path, "want %s, got a string", want)
		}
	case bool:
		if t.Kind() != reflect.Bool {
			return fault.Field(path, "want %s, got a boolean", want)
		}
	case json.Number:
		var err error
		switch t.Kind() {
		case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
			_, err = strconv.ParseInt(v.String(), 10, t.Bits())
		case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
			_, err = strconv.ParseUint(v.String(), 10, t.Bits())
		case reflect.Float32, reflect.Float64:
			_, err = strconv.ParseFloat(v.String(), t.Bits())
		default:
			return fault.Field(path, "want %s, got a number", want)
		}
		if err != nil {
			return fault.Field(path, "want %s, got the number %s", want, fault.Clip(v.String(), fault.MaxQuote))
		}
	}
	return nil
}

// skip consumes the rest of an object or array whose opening delimiter was just read.
func refSkip(dec *json.Decoder) error {
	for depth := 1; depth > 0; {
		tok, err := dec.Token()
		if err == io.EOF {
			return fault.New(fault.BadRequest, "body is not JSON")
		}
		if err != nil {
			return fault.New(fault.BadRequest, "body is not JSON")
		}
		if d, ok := tok.(json.Delim); ok {
			if d == '{' || d == '[' {
				depth++
			} else {
				depth--
			}
		}
	}
	return nil
}

// refJSONFields maps each JSON key of struct type t to its field's type, with the fields of
// untagged embedded structs promoted as encoding/json promotes them.
func refJSONFields(t reflect.Type) map[string]reflect.Type {
	out := map[string]reflect.Type{}
	if t.Kind() != reflect.Struct {
		return out
	}
	for i := range t.NumField() {
		f := t.Field(i)
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		ft := f.Type
		for ft.Kind() == reflect.Pointer {
			ft = ft.Elem()
		}
		if f.Anonymous && name == "" && ft.Kind() == reflect.Struct {
			for k, v := range refJSONFields(ft) {
				if _, shadowed := out[k]; !shadowed {
					out[k] = v
				}
			}
			continue
		}
		if !f.IsExported() || name == "-" {
			continue
		}
		if name == "" {
			name = f.Name
		}
		out[name] = f.Type
	}
	return out
}

func refPeek(data []byte, key string) (string, error) {
	if len(data) > MaxBytes {
		return "", fault.New(fault.BadRequest, "body is %d bytes, over the limit of %d", len(data), MaxBytes)
	}
	if !utf8.Valid(data) {
		return "", fault.New(fault.BadRequest, "body is not valid UTF-8")
	}
	var members map[string]json.RawMessage
	if err := json.Unmarshal(data, &members); err != nil || members == nil { // `null` decodes to no map
		if json.Valid(data) {
			return "", fault.New(fault.BadRequest, "body is not a JSON object")
		}
		return "", fault.New(fault.BadRequest, "body is not JSON")
	}
	raw, ok := members[key]
	if !ok {
		return "", nil
	}
	var s string
	if err := json.Unmarshal(raw, &s); err != nil {
		return "", fault.Field(key, "want a string")
	}
	return s, nil
}
