package events

import (
	"bytes"
	"encoding"
	"encoding/json"
	"errors"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/oklog/ulid/v2"
	"github.com/vmihailenco/msgpack/v5"
	"github.com/vmihailenco/msgpack/v5/msgpcode"
)

// JSONEvent is an event as JSONDecoder gives it: the envelope, and the
// payload as the JSON json.Marshal writes of the payload Decode returns.
// Its slices are the decoder's, valid until its next Decode.
type JSONEvent struct {
	ID                  ulid.ULID
	Type                Type
	Time                time.Time
	Sandbox, Saga, Step []byte
	Payload             []byte
}

// JSONDecoder decodes events as Decode does, with the payload written as
// JSON straight from its msgpack, without the payload's Go value: a whole
// read of the fleet prints every event's payload, and decoding it by
// reflection, boxing it and encoding it again by reflection took most of
// the time of a line. A record in a shape the transcoding does not cover
// (an older schema, an unusual encoding, anything Decode refuses) is
// decoded by Decode and its payload marshalled, so the result is Decode's
// in every case. Its buffers are kept from one event to the next; one
// decoder is used by one goroutine at a time.
type JSONDecoder struct {
	r    bytes.Reader
	d    *msgpack.Decoder
	w    wire
	ev   JSONEvent
	json []byte
	str  []byte   // a string being read
	kv   []kvSpan // a map's entries being sorted
	sb   [32]byte
	saga [32]byte
	step [32]byte
}

// Decode decodes data; the event is d's until its next Decode.
func (d *JSONDecoder) Decode(data []byte) (*JSONEvent, error) {
	if ok := d.transcode(data); ok {
		return &d.ev, nil
	}
	e, err := Decode(data)
	if err != nil {
		return nil, err
	}
	payload, err := json.Marshal(e.Payload)
	if err != nil {
		return nil, err
	}
	d.json = append(d.json[:0], payload...)
	d.ev = JSONEvent{
		ID: e.ID, Type: e.Type, Time: e.Time,
		Sandbox: append(d.sb[:0], e.Sandbox...), Saga: append(d.saga[:0], e.Saga...), Step: append(d.step[:0], e.Step...),
		Payload: d.json,
	}
	return &d.ev, nil
}

// transcode is Decode's success path for the shapes the plans cover: the
// envelope read as Decode reads it, the payload written as JSON as it is
// read. False for anything else, Decode's failures among them.
func (d *JSONDecoder) transcode(data []byte) bool {
	if d.d == nil {
		d.d = msgpack.NewDecoder(&d.r)
	}
	d.w = wire{toJSON: d}
	d.json = d.json[:0]
	if err := checkBounds(data); err != nil {
		return false
	}
	d.r.Reset(data)
	d.d.Reset(&d.r)
	d.d.DisallowUnknownFields(true)
	w := &d.w
	if err := w.DecodeMsgpack(d.d); err != nil || !w.transcoded || w.Format != EnvelopeFormat || len(w.ID) != len(ulid.ULID{}) {
		return false
	}
	t := Type(w.Type)
	if s, ok := registry[t]; !ok || w.Schema != s.current {
		return false
	}
	d.ev = JSONEvent{Type: t, Time: time.Unix(0, w.Time).UTC(), Sandbox: w.sbJSON, Saga: w.sagaJSON, Step: w.stepJSON, Payload: d.json}
	copy(d.ev.ID[:], w.ID)
	return true
}

// envelopeString reads one of the envelope's strings (what DecodeString
// reads) into buf.
func (d *JSONDecoder) envelopeString(buf []byte) ([]byte, error) {
	b, err := readShort(d.d, buf)
	if b == nil {
		b = buf[:0]
	}
	return b, err
}

// payload writes the payload of a type its plan covers as JSON; false
// when the type has no plan or the payload is not in a shape it covers.
func (d *JSONDecoder) payload(t Type) bool {
	p := jsonPlans()[t]
	if p == nil {
		return false
	}
	return d.value(p) == nil
}

// errShape: the msgpack is not in a shape the transcoding covers (it may
// still decode).
var errShape = errors.New("not transcoded")

// jsonNode is how one Go type of a payload is read from msgpack (as
// msgpack's decoder reads it into that type) and written as JSON (as
// encoding/json writes that type).
type jsonNode struct {
	kind   reflect.Kind
	elem   *jsonNode   // a slice's element, a map's value
	fields []jsonField // a struct's, in declaration order
	byKey  map[string]int
}

type jsonField struct {
	msgpack   string
	key       string // `"name":`
	omitEmpty bool   // json's omitempty
	node      *jsonNode
	zero      []byte // the JSON of the field's zero value (an absent field)
}

func (d *JSONDecoder) value(n *jsonNode) error {
	switch n.kind {
	case reflect.String:
		s, err := d.readString()
		if err != nil {
			return err
		}
		d.json = appendJSONString(d.json, s)
	case reflect.Int, reflect.Int64:
		v, err := d.d.DecodeInt64()
		if err != nil {
			return err
		}
		d.json = strconv.AppendInt(d.json, v, 10)
	case reflect.Uint, reflect.Uint64:
		v, err := d.d.DecodeUint64()
		if err != nil {
			return err
		}
		d.json = strconv.AppendUint(d.json, v, 10)
	case reflect.Bool:
		v, err := d.d.DecodeBool()
		if err != nil {
			return err
		}
		d.json = strconv.AppendBool(d.json, v)
	case reflect.Slice:
		return d.slice(n)
	case reflect.Map:
		return d.stringMap()
	case reflect.Struct:
		return d.structValue(n)
	default:
		return errShape
	}
	return nil
}

// readString reads what DecodeString reads, into d's buffer.
func (d *JSONDecoder) readString() ([]byte, error) {
	n, err := d.d.DecodeBytesLen()
	if err != nil || n <= 0 {
		return nil, err
	}
	if n > d.r.Len() {
		return nil, errShape
	}
	d.str = slices.Grow(d.str[:0], n)[:n]
	return d.str, d.d.ReadFull(d.str)
}

// isNil says whether the next value is msgpack's nil, and whether it is
// an extension (which the decoder reads differently for different Go
// types).
func (d *JSONDecoder) peek() (nilValue, ext bool, err error) {
	c, err := d.d.PeekCode()
	return c == msgpcode.Nil, msgpcode.IsExt(c), err
}

// slice: nil is null, an empty array [] (msgpack's decoder makes an empty
// slice of it).
func (d *JSONDecoder) slice(n *jsonNode) error {
	k, err := d.d.DecodeArrayLen()
	if more, err := d.opened(k, err); !more {
		return err
	}
	d.json = append(d.json, '[')
	for i := range k {
		if i > 0 {
			d.json = append(d.json, ',')
		}
		if err := d.value(n.elem); err != nil {
			return err
		}
	}
	d.json = append(d.json, ']')
	return nil
}

// opened takes an array's or a map's length k as read: nil (-1) is
// written as null, and a length the rest of the record cannot hold is not
// covered. It says whether k elements are still to be read.
func (d *JSONDecoder) opened(k int, err error) (bool, error) {
	switch {
	case err != nil:
		return false, err
	case k == -1:
		d.json = append(d.json, "null"...)
		return false, nil
	case k > d.r.Len():
		return false, errShape
	}
	return true, nil
}

// kvSpan is a map entry's key and value, as offsets into the JSON
// buffer past the map's start.
type kvSpan struct {
	key, kEnd, vEnd int
}

// stringMap: a map[string]string, whose JSON has its keys sorted; a key
// given twice keeps its last value, as the map does.
func (d *JSONDecoder) stringMap() error {
	if _, ext, err := d.peek(); err != nil || ext {
		return errShape
	}
	k, err := d.d.DecodeMapLen()
	if more, err := d.opened(k, err); !more {
		return err
	}
	// The entries are read into the buffer past its end, then sorted
	// and written in their place.
	start := len(d.json)
	d.kv = d.kv[:0]
	for range k {
		key := len(d.json)
		s, err := d.readString()
		if err != nil {
			return err
		}
		d.json = append(d.json, s...)
		kEnd := len(d.json)
		if s, err = d.readString(); err != nil {
			return err
		}
		d.json = append(d.json, s...)
		d.kv = append(d.kv, kvSpan{key, kEnd, len(d.json)})
	}
	raw := d.json[start:]
	keyOf := func(e kvSpan) []byte { return raw[e.key-start : e.kEnd-start] }
	slices.SortStableFunc(d.kv, func(a, b kvSpan) int { return bytes.Compare(keyOf(a), keyOf(b)) })
	out := make([]byte, 0, 2*len(raw)+2+len(d.kv)*6)
	out = append(out, '{')
	written := 0
	for i, e := range d.kv {
		if i+1 < len(d.kv) && bytes.Equal(keyOf(e), keyOf(d.kv[i+1])) {
			continue // the last of equal keys is the map's
		}
		if written > 0 {
			out = append(out, ',')
		}
		out = appendJSONString(out, keyOf(e))
		out = append(out, ':')
		out = appendJSONString(out, raw[e.kEnd-start:e.vEnd-start])
		written++
	}
	out = append(out, '}')
	d.json = append(d.json[:start], out...)
	return nil
}

// structValue: a map of the struct's fields by their msgpack names,
// written in the order of the struct's fields, each absent one as its
// zero value. Fields out of that order, given twice, unknown, or a struct
// as an array or nil: not covered.
func (d *JSONDecoder) structValue(n *jsonNode) error {
	if nilValue, ext, err := d.peek(); err != nil || nilValue || ext {
		return errShape
	}
	k, err := d.d.DecodeMapLen()
	if err != nil {
		return err
	}
	d.json = append(d.json, '{')
	next, written := 0, false
	field := func(f *jsonField, value func() error) error {
		mark := len(d.json)
		if written {
			d.json = append(d.json, ',')
		}
		d.json = append(d.json, f.key...)
		valueAt := len(d.json)
		if err := value(); err != nil {
			return err
		}
		if f.omitEmpty && emptyJSON(f.node.kind, d.json[valueAt:]) {
			d.json = d.json[:mark]
			return nil
		}
		written = true
		return nil
	}
	zero := func(upTo int) {
		for ; next < upTo; next++ {
			f := &n.fields[next]
			_ = field(f, func() error { d.json = append(d.json, f.zero...); return nil })
		}
	}
	for range k {
		name, err := d.readString()
		if err != nil {
			return err
		}
		i, ok := n.byKey[string(name)]
		if !ok || i < next {
			return errShape
		}
		zero(i)
		f := &n.fields[i]
		if err := field(f, func() error { return d.value(f.node) }); err != nil {
			return err
		}
		next = i + 1
	}
	zero(len(n.fields))
	d.json = append(d.json, '}')
	return nil
}

// emptyJSON says whether v, the JSON of a value of kind k, is what
// encoding/json's omitempty leaves out: "", 0, false, an empty or nil
// slice or map. A struct is never left out.
func emptyJSON(k reflect.Kind, v []byte) bool {
	switch k {
	case reflect.String:
		return string(v) == `""`
	case reflect.Int, reflect.Int64, reflect.Uint, reflect.Uint64:
		return string(v) == "0"
	case reflect.Bool:
		return string(v) == "false"
	case reflect.Slice:
		return string(v) == "null" || string(v) == "[]"
	case reflect.Map:
		return string(v) == "null" || string(v) == "{}"
	}
	return false
}

// appendJSONString appends s quoted as encoding/json quotes a string (HTML
// escaped): a string of plain printable ASCII as it is, any other through
// encoding/json itself.
func appendJSONString(b, s []byte) []byte {
	for _, c := range s {
		if c < 0x20 || c >= 0x7f || c == '"' || c == '\\' || c == '<' || c == '>' || c == '&' {
			q, _ := json.Marshal(string(s))
			return append(b, q...)
		}
	}
	b = append(b, '"')
	b = append(b, s...)
	return append(b, '"')
}

// jsonPlans are the payload types the transcoding covers, by event type,
// planned on a process's first transcoding: most processes never
// transcode, and planning walks every payload type.
var jsonPlans = sync.OnceValue(func() map[Type]*jsonNode {
	m := map[Type]*jsonNode{}
	for t, s := range registry {
		if n := planJSON(s.zero); n != nil {
			m[t] = n
		}
	}
	return m
})

var (
	jsonMarshaler    = reflect.TypeFor[json.Marshaler]()
	textMarshaler    = reflect.TypeFor[encoding.TextMarshaler]()
	textUnmarshaler  = reflect.TypeFor[encoding.TextUnmarshaler]()
	binUnmarshaler   = reflect.TypeFor[encoding.BinaryUnmarshaler]()
	msgpackDecoder   = reflect.TypeFor[msgpack.CustomDecoder]()
	msgpackUnmarshal = reflect.TypeFor[msgpack.Unmarshaler]()
)

// planJSON is t's plan, or nil when t (or a type in it) is anything the
// transcoding does not cover: a type with its own JSON or msgpack
// methods, kinds other than strings, 64-bit integers, bools, slices,
// string maps and structs, a field without simple msgpack and json names.
func planJSON(t reflect.Type) *jsonNode {
	for _, m := range []reflect.Type{jsonMarshaler, textMarshaler, textUnmarshaler, binUnmarshaler, msgpackDecoder, msgpackUnmarshal} {
		if t.Implements(m) || reflect.PointerTo(t).Implements(m) {
			return nil
		}
	}
	n := &jsonNode{kind: t.Kind()}
	switch t.Kind() {
	case reflect.String, reflect.Int, reflect.Int64, reflect.Uint, reflect.Uint64, reflect.Bool:
	case reflect.Slice:
		if t.Elem().Kind() == reflect.Uint8 || t.Elem().Kind() == reflect.String && t.Elem() != reflect.TypeFor[string]() {
			return nil // bytes, and named strings' slices, decode otherwise
		}
		if n.elem = planJSON(t.Elem()); n.elem == nil {
			return nil
		}
	case reflect.Map:
		if t.Key() != reflect.TypeFor[string]() || t.Elem() != reflect.TypeFor[string]() {
			return nil
		}
	case reflect.Struct:
		n.byKey = map[string]int{}
		for i := range t.NumField() {
			sf := t.Field(i)
			mp, mOpts, _ := strings.Cut(sf.Tag.Get("msgpack"), ",")
			js, jOpts, _ := strings.Cut(sf.Tag.Get("json"), ",")
			if !sf.IsExported() || sf.Anonymous || !plainName(mp) || !plainName(js) ||
				mOpts != "" && mOpts != "omitempty" || jOpts != "" && jOpts != "omitempty" {
				return nil
			}
			f := jsonField{msgpack: mp, key: `"` + js + `":`, omitEmpty: jOpts == "omitempty", node: planJSON(sf.Type)}
			if f.node == nil {
				return nil
			}
			zero, err := json.Marshal(reflect.Zero(sf.Type).Interface())
			if err != nil {
				return nil
			}
			f.zero = zero
			n.byKey[mp] = len(n.fields)
			n.fields = append(n.fields, f)
		}
	default:
		return nil
	}
	return n
}

// plainName: a name encoding/json writes as it is, and msgpack reads.
func plainName(s string) bool {
	if s == "" {
		return false
	}
	for _, c := range s {
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '_') {
			return false
		}
	}
	return true
}
