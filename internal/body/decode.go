package body

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"unicode"
	"unicode/utf16"
	"unicode/utf8"

	"github.com/cotal-ai/authplane/internal/fault"
)

// The decoder's own faults, turned into refusals by Decode and Peek.
var (
	// errSyntax: the body breaks the JSON grammar (RFC 8259, nested at most maxDepth deep, as
	// encoding/json allows).
	errSyntax = errors.New("not JSON")
	// errNotObject: the body is JSON, but its value is not an object.
	errNotObject = errors.New("not a JSON object")
)

// maxDepth is how deep objects and arrays may nest: encoding/json's bound.
const maxDepth = 10000

// decoder reads one JSON document in one pass, by hand: the grammar, and the closed schema of
// the value it fills.
type decoder struct {
	data  []byte
	pos   int
	depth int
	// path leads to the value being read.
	path []segment
}

// top reads the document's one value with fn, which starts at its first byte, and requires
// nothing but whitespace after it. fn's errNotObject stands only for a document that is JSON.
func (d *decoder) top(fn func() error) error {
	d.ws()
	if d.pos >= len(d.data) {
		return errSyntax
	}
	err := fn()
	notObject := errors.Is(err, errNotObject)
	if notObject {
		d.pos, d.depth = 0, 0
		err = d.skip()
	}
	if err != nil {
		return err
	}
	d.ws()
	switch {
	case d.pos != len(d.data):
		return errSyntax
	case notObject:
		return errNotObject
	}
	return nil
}

func (d *decoder) ws() {
	for d.pos < len(d.data) {
		switch d.data[d.pos] {
		case ' ', '\t', '\n', '\r':
			d.pos++
		default:
			return
		}
	}
}

// expect consumes c (after whitespace) or fails the grammar.
func (d *decoder) expect(c byte) error {
	d.ws()
	if d.pos >= len(d.data) || d.data[d.pos] != c {
		return errSyntax
	}
	d.pos++
	return nil
}

// nest enters an object or array (its opening byte is at d.pos).
func (d *decoder) nest() error {
	d.depth++
	if d.depth > maxDepth {
		return errSyntax
	}
	d.pos++
	return nil
}

// members reads the object at d.pos, calling fn for each member with its key (unescaped; valid
// only during the call) and d.pos at the first byte of its value, which fn must consume.
func (d *decoder) members(fn func(key []byte) error) error {
	if err := d.nest(); err != nil {
		return err
	}
	for first := true; ; first = false {
		key, done, err := d.member(first)
		if err != nil || done {
			return err
		}
		if err := fn(key); err != nil {
			return err
		}
	}
}

// member reads up to the next member's value of an object entered with nest (first: its first
// member), and returns its key, or done once the object has closed.
func (d *decoder) member(first bool) (key []byte, done bool, err error) {
	d.ws()
	if d.pos >= len(d.data) {
		return nil, false, errSyntax
	}
	switch c := d.data[d.pos]; {
	case c == '}':
		if !first && d.data[d.pos-1] == ',' {
			return nil, false, errSyntax // a trailing comma
		}
		d.pos++
		d.depth--
		return nil, true, nil
	case !first && c == ',':
		d.pos++
		d.ws()
	case !first:
		return nil, false, errSyntax
	}
	if d.pos >= len(d.data) || d.data[d.pos] != '"' {
		return nil, false, errSyntax
	}
	if key, err = d.strBytes(); err != nil {
		return nil, false, err
	}
	if err := d.expect(':'); err != nil {
		return nil, false, err
	}
	d.ws()
	if d.pos >= len(d.data) {
		return nil, false, errSyntax
	}
	return key, false, nil
}

// elements reads the array at d.pos, calling fn for element i with d.pos at its first byte.
func (d *decoder) elements(fn func(i int) error) error {
	if err := d.nest(); err != nil {
		return err
	}
	for i := 0; ; i++ {
		done, err := d.element(i)
		if err != nil || done {
			return err
		}
		if err := fn(i); err != nil {
			return err
		}
	}
}

// element reads up to element i of an array entered with nest, or reports done once the array
// has closed.
func (d *decoder) element(i int) (done bool, err error) {
	d.ws()
	if d.pos >= len(d.data) {
		return false, errSyntax
	}
	switch c := d.data[d.pos]; {
	case c == ']':
		if i > 0 && d.data[d.pos-1] == ',' {
			return false, errSyntax // a trailing comma
		}
		d.pos++
		d.depth--
		return true, nil
	case i > 0 && c == ',':
		d.pos++
		d.ws()
	case i > 0:
		return false, errSyntax
	}
	if d.pos >= len(d.data) {
		return false, errSyntax
	}
	return false, nil
}

// skip reads the value at d.pos (after whitespace) for its grammar only.
func (d *decoder) skip() error {
	d.ws()
	if d.pos >= len(d.data) {
		return errSyntax
	}
	switch c := d.data[d.pos]; {
	case c == '{':
		return d.members(func([]byte) error { return d.skip() })
	case c == '[':
		return d.elements(func(int) error { return d.skip() })
	case c == '"':
		_, err := d.strBytes()
		return err
	case c == 't':
		return d.literal("true")
	case c == 'f':
		return d.literal("false")
	case c == 'n':
		return d.literal("null")
	}
	_, err := d.number()
	return err
}

func (d *decoder) literal(word string) error {
	if !bytes.HasPrefix(d.data[d.pos:], []byte(word)) {
		return errSyntax
	}
	d.pos += len(word)
	return nil
}

// number reads a number at d.pos and returns its literal.
func (d *decoder) number() ([]byte, error) {
	start, i, data := d.pos, d.pos, d.data
	digits := func() bool {
		from := i
		for i < len(data) && data[i] >= '0' && data[i] <= '9' {
			i++
		}
		return i > from
	}
	if i < len(data) && data[i] == '-' {
		i++
	}
	switch {
	case i < len(data) && data[i] == '0':
		i++
	case !digits():
		return nil, errSyntax
	}
	if i < len(data) && data[i] == '.' {
		i++
		if !digits() {
			return nil, errSyntax
		}
	}
	if i < len(data) && (data[i] == 'e' || data[i] == 'E') {
		i++
		if i < len(data) && (data[i] == '+' || data[i] == '-') {
			i++
		}
		if !digits() {
			return nil, errSyntax
		}
	}
	d.pos = i
	return data[start:i], nil
}

// strBytes reads the string at d.pos (its opening quote) and returns its content, unescaped:
// a slice of the body when it holds no escape. A control character is a fault of the grammar;
// an escaped surrogate that pairs with no other becomes U+FFFD, as in encoding/json. The body's
// UTF-8 was checked before.
func (d *decoder) strBytes() ([]byte, error) {
	start := d.pos + 1
	for i := start; i < len(d.data); i++ {
		switch c := d.data[i]; {
		case c == '"':
			d.pos = i + 1
			return d.data[start:i], nil
		case c == '\\':
			return d.unescape(start, i)
		case c < 0x20:
			return nil, errSyntax
		}
	}
	return nil, errSyntax
}

// unescape reads the rest of a string whose content began at start and whose first escape is
// at i.
func (d *decoder) unescape(start, i int) ([]byte, error) {
	out := append(make([]byte, 0, i-start+16), d.data[start:i]...)
	data := d.data
	for i < len(data) {
		c := data[i]
		switch {
		case c == '"':
			d.pos = i + 1
			return out, nil
		case c < 0x20:
			return nil, errSyntax
		case c != '\\':
			out = append(out, c)
			i++
			continue
		}
		if i+1 >= len(data) {
			return nil, errSyntax
		}
		switch e := data[i+1]; e {
		case '"', '\\', '/':
			out = append(out, e)
		case 'b':
			out = append(out, '\b')
		case 'f':
			out = append(out, '\f')
		case 'n':
			out = append(out, '\n')
		case 'r':
			out = append(out, '\r')
		case 't':
			out = append(out, '\t')
		case 'u':
			r := hex4(data[i+2:])
			if r < 0 {
				return nil, errSyntax
			}
			i += 6
			if utf16.IsSurrogate(r) {
				if r2 := hex4after(data[i:]); r2 >= 0 {
					if pair := utf16.DecodeRune(r, r2); pair != unicode.ReplacementChar {
						out = utf8.AppendRune(out, pair)
						i += 6
						continue
					}
				}
				r = unicode.ReplacementChar
			}
			out = utf8.AppendRune(out, r)
			continue
		default:
			return nil, errSyntax
		}
		i += 2
	}
	return nil, errSyntax
}

// hex4 decodes the four hex digits that begin b, or returns -1.
func hex4(b []byte) rune {
	if len(b) < 4 {
		return -1
	}
	var r rune
	for _, c := range b[:4] {
		switch {
		case c >= '0' && c <= '9':
			c -= '0'
		case c >= 'a' && c <= 'f':
			c = c - 'a' + 10
		case c >= 'A' && c <= 'F':
			c = c - 'A' + 10
		default:
			return -1
		}
		r = r*16 + rune(c)
	}
	return r
}

// hex4after decodes a `\uXXXX` escape that begins b, or returns -1.
func hex4after(b []byte) rune {
	if len(b) < 6 || b[0] != '\\' || b[1] != 'u' {
		return -1
	}
	return hex4(b[2:])
}

// segment is one step of the path to the value being read: a member's key, or (key nil) an
// element's index.
type segment struct {
	key   []byte
	index int
}

// at names the value being read, for a refusal: `identities.serve.id`, `items[1].count`; a
// caller's key is bounded wherever it is repeated. It is spelled out only for a refusal.
func (d *decoder) at() string {
	var p string
	for _, s := range d.path {
		if s.key == nil {
			p += "[" + strconv.Itoa(s.index) + "]"
		} else {
			p = join(p, fault.Clip(string(s.key), fault.MaxQuote))
		}
	}
	return p
}

// within reads the value at d.pos into v as the segment s of the path.
func (d *decoder) within(s segment, v reflect.Value) error {
	d.path = append(d.path, s)
	if err := d.value(v); err != nil {
		return err
	}
	d.path = d.path[:len(d.path)-1]
	return nil
}

// value reads the value at d.pos into v, whose type says what it may be; d.path names it.
func (d *decoder) value(v reflect.Value) error {
	c := d.data[d.pos]
	if c == 'n' {
		if err := d.literal("null"); err != nil {
			return err
		}
		return fault.Field(d.at(), "null is not allowed; leave the field out")
	}
	for v.Kind() == reflect.Pointer {
		if v.IsNil() {
			v.Set(reflect.New(v.Type().Elem()))
		}
		v = v.Elem()
	}
	t := v.Type()
	if t == rawType || t.Kind() == reflect.Interface {
		start := d.pos
		if err := d.skip(); err != nil {
			return err
		}
		raw := d.data[start:d.pos]
		if t == rawType {
			v.SetBytes(bytes.Clone(raw))
			return nil
		}
		if err := json.Unmarshal(raw, v.Addr().Interface()); err != nil {
			return fault.Wrap(fault.BadRequest, err, "field %s does not decode", d.at())
		}
		return nil
	}
	switch c {
	case '{':
		switch {
		case t.Kind() == reflect.Struct:
			return d.object(v)
		case t.Kind() == reflect.Map && t.Key().Kind() == reflect.String:
			return d.mapObject(v)
		}
		return fault.Field(d.at(), "want %s, got an object", kindName(t))
	case '[':
		if t.Kind() == reflect.Slice {
			return d.slice(v)
		}
		return fault.Field(d.at(), "want %s, got an array", kindName(t))
	case '"':
		s, err := d.strBytes()
		if err != nil {
			return err
		}
		if t.Kind() != reflect.String {
			return fault.Field(d.at(), "want %s, got a string", kindName(t))
		}
		v.SetString(string(s))
		return nil
	case 't', 'f':
		word := "true"
		if c == 'f' {
			word = "false"
		}
		if err := d.literal(word); err != nil {
			return err
		}
		if t.Kind() != reflect.Bool {
			return fault.Field(d.at(), "want %s, got a boolean", kindName(t))
		}
		v.SetBool(c == 't')
		return nil
	}
	lit, err := d.number()
	if err != nil {
		return err
	}
	return d.setNumber(v, lit)
}

// setNumber sets v to the number lit, refusing one v's type cannot hold.
func (d *decoder) setNumber(v reflect.Value, lit []byte) error {
	t := v.Type()
	var err error
	switch t.Kind() {
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		var n int64
		if n, err = strconv.ParseInt(string(lit), 10, t.Bits()); err == nil {
			v.SetInt(n)
		}
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		var n uint64
		if n, err = strconv.ParseUint(string(lit), 10, t.Bits()); err == nil {
			v.SetUint(n)
		}
	case reflect.Float32, reflect.Float64:
		var f float64
		if f, err = strconv.ParseFloat(string(lit), t.Bits()); err == nil {
			v.SetFloat(f)
		}
	default:
		return fault.Field(d.at(), "want %s, got a number", kindName(t))
	}
	if err != nil {
		return fault.Field(d.at(), "want %s, got the number %s", kindName(t), fault.Clip(string(lit), fault.MaxQuote))
	}
	return nil
}

// object reads the object at d.pos into struct v: each key one of its fields, once.
func (d *decoder) object(v reflect.Value) error {
	fields := fieldsOf(v.Type())
	var small [64]bool
	seen := small[:]
	if len(fields.list) > len(small) {
		seen = make([]bool, len(fields.list))
	}
	return d.members(func(key []byte) error {
		f, known := fields.byName[string(key)]
		switch {
		case !known:
			d.path = append(d.path, segment{key: key})
			return fault.Field(d.at(), "unknown field")
		case seen[f.n]:
			d.path = append(d.path, segment{key: key})
			return fault.Field(d.at(), "duplicate key")
		}
		seen[f.n] = true
		fv, err := fieldOf(v, f.index)
		if err != nil {
			return err
		}
		return d.within(segment{key: key}, fv)
	})
}

// mapObject reads the object at d.pos into map v (string keys): any key, once.
func (d *decoder) mapObject(v reflect.Value) error {
	t := v.Type()
	if v.IsNil() {
		v.Set(reflect.MakeMap(t))
	}
	seen := map[string]bool{}
	return d.members(func(key []byte) error {
		k := string(key)
		if seen[k] {
			d.path = append(d.path, segment{key: key})
			return fault.Field(d.at(), "duplicate key")
		}
		seen[k] = true
		e := reflect.New(t.Elem()).Elem()
		if err := d.within(segment{key: key}, e); err != nil {
			return err
		}
		v.SetMapIndex(reflect.ValueOf(k).Convert(t.Key()), e)
		return nil
	})
}

// slice reads the array at d.pos into slice v, from its first element (an empty array is an
// empty slice, not nil).
func (d *decoder) slice(v reflect.Value) error {
	v.SetLen(0)
	err := d.elements(func(i int) error {
		if i >= v.Cap() {
			grown := reflect.MakeSlice(v.Type(), i, max(4, 2*v.Cap()))
			reflect.Copy(grown, v)
			v.Set(grown)
		}
		v.SetLen(i + 1)
		return d.within(segment{index: i}, v.Index(i))
	})
	if err == nil && v.IsNil() {
		v.Set(reflect.MakeSlice(v.Type(), 0, 0))
	}
	return err
}

// fieldOf returns v's field at index, allocating the embedded structs pointed to on the way
// (which encoding/json cannot do for an unexported one either: a programming error).
func fieldOf(v reflect.Value, index []int) (reflect.Value, error) {
	for n, i := range index {
		if n > 0 && v.Kind() == reflect.Pointer {
			if v.IsNil() {
				if !v.CanSet() {
					return reflect.Value{}, fmt.Errorf("body: cannot set the embedded pointer to unexported struct %s", v.Type().Elem())
				}
				v.Set(reflect.New(v.Type().Elem()))
			}
			v = v.Elem()
		}
		v = v.Field(i)
	}
	return v, nil
}

// structFields are a struct type's JSON keys: each with its field's index path, and a number
// that counts it as seen.
type structFields struct {
	byName map[string]field
	list   []string
}

type field struct {
	index []int
	n     int
}

var fieldCache sync.Map // reflect.Type → *structFields

// fieldsOf returns struct type t's JSON keys, with the fields of untagged embedded structs
// promoted as encoding/json promotes them (a shallower field wins).
func fieldsOf(t reflect.Type) *structFields {
	if f, ok := fieldCache.Load(t); ok {
		return f.(*structFields)
	}
	sf := &structFields{byName: map[string]field{}}
	var walk func(t reflect.Type, prefix []int, promoted bool)
	walk = func(t reflect.Type, prefix []int, promoted bool) {
		var embedded []reflect.StructField
		for i := range t.NumField() {
			f := t.Field(i)
			name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
			ft := f.Type
			for ft.Kind() == reflect.Pointer {
				ft = ft.Elem()
			}
			if f.Anonymous && name == "" && ft.Kind() == reflect.Struct {
				embedded = append(embedded, f)
				continue
			}
			if !f.IsExported() || name == "-" {
				continue
			}
			if name == "" {
				name = f.Name
			}
			if _, taken := sf.byName[name]; taken && promoted {
				continue // a shallower field has the key
			}
			if _, taken := sf.byName[name]; !taken {
				sf.list = append(sf.list, name)
			}
			sf.byName[name] = field{index: append(append([]int(nil), prefix...), i), n: sf.indexOf(name)}
		}
		for _, f := range embedded {
			ft := f.Type
			for ft.Kind() == reflect.Pointer {
				ft = ft.Elem()
			}
			walk(ft, append(append([]int(nil), prefix...), f.Index...), true)
		}
	}
	walk(t, nil, false)
	f, _ := fieldCache.LoadOrStore(t, sf)
	return f.(*structFields)
}

func (sf *structFields) indexOf(name string) int {
	for i, n := range sf.list {
		if n == name {
			return i
		}
	}
	return -1
}
