package main

import (
	"bytes"
	"encoding/json"
	"reflect"
	"testing"
	"time"
)

// TestNormalizeCopiesOnlyWhatItChanges: normalize makes every nil list
// empty and every time UTC at any depth, and a non-nil list of values it
// would leave as they are is the caller's own, not a copy, however long.
func TestNormalizeCopiesOnlyWhatItChanges(t *testing.T) {
	type plain struct {
		Name  string
		Size  int64
		Bytes []byte
		Fixed [2]int
		hid   []int // unexported: neither copied nor encoded
	}
	type timed struct {
		At time.Time
	}
	type listed struct {
		Tags []string
	}
	type doc struct {
		Plain  []plain
		Timed  []timed
		Listed []listed
		Nil    []plain
		At     time.Time
		Ptr    *timed
		Map    map[string]listed
	}
	local := time.FixedZone("X", 3600)
	at := time.Date(2026, 12, 6, 12, 0, 0, 0, local)
	d := doc{
		Plain:  []plain{{Name: "a", Size: 1, hid: []int{1}}, {Name: "b"}},
		Timed:  []timed{{At: at}},
		Listed: []listed{{}},
		At:     at,
		Ptr:    &timed{At: at},
		Map:    map[string]listed{"k": {}},
	}
	got := normalize(reflect.ValueOf(d)).Interface().(doc)

	if &got.Plain[0] != &d.Plain[0] {
		t.Fatal("a list of values normalize leaves as they are was copied")
	}
	for name, tm := range map[string]time.Time{"At": got.At, "Timed[0].At": got.Timed[0].At, "Ptr.At": got.Ptr.At} {
		if tm.Location() != time.UTC || !tm.Equal(at) {
			t.Errorf("%s = %v, want %v in UTC", name, tm, at)
		}
	}
	if d.Timed[0].At.Location() != local || d.Ptr.At.Location() != local {
		t.Error("normalize changed the caller's times in place")
	}
	out, err := json.Marshal(got)
	if err != nil {
		t.Fatal(err)
	}
	want := `{"Plain":[{"Name":"a","Size":1,"Bytes":null,"Fixed":[0,0]},{"Name":"b","Size":0,"Bytes":null,"Fixed":[0,0]}],` +
		`"Timed":[{"At":"2026-12-06T11:00:00Z"}],"Listed":[{"Tags":[]}],"Nil":[],"At":"2026-12-06T11:00:00Z",` +
		`"Ptr":{"At":"2026-12-06T11:00:00Z"},"Map":{"k":{"Tags":[]}}}`
	if string(out) != want {
		t.Fatalf("normalized document\n got %s\nwant %s", out, want)
	}
	for _, c := range []struct {
		v    any
		want bool
	}{{plain{}, true}, {timed{}, false}, {listed{}, false}, {[2]timed{}, false}, {json.RawMessage{}, true}} {
		if got := settled(reflect.TypeOf(c.v)); got != c.want {
			t.Errorf("settled(%T) = %v, want %v", c.v, got, c.want)
		}
	}
}

// TestPrintJSONWritesWhatTheEncoderWrites: printJSON, which writes a
// plain struct a field at a time and its lists an item at a time, writes
// exactly what json.Encoder indented by two spaces writes for the same
// normalized value, for every shape a command prints: escaping, empty and
// omitted fields, nested lists and maps, values that encode themselves,
// and the structs it leaves to the encoder.
func TestPrintJSONWritesWhatTheEncoderWrites(t *testing.T) {
	type item struct {
		Path  string            `json:"path"`
		Size  int64             `json:"allocated_bytes"`
		Error string            `json:"error,omitempty"`
		Tags  []string          `json:"tags"`
		Meta  map[string]string `json:"meta"`
	}
	type report struct {
		Apply   bool              `json:"apply"`
		Plan    string            `json:"plan"`
		Items   []item            `json:"items"`
		Empty   []item            `json:"empty"`
		Nil     []item            `json:"nil"`
		Skipped []item            `json:"skipped,omitempty"`
		Raw     json.RawMessage   `json:"raw"`
		Bytes   []byte            `json:"bytes"`
		Note    string            `json:"note,omitempty"`
		Count   int               `json:"count,omitempty"`
		Ptr     *item             `json:"ptr,omitempty"`
		At      time.Time         `json:"at"`
		Nums    [2]int            `json:"nums"`
		Plain   string            // no tag: its own name
		Hidden  int               `json:"-"`
		Labels  map[string]string `json:"labels"`
		hidden  int
	}
	type withOption struct {
		At time.Time `json:"at,omitzero"`
	}
	type embeds struct {
		item
		Extra string `json:"extra"`
	}
	at := time.Date(2026, 12, 6, 12, 0, 0, 0, time.FixedZone("X", 3600))
	full := report{Plan: "P<&>\u2028", Items: []item{{Path: "/a<b>&c", Size: 1, Tags: []string{"x"}, Meta: map[string]string{"b": "1", "a": "2"}}, {Path: "/d", Error: "e"}},
		Empty: []item{}, Raw: json.RawMessage(`{"z": [1, 2]}`), Bytes: []byte("hi"), Count: 3, Ptr: &item{Path: "p"}, At: at, Plain: "q", Hidden: 9, hidden: 1}
	for name, v := range map[string]any{
		"full": full, "pointer": &full, "zero": report{}, "empty struct": struct{}{},
		"one field": struct {
			L []int `json:"l"`
		}{L: []int{1, 2, 3}},
		"omitzero": withOption{At: at}, "embedded": embeds{Extra: "x"}, "list": []item{{Path: "a"}},
		"map": map[string]int{"a": 1}, "string": "s",
	} {
		var got, want bytes.Buffer
		if err := printJSON(&got, v); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		enc := json.NewEncoder(&want)
		enc.SetIndent("", "  ")
		if err := enc.Encode(normalize(reflect.ValueOf(v)).Interface()); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if got.String() != want.String() {
			t.Errorf("%s: printJSON wrote\n%s\nthe encoder\n%s", name, got.String(), want.String())
		}
	}
	// The report's fields are written one by one, not left to the encoder.
	if _, ok := jsonFieldsOf(reflect.ValueOf(full)); !ok {
		t.Fatal("a plain report is left to the encoder")
	}
}
