package projections

import (
	"errors"
	"reflect"
	"testing"

	"github.com/nexus-sandbox/nexus/events"
)

func TestMatch(t *testing.T) {
	refs := []Ref{
		{ID: "01KAAAAAAAAAAAAAAAAAAAAAA1", Handle: "web"},
		{ID: "01KAAAAAAAAAAAAAAAAAAAAAA2", Handle: "01KB"}, // a handle that looks like a prefix
		{ID: "01KBBBBBBBBBBBBBBBBBBBBBB3"},
		{ID: "01KCCCCCCCCCCCCCCCCCCCCCC4", Handle: "01KAAAAAAAAAAAAAAAAAAAAAA1"},
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
	list := []Sandbox{
		{ID: "01KAAAAAAAAAAAAAAAAAAAAAA1", Snapshots: []string{"01KSSSSSSSSSSSSSSSSSSSSSS1", "01KSSSSSSSSSSSSSSSSSSSSST2"}},
		{ID: "01KBBBBBBBBBBBBBBBBBBBBBB3", Snapshots: []string{"01KTTTTTTTTTTTTTTTTTTTTTT3"}},
	}
	snap, sb, err := MatchSnapshot(list, "01ktt")
	if err != nil || snap != "01KTTTTTTTTTTTTTTTTTTTTTT3" || sb.ID != list[1].ID {
		t.Fatalf("MatchSnapshot(01ktt) = %s, %s, %v", snap, sb.ID, err)
	}
	var amb *AmbiguousError
	if _, _, err := MatchSnapshot(list, "01KSS"); !errors.As(err, &amb) || amb.What != "snapshots" || len(amb.Candidates) != 2 {
		t.Fatalf("MatchSnapshot(01KSS) = %v; want ambiguous between two snapshots", err)
	}
	if _, _, err := MatchSnapshot(list, list[0].ID); !errors.Is(err, ErrNoMatch) {
		t.Fatalf("a sandbox ID matched a snapshot: %v", err)
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
