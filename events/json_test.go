package events

import (
	"bytes"
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"testing"

	"github.com/vmihailenco/msgpack/v5"
)

// sameAsDecode fails unless d gives for data what Decode gives, the
// payload as json.Marshal writes Decode's: the same error, or the same
// envelope and the same payload bytes.
func sameAsDecode(t *testing.T, d *JSONDecoder, data []byte) {
	t.Helper()
	want, werr := Decode(data)
	got, gerr := d.Decode(data)
	if werr != nil || gerr != nil {
		if werr == nil || gerr == nil || werr.Error() != gerr.Error() {
			t.Fatalf("% x: Decode: %v; JSONDecoder: %v", data, werr, gerr)
		}
		return
	}
	payload, err := json.Marshal(want.Payload)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got.Payload, payload) {
		t.Fatalf("%s payload:\n got %s\nwant %s", want.Type, got.Payload, payload)
	}
	if got.ID != want.ID || got.Type != want.Type || !got.Time.Equal(want.Time) || got.Time.Location() != want.Time.Location() ||
		string(got.Sandbox) != want.Sandbox || string(got.Saga) != want.Saga || string(got.Step) != want.Step {
		t.Fatalf("%s envelope: got %+v, want %+v", want.Type, got, want.Envelope)
	}
}

// filled is a value of t with every field set: strings that JSON escapes
// or not, extreme numbers, slices of two, maps of several keys out of
// order; with empty set, every string, slice and map is empty but not
// nil, and every number zero.
func filled(t reflect.Type, empty bool, n int) reflect.Value {
	v := reflect.New(t).Elem()
	strs := []string{"disks/01JDQ4Z6X1M9A3Y0C5TB2R8NKW.raw", "<a&b> \"q\" \\ é \u2028 \x01 \x7f", "\xff\xfe invalid", "plain"}
	switch t.Kind() {
	case reflect.String:
		if !empty {
			v.SetString(strs[n%len(strs)])
		}
	case reflect.Int, reflect.Int64:
		if !empty {
			v.SetInt([]int64{math.MinInt64, -1, 42, math.MaxInt64}[n%4])
		}
	case reflect.Uint, reflect.Uint64:
		if !empty {
			v.SetUint([]uint64{math.MaxUint64, 1, 7}[n%3])
		}
	case reflect.Bool:
		v.SetBool(!empty)
	case reflect.Slice:
		k := 2
		if empty {
			k = 0
		}
		s := reflect.MakeSlice(t, k, k)
		for i := range k {
			s.Index(i).Set(filled(t.Elem(), false, n+i))
		}
		v.Set(s)
	case reflect.Map:
		m := reflect.MakeMap(t)
		if !empty {
			for i, k := range []string{"zeta", "alpha", "<k>", "m\xff", "b"} {
				m.SetMapIndex(reflect.ValueOf(k).Convert(t.Key()), filled(t.Elem(), false, n+i))
			}
		}
		v.Set(m)
	case reflect.Struct:
		for i := range t.NumField() {
			v.Field(i).Set(filled(t.Field(i).Type, empty, n+i))
		}
	}
	return v
}

// Every type, zero, filled and empty-but-not-nil, in a saga or not,
// decodes through the transcoding (not Decode) to Decode's result.
func TestJSONDecoderIsDecodeForEveryType(t *testing.T) {
	var d JSONDecoder
	for _, typ := range Types() {
		s := registry[typ]
		if jsonPlans()[typ] == nil {
			t.Errorf("%s: no JSON plan", typ)
			continue
		}
		for i, p := range []reflect.Value{reflect.Zero(s.zero), filled(s.zero, false, 0), filled(s.zero, false, 1), filled(s.zero, true, 0)} {
			e := New(testID, testTime, testSandbox, p.Interface().(Payload))
			if i%2 == 1 {
				e = e.InSaga("01JDQ4Z6X1M9A3Y0C5TB2R8NKX", "commit")
			}
			if i == 3 {
				e.Sandbox = ""
			}
			data, err := Encode(e)
			if err != nil {
				t.Fatal(err)
			}
			if !d.transcode(data) {
				t.Errorf("%s value %d: not transcoded", typ, i)
			}
			sameAsDecode(t, &d, data)
		}
	}
}

// Records in shapes the transcoding does not cover, or that Decode
// refuses, come out as Decode's: older schemas upcast, fields out of
// order or absent, a map's key twice, a struct as an array or nil,
// unknown fields, damage.
func TestJSONDecoderIsDecodeForOtherShapes(t *testing.T) {
	var d JSONDecoder
	env := func(typ Type, schema uint16, payload any) []byte {
		return rawEvent(t, wire{Type: string(typ), Schema: schema, Sandbox: testSandbox, Time: testTime.UnixNano(), Payload: payloadBytes(t, payload)})
	}
	res := map[string]any{"kind": "raw-disk", "path": "disks/x.raw"}
	cases := map[string][]byte{
		"upcast v1":           env(SandboxCreated, 1, sandboxCreatedV1{Handle: "h", Image: "img", Driver: "process", Disk: "disks/x.raw"}),
		"fields reordered":    env(DiskMaterialised, 1, map[string]any{"method": "reflink", "resource": res}),
		"fields absent":       env(SupervisorStarted, 1, map[string]any{"socket": "s"}),
		"no fields":           env(SandboxCreated, CurrentSchema(SandboxCreated), map[string]any{}),
		"label twice":         rawEvent(t, wire{Type: string(VolumeCreated), Schema: CurrentSchema(VolumeCreated), Time: 1, Payload: []byte{0x82, 0xa4, 'n', 'a', 'm', 'e', 0xa1, 'v', 0xa6, 'l', 'a', 'b', 'e', 'l', 's', 0x83, 0xa1, 'b', 0xa1, '1', 0xa1, 'a', 0xa1, '2', 0xa1, 'b', 0xa1, '3'}}),
		"labels nil":          env(VolumeCreated, CurrentSchema(VolumeCreated), map[string]any{"name": "v", "labels": nil}),
		"struct as array":     env(IntentRetired, 1, map[string]any{"resource": []any{"raw-disk", "p"}}),
		"struct nil":          env(IntentRetired, 1, map[string]any{"resource": nil}),
		"payload nil":         env(SandboxStopped, 1, nil),
		"slice nil":           env(SagaStarted, 1, map[string]any{"kind": "create", "steps": nil}),
		"slice of nil":        env(SandboxStarted, 1, map[string]any{"sockets": []any{nil}}),
		"unknown field":       env(SandboxStopped, 1, map[string]any{"reason": "r", "surprise": 1}),
		"field twice":         rawEvent(t, wire{Type: string(SandboxStopped), Schema: 1, Time: 1, Payload: []byte{0x82, 0xa6, 'r', 'e', 'a', 's', 'o', 'n', 0xa1, 'a', 0xa6, 'r', 'e', 'a', 's', 'o', 'n', 0xa1, 'b'}}),
		"string as binary":    env(SandboxStopped, 1, map[string]any{"reason": []byte("bin")}),
		"number as string":    env(ImageCacheUsed, 1, map[string]any{"cache_id": "c", "last_use_ms": "5"}),
		"uint as negative":    env(JournalDigest, 1, map[string]any{"seq": -1, "digest": "00"}),
		"int as uint64 max":   env(ImageCacheUsed, 1, map[string]any{"cache_id": "c", "last_use_ms": uint64(math.MaxUint64)}),
		"bool as int":         env(VolumeAttached, 1, map[string]any{"name": "v", "read_only": 1}),
		"newer schema":        env(SandboxStopped, 2, map[string]any{}),
		"unknown type":        env("sandbox.teleported", 1, map[string]any{}),
		"no id":               rawEvent(t, wire{ID: []byte{1}, Type: string(SandboxStopped), Schema: 1, Payload: payloadBytes(t, map[string]any{})}),
		"payload before type": payloadBytes(t, map[string]any{"p": msgpack.RawMessage(payloadBytes(t, map[string]any{"reason": "r"})), "f": 1, "id": testID[:], "t": string(SandboxStopped), "v": 1, "ts": 1}),
		"payload twice":       payloadBytes(t, []any{}), // replaced below
		"not msgpack":         []byte("{}"),
		"empty":               nil,
	}
	twice, err := msgpack.Marshal(map[string]any{"f": 1, "id": testID[:], "t": string(SandboxStopped), "v": 1, "ts": 1})
	if err != nil {
		t.Fatal(err)
	}
	p := payloadBytes(t, map[string]any{"reason": "r"})
	twice[0] += 2 // two more entries: "p" twice
	for range 2 {
		twice = append(append(twice, 0xa1, 'p'), p...)
	}
	cases["payload twice"] = twice
	// A transcoded record first, so a fallback after it must not keep
	// anything of it.
	good, err := Encode(New(testID, testTime, testSandbox, samples[0]).InSaga("s", "step"))
	if err != nil {
		t.Fatal(err)
	}
	for name, data := range cases {
		t.Run(strings.ReplaceAll(name, " ", "_"), func(t *testing.T) {
			sameAsDecode(t, &d, good)
			sameAsDecode(t, &d, data)
			for n := range len(data) {
				sameAsDecode(t, &d, data[:n])
			}
		})
	}
}

// FuzzJSONDecoder: whatever the bytes, the decoder gives Decode's result.
func FuzzJSONDecoder(f *testing.F) {
	for _, p := range samples {
		data, err := Encode(New(testID, testTime, testSandbox, p))
		if err != nil {
			f.Fatal(err)
		}
		f.Add(data)
	}
	if seeds, err := filepath.Glob("testdata/fuzz/FuzzDecode/*"); err == nil {
		for _, s := range seeds {
			if b, err := os.ReadFile(s); err == nil {
				if data, ok := corpusBytes(string(b)); ok {
					f.Add(data)
				}
			}
		}
	}
	var d JSONDecoder
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, data []byte) { sameAsDecode(t, &d, data) })
}

// corpusBytes is the []byte of a file of Go's fuzzing corpus.
func corpusBytes(file string) ([]byte, bool) {
	_, v, _ := strings.Cut(file, "\n")
	v, ok := strings.CutPrefix(strings.TrimSpace(v), "[]byte(")
	if !ok {
		return nil, false
	}
	s, err := strconv.Unquote(strings.TrimSuffix(v, ")"))
	return []byte(s), err == nil
}
