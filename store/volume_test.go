package store

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/oklog/ulid/v2"

	"github.com/nexus-sandbox/nexus/core"
	"github.com/nexus-sandbox/nexus/events"
	"github.com/nexus-sandbox/nexus/host/journal"
)

func volCreated(name string) events.Event {
	return events.New(ulid.Make(), time.Now(), "", events.VolumeCreatedEvent{Name: name, Path: "volumes/" + name, SizeBytes: 1})
}

func volRemoved(name string) events.Event {
	return events.New(ulid.Make(), time.Now(), "", events.VolumeRemovedEvent{Name: name})
}

// admitAll switches the store's admission off until the test ends, so
// only the journal's own checks stand.
func admitAll(t *testing.T) {
	admit = func(_ core.Journal, _ []core.Expect, evs []events.Event) (int, error) { return len(evs), nil }
	t.Cleanup(func() { admit = core.Admit })
}

// volumeEvents lists the types of the volume events the journal holds
// about name, on any subject.
func volumeEvents(t *testing.T, n *Store, name string) []events.Type {
	t.Helper()
	var out []events.Type
	err := n.Events(context.Background(), Query{Types: []string{"volume"}}, func(r Record) error {
		for _, ent := range core.EntitiesOf(r.Event) {
			if ent == core.Volume(name) {
				out = append(out, r.Event.Type)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// Two appends decided on the same revision of a volume: with the store's
// admission switched off, the expected sequence on the volume's own
// subject alone keeps the second out, for two creates of one name and for
// two removals of one volume.
func TestJournalRefusesAStaleVolumeDecision(t *testing.T) {
	ctx := context.Background()
	n := openTestNode(t)
	admitAll(t)

	first, err := n.AppendExpect(ctx, []core.Expect{{Entity: core.Volume("data")}}, volCreated("data"))
	if err != nil {
		t.Fatal(err)
	}
	_, err = n.AppendExpect(ctx, []core.Expect{{Entity: core.Volume("data")}}, volCreated("data"))
	var stale *core.StaleError
	if !errors.As(err, &stale) || stale.Entity != core.Volume("data") || stale.Actual != first[0] {
		t.Fatalf("a create of data decided before data was created = %v, want stale on volume/data at %d", err, first[0])
	}

	rev := n.Rev(core.Volume("data"))
	removed, err := n.AppendExpect(ctx, []core.Expect{{Entity: core.Volume("data"), Seq: rev}}, volRemoved("data"))
	if err != nil {
		t.Fatal(err)
	}
	_, err = n.AppendExpect(ctx, []core.Expect{{Entity: core.Volume("data"), Seq: rev}}, volRemoved("data"))
	if !errors.As(err, &stale) || stale.Entity != core.Volume("data") {
		t.Fatalf("a second removal decided on the same revision = %v, want stale on volume/data", err)
	}
	want := []events.Type{events.VolumeCreated, events.VolumeRemoved}
	if got := volumeEvents(t, n, "data"); len(got) != 2 || got[0] != want[0] || got[1] != want[1] {
		t.Fatalf("journal holds %v about data, want %v", got, want)
	}

	// A removed volume is at its removal: a new volume of the name
	// expects that, and one decided on an unused name (0) is refused.
	if got := n.Rev(core.Volume("data")); got != removed[0] {
		t.Fatalf("Rev(volume/data) after its removal = %d, want the removal's %d", got, removed[0])
	}
	if _, err := n.AppendExpect(ctx, []core.Expect{{Entity: core.Volume("data")}}, volCreated("data")); !errors.As(err, &stale) {
		t.Fatalf("a create of data decided before its first create = %v, want stale", err)
	}
	if _, err := n.AppendExpect(ctx, []core.Expect{{Entity: core.Volume("data"), Seq: removed[0]}}, volCreated("data")); err != nil {
		t.Fatalf("a create of data decided after its removal: %v", err)
	}
	// Another volume's subject is its own: a decision about it is not
	// refused for data's events.
	if _, err := n.AppendExpect(ctx, []core.Expect{{Entity: core.Volume("data2")}}, volCreated("data2")); err != nil {
		t.Fatalf("create of data2: %v", err)
	}
}

// A journal written when every volume event was on the shared subject
// (nexus.events.volume.<action>._): its volumes fold as before, the first
// decision about one after the upgrade is admitted at the revision the
// old event gave it, and a second decision on that revision is refused by
// the journal alone.
func TestVolumeOnTheSharedSubjectIsChecked(t *testing.T) {
	ctx := context.Background()
	root := t.TempDir()
	n, err := Open(ctx, root, Options{})
	if err != nil {
		t.Fatal(err)
	}
	legacy := volCreated("old")
	data, err := events.Encode(legacy)
	if err != nil {
		t.Fatal(err)
	}
	shared, _ := events.Subject(events.VolumeCreated, "")
	ack, err := n.j.Append(ctx, journal.Message{Subject: shared, ID: legacy.DedupID(), Data: data})
	if err != nil {
		t.Fatal(err)
	}
	n.Close()
	if n, err = Open(ctx, root, Options{}); err != nil {
		t.Fatal(err)
	}
	defer n.Close()

	rev := n.Rev(core.Volume("old"))
	if rev != ack.Seq {
		t.Fatalf("Rev(volume/old) = %d, want its create on the shared subject, %d", rev, ack.Seq)
	}
	admitAll(t)
	if _, err := n.AppendExpect(ctx, []core.Expect{{Entity: core.Volume("old"), Seq: rev}}, volRemoved("old")); err != nil {
		t.Fatalf("removal of a volume created on the shared subject: %v", err)
	}
	_, err = n.AppendExpect(ctx, []core.Expect{{Entity: core.Volume("old"), Seq: rev}}, volRemoved("old"))
	var stale *core.StaleError
	if !errors.As(err, &stale) || stale.Entity != core.Volume("old") {
		t.Fatalf("a second removal decided on the shared subject's revision = %v, want stale on volume/old", err)
	}
	if got := volumeEvents(t, n, "old"); len(got) != 2 {
		t.Fatalf("journal holds %v about old, want its create and one removal", got)
	}
}
