package projections

import (
	"testing"

	"github.com/oklog/ulid/v2"

	"github.com/nexus-sandbox/nexus/events"
)

func TestSandboxesOwnerOf(t *testing.T) {
	s := NewSandboxes()
	a, b := "01KAAAAAAAAAAAAAAAAAAAAAAA", "01KBBBBBBBBBBBBBBBBBBBBBBB"
	for i, id := range []string{a, b} {
		s.Apply(uint64(i+1), events.New(ulid.MustParse(id), t0, id, events.SandboxCreatedEvent{
			Image: "i", Driver: "process",
			Resources: []events.Resource{{Kind: events.KindRawDisk, Path: "disks/" + id + ".raw"}, {Kind: events.KindRawDisk, Path: "disks/shared"}},
		}))
	}
	for _, c := range []struct {
		paths            []string
		except           string
		wantID, wantPath string
	}{
		{[]string{"disks/" + b + ".raw"}, "", b, "disks/" + b + ".raw"},
		{[]string{"disks/nobody", "disks/" + a + ".raw"}, "", a, "disks/" + a + ".raw"},
		{[]string{"disks/shared"}, "", a, "disks/shared"}, // first in List order
		{[]string{"disks/shared"}, a, b, "disks/shared"},  // except skips a
		{[]string{"disks/" + a + ".raw"}, a, "", ""},
		{[]string{"disks/nobody"}, "", "", ""},
	} {
		id, path, found := s.OwnerOf(c.paths, c.except)
		if id != c.wantID || path != c.wantPath || found != (c.wantID != "") {
			t.Errorf("OwnerOf(%v, %q) = %q, %q, %v; want %q, %q", c.paths, c.except, id, path, found, c.wantID, c.wantPath)
		}
	}
}
