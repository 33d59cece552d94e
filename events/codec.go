package events

import (
	"bytes"
	"errors"
	"fmt"
	"reflect"
	"sync"
	"time"

	"github.com/oklog/ulid/v2"
	"github.com/vmihailenco/msgpack/v5"
)

// EnvelopeFormat is the version of the envelope layout itself. Payload
// schemas are versioned per type, in the registry below.
const EnvelopeFormat = 1

var (
	// ErrUnknownType: the journal holds an event type this nexus does not know.
	ErrUnknownType = errors.New("unknown event type")
	// ErrSchemaTooNew: the event was written by a newer nexus; it must not be
	// misread as the older schema.
	ErrSchemaTooNew = errors.New("event written by a newer schema")
	// ErrMalformed: the bytes are not a well-formed event.
	ErrMalformed = errors.New("malformed event")
)

// DecodeError says which event failed to decode and why. errors.Is works
// against the three sentinels above.
type DecodeError struct {
	Type      Type
	Schema    uint16
	Supported uint16
	Err       error
}

func (e *DecodeError) Error() string {
	switch {
	case errors.Is(e.Err, ErrSchemaTooNew):
		return fmt.Sprintf("event %s schema %d is newer than supported %d: upgrade nexus", e.Type, e.Schema, e.Supported)
	case e.Type != "":
		return fmt.Sprintf("event %s (schema %d): %v", e.Type, e.Schema, e.Err)
	default:
		return e.Err.Error()
	}
}

func (e *DecodeError) Unwrap() error { return e.Err }

// typeSpec is what the codec knows about one event type.
type typeSpec struct {
	current uint16
	zero    reflect.Type
	// upcast decodes an older schema's payload straight into the current
	// payload type. Missing entries mean that version never existed.
	upcast map[uint16]func(raw []byte) (Payload, error)
	// scratch holds pointers (as any) to zero payloads a decode fills: the payload
	// an event carries is a copy made once it decoded, so a fresh value
	// per event would allocate it twice.
	scratch *sync.Pool
}

func spec(p Payload, current uint16) typeSpec {
	t := reflect.TypeOf(p)
	return typeSpec{current: current, zero: t, scratch: &sync.Pool{New: func() any { return reflect.New(t).Interface() }}}
}

var registry = map[Type]typeSpec{
	SandboxCreated:     addedSince(withUpcast(spec(SandboxCreatedEvent{}, 6), 1, upcastSandboxCreatedV1), 2, addedFields[SandboxCreatedEvent]),
	SandboxForked:      addedSince(spec(SandboxForkedEvent{}, 5), 1, addedFields[SandboxForkedEvent]),
	SandboxRestored:    addedSince(spec(SandboxRestoredEvent{}, 5), 1, addedFields[SandboxRestoredEvent]),
	SandboxStarted:     spec(SandboxStartedEvent{}, 1),
	SandboxReady:       spec(SandboxReadyEvent{}, 1),
	SandboxNotReady:    spec(SandboxNotReadyEvent{}, 1),
	SandboxStopped:     spec(SandboxStoppedEvent{}, 1),
	SandboxFailed:      spec(SandboxFailedEvent{}, 1),
	SandboxRemoved:     spec(SandboxRemovedEvent{}, 1),
	SandboxRenamed:     spec(SandboxRenamedEvent{}, 1),
	DiskMaterialised:   spec(DiskMaterialisedEvent{}, 1),
	IntentWritten:      spec(IntentWrittenEvent{}, 1),
	IntentRetired:      spec(IntentRetiredEvent{}, 1),
	SupervisorStarted:  spec(SupervisorStartedEvent{}, 1),
	SupervisorStopped:  spec(SupervisorStoppedEvent{}, 1),
	SupervisorExited:   spec(SupervisorExitedEvent{}, 1),
	VMMExited:          spec(VMMExitedEvent{}, 1),
	SnapshotTaken:      spec(SnapshotTakenEvent{}, 1),
	VolumeCreated:      addedSince(spec(VolumeCreatedEvent{}, 2), 1, addedFields[VolumeCreatedEvent]),
	VolumeAttached:     spec(VolumeAttachedEvent{}, 1),
	VolumeDetached:     spec(VolumeDetachedEvent{}, 1),
	VolumeRemoved:      spec(VolumeRemovedEvent{}, 1),
	FlushPending:       spec(FlushPendingEvent{}, 1),
	FlushAcknowledged:  spec(FlushAcknowledgedEvent{}, 1),
	FlushRestored:      spec(FlushRestoredEvent{}, 1),
	OverlayRecovered:   spec(OverlayRecoveredEvent{}, 1),
	WarningRaised:      spec(WarningRaisedEvent{}, 1),
	ReapDecided:        spec(ReapDecidedEvent{}, 1),
	ReapApplied:        spec(ReapAppliedEvent{}, 1),
	ResourceCreated:    spec(ResourceCreatedEvent{}, 1),
	ResourceReclaimed:  spec(ResourceReclaimedEvent{}, 1),
	RunSwept:           spec(RunSweptEvent{}, 1),
	RunKept:            spec(RunKeptEvent{}, 1),
	ImageCachePrepared: spec(ImageCachePreparedEvent{}, 1),
	ImageCacheUsed:     spec(ImageCacheUsedEvent{}, 1),
	ImageCachePruned:   spec(ImageCachePrunedEvent{}, 1),
	SagaStarted:        spec(SagaStartedEvent{}, 1),
	SagaFinished:       spec(SagaFinishedEvent{}, 1),
	SagaCompensated:    spec(SagaCompensatedEvent{}, 1),
	HandleClaimed:      spec(HandleClaimedEvent{}, 1),

	// The daemon's fleet mirror (host/journal's Mirror).
	MirrorCreated:        spec(MirrorCreatedEvent{}, 1),
	MirrorRecreated:      spec(MirrorRecreatedEvent{}, 1),
	MirrorLinked:         spec(MirrorLinkedEvent{}, 1),
	MirrorUnlinked:       spec(MirrorUnlinkedEvent{}, 1),
	MirrorSettingsDiffer: spec(MirrorSettingsDifferEvent{}, 1),
	MirrorRefused:        spec(MirrorRefusedEvent{}, 1),

	// The host's running digest of its journal (Chain).
	JournalDigest: spec(JournalDigestEvent{}, 1),
}

func withUpcast(s typeSpec, from uint16, f func([]byte) (Payload, error)) typeSpec {
	if s.upcast == nil {
		s.upcast = map[uint16]func([]byte) (Payload, error){}
	}
	s.upcast[from] = f
	return s
}

// addedSince registers f as the upcast of every schema from from up to
// the current one: each differs from the current only by fields added
// since.
func addedSince(s typeSpec, from uint16, f func([]byte) (Payload, error)) typeSpec {
	for v := from; v < s.current; v++ {
		s = withUpcast(s, v, f)
	}
	return s
}

// CurrentSchema returns the schema version nexus writes for t (0 if unknown).
func CurrentSchema(t Type) uint16 { return registry[t].current }

// wire is the on-journal layout. Short keys keep every event small; the
// payload stays raw until its type and schema are known.
type wire struct {
	Format  uint8  `msgpack:"f"`              // envelope format, EnvelopeFormat; a reader refuses a higher one
	ID      []byte `msgpack:"id"`             // event id: the 16 bytes of a ULID (48-bit ms time, 80 random bits)
	Type    string `msgpack:"t"`              // event type, "<category>.<action>"
	Schema  uint16 `msgpack:"v"`              // payload schema version of this type
	Sandbox string `msgpack:"sb,omitempty"`   // owning sandbox ULID (Crockford base32), absent for none
	Time    int64  `msgpack:"ts"`             // when the fact took effect: Unix time in nanoseconds, UTC
	Saga    string `msgpack:"saga,omitempty"` // saga id (ULID) if a saga step wrote it
	Step    string `msgpack:"step,omitempty"` // saga step name
	// Cause is never written by this version (nothing ever set it); a
	// record an older build wrote with it still decodes, and it is dropped.
	Cause   string             `msgpack:"cause,omitempty"`
	Payload msgpack.RawMessage `msgpack:"p"` // the payload: a map whose keys the type and schema define

	decoded    Payload
	payloadErr error
	id         [16]byte // ID's bytes when it has at most 16: no allocation per event
	key        [8]byte  // the key being read, when it has at most 8 bytes
	typ        [48]byte // the type's bytes, when it has at most 48

	// toJSON, when set, reads the envelope's strings into its buffers
	// and writes the payload as JSON (JSONDecoder) instead of decoding it.
	toJSON                     *JSONDecoder
	transcoded                 bool
	sbJSON, sagaJSON, stepJSON []byte
}

// Encode serialises e. The payload must be the registered type for e.Type
// at its current schema; anything else is a programming error reported as one.
func Encode(e Event) ([]byte, error) {
	s, ok := registry[e.Type]
	if !ok {
		return nil, fmt.Errorf("encode: %w: %q", ErrUnknownType, e.Type)
	}
	if e.Payload == nil || reflect.TypeOf(e.Payload) != s.zero {
		return nil, fmt.Errorf("encode %s: payload is %T, want %v", e.Type, e.Payload, s.zero)
	}
	if e.Schema != s.current {
		return nil, fmt.Errorf("encode %s: schema %d, only %d can be written", e.Type, e.Schema, s.current)
	}
	payload, err := msgpack.Marshal(e.Payload)
	if err != nil {
		return nil, fmt.Errorf("encode %s payload: %w", e.Type, err)
	}
	return msgpack.Marshal(&wire{
		Format: EnvelopeFormat, ID: e.ID[:], Type: string(e.Type), Schema: e.Schema,
		Sandbox: e.Sandbox, Time: e.Time.UnixNano(), Saga: e.Saga, Step: e.Step,
		Payload: payload,
	})
}

// Decode parses one event. Older schemas are upcast to the current payload
// type; an unknown type, a newer schema or damaged bytes return a
// *DecodeError. It never panics on any input.
func Decode(data []byte) (Event, error) {
	w := wirePool.Get().(*wire)
	defer func() {
		*w = wire{}
		wirePool.Put(w)
	}()
	if err := strictDecode(data, w.DecodeMsgpack); err != nil {
		return Event{}, &DecodeError{Err: fmt.Errorf("%w: envelope: %v", ErrMalformed, err)}
	}
	if w.Format > EnvelopeFormat {
		return Event{}, &DecodeError{Type: Type(w.Type), Err: fmt.Errorf("%w: envelope format %d", ErrSchemaTooNew, w.Format)}
	}
	if w.Format == 0 || len(w.ID) != len(ulid.ULID{}) {
		return Event{}, &DecodeError{Type: Type(w.Type), Err: fmt.Errorf("%w: envelope format %d, id of %d bytes", ErrMalformed, w.Format, len(w.ID))}
	}
	t := Type(w.Type)
	s, ok := registry[t]
	if !ok {
		return Event{}, &DecodeError{Type: t, Schema: w.Schema, Err: ErrUnknownType}
	}
	fail := func(err error) (Event, error) {
		return Event{}, &DecodeError{Type: t, Schema: w.Schema, Supported: s.current, Err: err}
	}
	if w.Schema > s.current {
		return fail(ErrSchemaTooNew)
	}
	var payload Payload
	switch {
	case w.payloadErr != nil:
		return fail(fmt.Errorf("%w: payload: %v", ErrMalformed, w.payloadErr))
	case w.decoded != nil:
		payload = w.decoded
	case w.Schema == s.current:
		ptr := reflect.New(s.zero)
		if err := StrictUnmarshal(w.Payload, ptr.Interface()); err != nil {
			return fail(fmt.Errorf("%w: payload: %v", ErrMalformed, err))
		}
		payload = ptr.Elem().Interface().(Payload)
	case s.upcast[w.Schema] != nil:
		p, err := s.upcast[w.Schema](w.Payload)
		if err != nil {
			return fail(fmt.Errorf("%w: upcast from schema %d: %v", ErrMalformed, w.Schema, err))
		}
		payload = p
	default:
		return fail(fmt.Errorf("%w: schema %d never existed", ErrMalformed, w.Schema))
	}
	var id ulid.ULID
	copy(id[:], w.ID)
	return Event{
		Envelope: Envelope{
			ID: id, Type: t, Schema: s.current, Sandbox: w.Sandbox,
			Time: time.Unix(0, w.Time).UTC(), Saga: w.Saga, Step: w.Step,
		},
		Payload: payload,
	}, nil
}

// pooledDec reuses a decoder and its reader across calls: replay decodes
// every event of the journal, and a fresh pair per event showed in profiles.
type pooledDec struct {
	r bytes.Reader
	d *msgpack.Decoder
}

var decPool = sync.Pool{New: func() any { p := &pooledDec{}; p.d = msgpack.NewDecoder(&p.r); return p }}

// StrictUnmarshal decodes one msgpack value from data into v, refusing
// unknown fields and trailing bytes: within one schema version an
// unexpected field means damage or a mislabelled writer. Projections decode
// their snapshots with it too. checkBounds runs first, so no length the
// data declares can make decoding allocate more than the data could hold.
func StrictUnmarshal(data []byte, v any) error {
	return strictDecode(data, func(d *msgpack.Decoder) error { return d.Decode(v) })
}

// strictDecode is StrictUnmarshal with decode reading the value from a
// strict decoder over data.
func strictDecode(data []byte, decode func(*msgpack.Decoder) error) error {
	if err := checkBounds(data); err != nil {
		return err
	}
	p := decPool.Get().(*pooledDec)
	defer decPool.Put(p)
	p.r.Reset(data)
	p.d.Reset(&p.r)
	p.d.DisallowUnknownFields(true)
	return decode(p.d)
}

// wirePool holds envelopes Decode reads into, each with its buffers: a
// whole read decodes every event of a journal or of the fleet, and an
// envelope and its buffers allocated for each showed in profiles. An
// envelope goes back zeroed; what Decode returns shares nothing with it.
var wirePool = sync.Pool{New: func() any { return new(wire) }}

// DecodeMsgpack decodes the envelope in one pass: the payload, written last
// by Encode, is decoded straight into its registered type once t and v are
// known, instead of being captured as RawMessage and decoded again.
func (w *wire) DecodeMsgpack(d *msgpack.Decoder) error {
	n, err := d.DecodeMapLen()
	if err != nil {
		return err
	}
	for i := 0; i < n; i++ {
		k, err := readShort(d, w.key[:])
		if err != nil {
			return err
		}
		switch string(k) {
		case "f":
			w.Format, err = d.DecodeUint8()
		case "id":
			var id []byte
			if id, err = readShort(d, w.id[:]); id != nil {
				w.ID = id
			}
		case "t":
			var t []byte
			if t, err = readShort(d, w.typ[:]); err == nil {
				w.Type = typeName(t)
			}
		case "v":
			w.Schema, err = d.DecodeUint16()
		case "sb":
			if w.toJSON != nil {
				w.sbJSON, err = w.toJSON.envelopeString(w.toJSON.sb[:])
			} else {
				w.Sandbox, err = d.DecodeString()
			}
		case "ts":
			w.Time, err = d.DecodeInt64()
		case "saga":
			if w.toJSON != nil {
				w.sagaJSON, err = w.toJSON.envelopeString(w.toJSON.saga[:])
			} else {
				w.Saga, err = d.DecodeString()
			}
		case "step":
			if w.toJSON != nil {
				w.stepJSON, err = w.toJSON.envelopeString(w.toJSON.step[:])
			} else {
				w.Step, err = d.DecodeString()
			}
		case "cause":
			w.Cause, err = d.DecodeString()
		case "p":
			if w.toJSON != nil {
				// Only a payload of the current schema, after the
				// envelope that names it, and once.
				if s, ok := registry[Type(w.Type)]; !ok || w.Schema != s.current || w.Format != EnvelopeFormat || w.transcoded || !w.toJSON.payload(Type(w.Type)) {
					return errShape
				}
				w.transcoded = true
			} else if s, ok := registry[Type(w.Type)]; ok && w.Schema == s.current && w.Format == EnvelopeFormat {
				scratch := s.scratch.Get()
				ptr := reflect.ValueOf(scratch)
				// Into the value, not through the pointer: msgpack's pointer
				// decoder would set the pointer it was handed to nil for a nil
				// payload, which it cannot (a panic). Into the value, nil is
				// the zero payload, as StrictUnmarshal reads it.
				err = d.DecodeValue(ptr.Elem())
				if err == nil {
					w.decoded = ptr.Elem().Interface().(Payload)
				}
				// Zeroed before it is used again: decoding into a value
				// fills what was there, and the decoded copy shares
				// nothing with it but what this decode allocated.
				ptr.Elem().SetZero()
				s.scratch.Put(scratch)
				if err != nil {
					w.payloadErr = err
					return nil
				}
			} else {
				err = w.Payload.DecodeMsgpack(d)
			}
		default:
			return fmt.Errorf("msgpack: unknown field %q", k)
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// readShort reads one string or binary value (what DecodeString and
// DecodeBytes accept) into buf when it fits, else into a new slice; nil
// for a msgpack nil. An envelope's keys, its id and its type fit: a
// whole read decodes every event of a journal or of the fleet, and a
// string or slice for each of them showed in profiles.
func readShort(d *msgpack.Decoder, buf []byte) ([]byte, error) {
	n, err := d.DecodeBytesLen()
	if err != nil || n < 0 {
		return nil, err
	}
	if n > len(buf) {
		buf = make([]byte, n)
	}
	buf = buf[:n]
	return buf, d.ReadFull(buf)
}

// typeNames are the registered types by name, for typeName.
var typeNames = func() map[string]Type {
	m := make(map[string]Type, len(registry))
	for t := range registry {
		m[string(t)] = t
	}
	return m
}()

// typeName is b as a string, the registered type's own when b names one.
func typeName(b []byte) string {
	if t, ok := typeNames[string(b)]; ok {
		return string(t)
	}
	return string(b)
}
