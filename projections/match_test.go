package projections

import (
	"errors"
	"math/rand/v2"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/oklog/ulid/v2"

	"github.com/nexus-sandbox/nexus/events"
)

func TestMatch(t *testing.T) {
	refs := []Ref{
		{ID: "01KAAAAAAAAAAAAAAAAAAAAAA1", Handle: "web"},
		{ID: "01KAAAAAAAAAAAAAAAAAAAAAA2", Handle: "01KB"}, // a handle that looks like a prefix
		{ID: "01KBBBBBBBBBBBBBBBBBBBBBB3"},
		{ID: "01KCCCCCCCCCCCCCCCCCCCCCC4", Handle: "01KAAAAAAAAAAAAAAAAAAAAAA1"},
		{ID: "555C0000000000000000000005"}, // an ID that begins as the first one's short ID
	}
	cases := []struct {
		ref, want  string
		noMatch    bool
		candidates []string
	}{
		{ref: "01KAAAAAAAAAAAAAAAAAAAAAA1", want: "01KAAAAAAAAAAAAAAAAAAAAAA1"}, // exact ID beats a handle equal to it
		{ref: "01kaaaaaaaaaaaaaaaaaaaaaa2", want: "01KAAAAAAAAAAAAAAAAAAAAAA2"}, // IDs are case-free
		{ref: "web", want: "01KAAAAAAAAAAAAAAAAAAAAAA1"},
		{ref: "WEB", noMatch: true},                       // handles are exact
		{ref: "01KB", want: "01KAAAAAAAAAAAAAAAAAAAAAA2"}, // handle beats prefix
		{ref: "01KBB", want: "01KBBBBBBBBBBBBBBBBBBBBBB3"},
		{ref: "01kcc", want: "01KCCCCCCCCCCCCCCCCCCCCCC4"},
		{ref: "01KA", candidates: []string{"01KAAAAAAAAAAAAAAAAAAAAAA1", "01KAAAAAAAAAAAAAAAAAAAAAA2"}},
		{ref: "01K", noMatch: true}, // shorter than MinPrefix
		{ref: "01KD", noMatch: true},
		{ref: "", noMatch: true},
		{ref: "we", noMatch: true}, // no handle prefixes
		// Short IDs: ShortID of the first four is 555c0ca8df38,
		// 3a15dcd3e0ef, 56c050b6b4c5, b67dac3c2c71.
		{ref: "3a15dcd3e0ef", want: "01KAAAAAAAAAAAAAAAAAAAAAA2"}, // a whole short ID
		{ref: "3A15DC", want: "01KAAAAAAAAAAAAAAAAAAAAAA2"},       // any case
		{ref: "b67d", want: "01KCCCCCCCCCCCCCCCCCCCCCC4"},         // a unique prefix of one
		{ref: "3a1", noMatch: true},                               // shorter than MinPrefix
		{ref: "56c0", want: "01KBBBBBBBBBBBBBBBBBBBBBB3"},
		{ref: "3a15dcd3e0ef0", noMatch: true}, // longer than a short ID
		// One sandbox's short ID, another's ID: both named, so neither.
		{ref: "555c", candidates: []string{"01KAAAAAAAAAAAAAAAAAAAAAA1", "555C0000000000000000000005"}},
		{ref: "555c0c", want: "01KAAAAAAAAAAAAAAAAAAAAAA1"},
	}
	for _, c := range cases {
		got, err := Match(refs, c.ref)
		var amb *AmbiguousError
		switch {
		case c.noMatch:
			if !errors.Is(err, ErrNoMatch) {
				t.Errorf("Match(%q) = %q, %v; want ErrNoMatch", c.ref, got, err)
			}
		case c.candidates != nil:
			if !errors.As(err, &amb) || !reflect.DeepEqual(amb.Candidates, c.candidates) {
				t.Errorf("Match(%q) = %q, %v; want ambiguous %v", c.ref, got, err, c.candidates)
			}
		default:
			if err != nil || got != c.want {
				t.Errorf("Match(%q) = %q, %v; want %q", c.ref, got, err, c.want)
			}
		}
	}
}

func TestMatchSandbox(t *testing.T) {
	list := []Sandbox{{ID: "01KAAAAAAAAAAAAAAAAAAAAAA1", Handle: "web", State: StateRunning}, {ID: "01KBBBBBBBBBBBBBBBBBBBBBB3"}}
	sb, err := MatchSandbox(list, "01KAA")
	if err != nil || sb.Handle != "web" || sb.State != StateRunning {
		t.Fatalf("MatchSandbox = %+v, %v", sb, err)
	}
	if _, err := MatchSandbox(list, "nope"); !errors.Is(err, ErrNoMatch) || err.Error() != `no sandbox "nope"` {
		t.Fatalf("MatchSandbox(nope) = %v", err)
	}
}

func TestMatchSnapshot(t *testing.T) {
	const a, b = "01KAAAAAAAAAAAAAAAAAAAAAA1", "01KBBBBBBBBBBBBBBBBBBBBBB3"
	refs := []SnapshotRef{
		{ID: "01KSSSSSSSSSSSSSSSSSSSSSS1", Sandbox: a}, {ID: "01KSSSSSSSSSSSSSSSSSSSSST2", Sandbox: a},
		{ID: "01KTTTTTTTTTTTTTTTTTTTTTT3", Sandbox: b},
	}
	if snap, err := MatchSnapshot(refs, "01ktt"); err != nil || snap != "01KTTTTTTTTTTTTTTTTTTTTTT3" {
		t.Fatalf("MatchSnapshot(01ktt) = %s, %v", snap, err)
	}
	short := ShortID(refs[1].ID)
	if snap, err := MatchSnapshot(refs, strings.ToUpper(short[:8])); err != nil || snap != refs[1].ID {
		t.Fatalf("MatchSnapshot(a short ID's prefix) = %s, %v; want %s", snap, err, refs[1].ID)
	}
	var amb *AmbiguousError
	if _, err := MatchSnapshot(refs, "01KSS"); !errors.As(err, &amb) || amb.What != "snapshots" || len(amb.Candidates) != 2 {
		t.Fatalf("MatchSnapshot(01KSS) = %v; want ambiguous between two snapshots", err)
	}
	// A snapshot two sandboxes hold (a history made by hand) is one.
	twice := append(refs, SnapshotRef{ID: refs[2].ID, Sandbox: a})
	if snap, err := MatchSnapshot(twice, "01KTT"); err != nil || snap != refs[2].ID {
		t.Fatalf("MatchSnapshot of a snapshot held twice = %s, %v", snap, err)
	}
	if _, err := MatchSnapshot(refs, a); !errors.Is(err, ErrNoMatch) {
		t.Fatalf("a sandbox ID matched a snapshot: %v", err)
	}
}

// SnapshotsNamed gives MatchSnapshot what it needs to decide: every
// snapshot of the view whose ID or short ID the reference begins, with
// the sandbox SnapshotOwner names, and nothing for a reference no ID
// prefix can be.
func TestSnapshotsNamed(t *testing.T) {
	s := NewSandboxes()
	const a, b = "01KAAAAAAAAAAAAAAAAAAAAAA1", "01KBBBBBBBBBBBBBBBBBBBBBB3"
	snaps := map[string][]string{a: {"01KSSSSSSSSSSSSSSSSSSSSSS1", "01KSSSSSSSSSSSSSSSSSSSSST2"}, b: {"01KTTTTTTTTTTTTTTTTTTTTTT3"}}
	seq := uint64(0)
	for _, id := range []string{a, b} {
		seq++
		s.Apply(seq, events.New(ulid.Make(), time.Now(), id, events.SandboxCreatedEvent{Image: "i", Driver: "process"}))
		for _, snap := range snaps[id] {
			seq++
			s.Apply(seq, events.New(ulid.Make(), time.Now(), id, events.SnapshotTakenEvent{SnapshotID: snap,
				Dir: events.Resource{Kind: events.KindSnapshot, Path: "snapshots/" + id + "/" + snap}}))
		}
	}
	for _, c := range []struct {
		ref  string
		want []SnapshotRef
	}{
		{"01kss", []SnapshotRef{{snaps[a][0], a}, {snaps[a][1], a}}},
		{snaps[b][0], []SnapshotRef{{snaps[b][0], b}}},
		{ShortID(snaps[a][1])[:6], []SnapshotRef{{snaps[a][1], a}}},
		{"01K", nil},    // shorter than MinPrefix
		{"01KA", nil},   // a sandbox's prefix, no snapshot's
		{"01KS-S", nil}, // no ULID has '-'
	} {
		if got := s.SnapshotsNamed(c.ref); !slices.Equal(got, c.want) {
			t.Errorf("SnapshotsNamed(%q) = %v, want %v", c.ref, got, c.want)
		}
	}
}

// snapshot rm journals the directory it reclaimed; the fold forgets that
// snapshot and its ownership, and nothing else.
func TestReclaimedSnapshotLeavesTheView(t *testing.T) {
	dir := func(id string) events.Resource {
		return events.Resource{Kind: events.KindSnapshot, Path: "snapshots/" + exitSB + "/" + id}
	}
	sb := foldExit(append(running(),
		events.SnapshotTakenEvent{SnapshotID: "S1", Dir: dir("S1")},
		events.SnapshotTakenEvent{SnapshotID: "S2", Dir: dir("S2")},
		events.ResourceReclaimedEvent{Resource: dir("S1"), By: "snapshot rm"},
	))
	if !reflect.DeepEqual(sb.Snapshots, []string{"S2"}) || sb.Owns(dir("S1").Path) || !sb.Owns(dir("S2").Path) {
		t.Fatalf("after reclaiming S1: snapshots %v, resources %v", sb.Snapshots, sb.Resources)
	}
	sb = foldExit(append(running(),
		events.SnapshotTakenEvent{SnapshotID: "S1", Dir: dir("S1")},
		events.ResourceReclaimedEvent{Resource: events.Resource{Kind: events.KindSnapshot, Path: "snapshots/" + exitSB}, By: "rm"},
	))
	if !reflect.DeepEqual(sb.Snapshots, []string{"S1"}) {
		t.Fatalf("reclaiming the parent directory dropped a snapshot: %v", sb.Snapshots)
	}
	sb = foldExit(append(running(),
		events.SnapshotTakenEvent{SnapshotID: "S1", Dir: dir("S1")},
		events.ResourceReclaimedEvent{Resource: dir("S1"), By: "snapshot rm"},
	))
	if sb.Snapshots != nil {
		t.Fatalf("last snapshot reclaimed: %#v, want nil", sb.Snapshots)
	}
}

func TestShortID(t *testing.T) {
	// The form is what operators type and scripts keep: pinned.
	for id, want := range map[string]string{
		"01KAAAAAAAAAAAAAAAAAAAAAA1": "555c0ca8df38",
		"01kaaaaaaaaaaaaaaaaaaaaaa1": "555c0ca8df38", // IDs are case-free
		"01KBBBBBBBBBBBBBBBBBBBBBB3": "56c050b6b4c5",
	} {
		if got := ShortID(id); got != want {
			t.Errorf("ShortID(%s) = %s, want %s", id, got, want)
		}
	}
	// Sandboxes made in one millisecond (a fork's children) share the
	// ULID's timestamp and, as ulid.Make increments its entropy within a
	// millisecond, most of its random part: their short IDs still differ.
	ms := ulid.Timestamp(time.Date(2026, 12, 5, 0, 0, 0, 0, time.UTC))
	entropy := ulid.Monotonic(rand.NewChaCha8([32]byte{1}), 0)
	seen := map[string]string{}
	first := ulid.MustNew(ms, entropy).String()
	for range 1000 {
		id := ulid.MustNew(ms, entropy).String()
		s := ShortID(id)
		if len(s) != ShortLen || strings.Trim(s, "0123456789abcdef") != "" {
			t.Fatalf("ShortID(%s) = %q: want %d hex digits", id, s, ShortLen)
		}
		if other, dup := seen[s]; dup {
			t.Fatalf("ShortID(%s) = ShortID(%s) = %s", id, other, s)
		}
		seen[s] = id
		if id[:ShortLen] != first[:ShortLen] {
			t.Fatalf("%s and %s differ in their first %d characters: the case this test is for is not made", first, id, ShortLen)
		}
	}
}
