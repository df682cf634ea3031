package body

import (
	"bytes"
	"encoding/json"
	"fmt"
	"reflect"
	"strconv"
	"strings"
	"sync"

	"github.com/cotal-ai/authplane/internal/fault"
)

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
