package projections

import (
	"slices"
	"testing"
	"time"

	"github.com/oklog/ulid/v2"

	"github.com/nexus-sandbox/nexus/events"
)

// Page walks the view in ID order from any point, and a sandbox that comes
// or goes between pages is seen by the next one (the ordered IDs are
// rebuilt, not kept stale).
func TestSandboxesPage(t *testing.T) {
	s := NewSandboxes()
	var ids []string
	add := func() string {
		id := ulid.Make().String()
		s.Apply(s.Seq()+1, events.New(ulid.Make(), time.Now(), id, events.SandboxCreatedEvent{Image: "i"}))
		return id
	}
	for range 5 {
		ids = append(ids, add())
	}
	got := func(after string, limit int) []string {
		var out []string
		for _, sb := range s.Page(after, limit) {
			out = append(out, sb.ID)
		}
		return out
	}
	for _, c := range []struct {
		after string
		limit int
		want  []string
	}{
		{"", 2, ids[:2]},
		{ids[1], 2, ids[2:4]},
		{ids[3], 10, ids[4:]},
		{ids[4], 10, nil},
		{"", 0, nil},
		{ids[2][:5], 1, ids[:1]}, // a prefix sorts before its IDs
	} {
		if g := got(c.after, c.limit); !slices.Equal(g, c.want) {
			t.Errorf("Page(%q, %d) = %v, want %v", c.after, c.limit, g, c.want)
		}
	}
	later := add()
	s.Apply(s.Seq()+1, events.New(ulid.Make(), time.Now(), ids[4], events.SandboxRemovedEvent{}))
	if g := got(ids[3], 10); !slices.Equal(g, []string{later}) {
		t.Errorf("after a create and an rm, Page = %v, want [%s]", g, later)
	}
	if n := len(s.List()); n != 5 {
		t.Errorf("List has %d sandboxes, want 5", n)
	}
}
