package main

import (
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
