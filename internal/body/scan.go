package body

import (
	"bytes"
	"errors"
	"unicode"
	"unicode/utf16"
	"unicode/utf8"
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
