package events

import (
	"bytes"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/oklog/ulid/v2"
	"github.com/vmihailenco/msgpack/v5"
)

func TestCheckBounds(t *testing.T) {
	e := New(ulid.Make(), time.Now(), ulid.Make().String(), SandboxCreatedEvent{Image: "img", Driver: "process",
		Resources: []Resource{{Kind: KindRawDisk, Path: "disks/x.raw"}}})
	good, err := Encode(e)
	if err != nil {
		t.Fatal(err)
	}
	if err := checkBounds(good); err != nil {
		t.Fatalf("a record nexus wrote: %v", err)
	}
	deep := bytes.Repeat([]byte{0x91}, maxDepth+2)
	for name, bad := range map[string][]byte{
		"array32 of 0xdddddddd": {0xdd, 0xdd, 0xdd, 0xdd, 0xdd},
		"map16 past the end":    {0xde, 0x00, 0x05, 0x01},
		"str8 past the end":     {0xd9, 0x10, 'a'},
		"truncated record":      good[:len(good)-1],
		"trailing bytes":        append(append([]byte{}, good...), 0xc0),
		"reserved code":         {0xc1},
		"nested too deep":       append(deep, 0xc0),
		"empty":                 {},
	} {
		if err := checkBounds(bad); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	if _, err := Decode([]byte{0xdd, 0xdd, 0xdd, 0xdd, 0xdd}); !errors.Is(err, ErrMalformed) {
		t.Fatalf("Decode of a huge declared array: %v", err)
	}
}

// FuzzCheckBounds: checkBounds accepts exactly the single, complete values
// the library itself can walk (within the nesting limit), so it never
// refuses a record nexus could read and never lets through one that
// declares more than it holds.
func FuzzCheckBounds(f *testing.F) {
	e := New(ulid.Make(), time.Now(), "", VolumeCreatedEvent{Name: "v", SizeBytes: 1})
	good, _ := Encode(e)
	f.Add(good)
	f.Add([]byte{0xdd, 0xdd, 0xdd, 0xdd, 0xdd})
	f.Add([]byte{0x92, 0xd7, 0xff, 1, 2, 3, 4, 5, 6, 7, 8, 0xc0})
	f.Fuzz(func(t *testing.T, data []byte) {
		ours := checkBounds(data)
		r := bytes.NewReader(data)
		d := msgpack.NewDecoder(r)
		lib := d.Skip()
		libOK := lib == nil && r.Len() == 0
		if ours == nil && !libOK {
			t.Fatalf("checkBounds accepted what the library cannot walk (%v, %d left)", lib, r.Len())
		}
		if ours != nil && libOK && !strings.Contains(ours.Error(), "nested deeper") {
			t.Fatalf("checkBounds refused a complete value: %v", ours)
		}
	})
}
