package store_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/oklog/ulid/v2"

	"github.com/nexus-sandbox/nexus/events"
	"github.com/nexus-sandbox/nexus/projections"
	"github.com/nexus-sandbox/nexus/store"
)

// snapshotTaken is sandbox id's snapshot snap, in snapshots/<id>/<snap>.
func snapshotTaken(id, snap string) events.Event {
	return events.New(ulid.Make(), time.Now(), id, events.SnapshotTakenEvent{SnapshotID: snap,
		Dir: events.Resource{Kind: events.KindSnapshot, Path: "snapshots/" + id + "/" + snap}})
}

// Who owns a path is a point lookup in the store's index: asked about
// every disk of a root of 1,000 sandboxes, and about directories holding
// owned paths and paths below owned directories (answered from the
// records at rest and from those an event touched since), PathOwners
// answers each by projections.PathOwner's rule and decodes no record, in
// one read of the store. An owner found by reading the sandboxes would
// count 1,000.
func TestPathOwnersArePointLookups(t *testing.T) {
	ctx := context.Background()
	root := t.TempDir()
	nd, err := store.Open(ctx, root, store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	var evs []events.Event
	for range 1000 {
		id := ulid.Make().String()
		ids = append(ids, id)
		evs = append(evs, events.New(ulid.Make(), time.Now(), id, events.SandboxCreatedEvent{Image: "i", Driver: "process",
			Resources: []events.Resource{{Kind: events.KindRawDisk, Path: "disks/" + id + ".raw"}, {Kind: events.KindWorkspaceDisk, Path: "disks/" + id + "-workspace.ext4"}}}))
	}
	stored, touched := ids[7], ids[9]
	evs = append(evs, snapshotTaken(stored, "S1"))
	if _, err := nd.Append(ctx, evs...); err != nil {
		t.Fatal(err)
	}
	if err := nd.Close(); err != nil { // the first Close writes the records at rest
		t.Fatal(err)
	}
	nd, err = store.Open(ctx, root, store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer nd.Close()
	if _, err := nd.Append(ctx, snapshotTaken(touched, "S2")); err != nil {
		t.Fatal(err)
	}
	want := map[string]string{
		"snapshots/" + stored:                stored, // a path below it is owned
		"snapshots/" + touched:               touched,
		"snapshots/" + stored + "/S1/memory": stored, // a directory above it is owned
		"snapshots/" + touched + "/S2":       touched,
		"disks/nobody.raw":                   "",
		"snapshots":                          "",
	}
	for _, id := range ids {
		want["disks/"+id+".raw"] = id
		want["disks/"+id+"-workspace.ext4"] = id
	}
	var paths []string
	for p := range want {
		paths = append(paths, p)
	}
	before, txs := nd.Decoded(), nd.ReadTxs()
	got, err := nd.PathOwners(ctx, paths)
	if err != nil {
		t.Fatal(err)
	}
	if n := nd.Decoded() - before; n != 0 {
		t.Fatalf("PathOwners of %d paths decoded %d records, want none", len(paths), n)
	}
	// One read of the store for the whole batch, not one per path.
	if n := nd.ReadTxs() - txs; n != 1 {
		t.Fatalf("PathOwners of %d paths began %d read transactions, want 1", len(paths), n)
	}
	for i, p := range paths {
		if got[i] != want[p] {
			t.Errorf("owner of %s = %q, want %q", p, got[i], want[p])
		}
	}
}

// A snapshot reference's candidates are seeks in the store's snapshot
// indexes: a prefix of a snapshot's ID or of its short ID, of a sandbox
// at rest or of one an event touched since, names it and its sandbox
// without decoding a record, and a prefix of every snapshot lists at most
// NamedLimit of each kind, still ambiguous.
func TestSnapshotsNamedAreSeeks(t *testing.T) {
	ctx := context.Background()
	root := t.TempDir()
	nd, err := store.Open(ctx, root, store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	const sandboxes = 500 // with their snapshots, the 1,000 events a Close writes at rest
	var ids, snaps []string
	var evs []events.Event
	for range sandboxes {
		id, snap := ulid.Make().String(), ulid.Make().String()
		ids, snaps = append(ids, id), append(snaps, snap)
		evs = append(evs, events.New(ulid.Make(), time.Now(), id, events.SandboxCreatedEvent{Image: "i", Driver: "process"}),
			snapshotTaken(id, snap))
	}
	if _, err := nd.Append(ctx, evs...); err != nil {
		t.Fatal(err)
	}
	if err := nd.Close(); err != nil { // the first Close writes the records at rest
		t.Fatal(err)
	}
	nd, err = store.Open(ctx, root, store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer nd.Close()
	touched, taken := ids[9], ulid.Make().String()
	if _, err := nd.Append(ctx, snapshotTaken(touched, taken)); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ ref, snap, of string }{
		{strings.ToLower(snaps[7][:len(snaps[7])-1]), snaps[7], ids[7]},
		{projections.ShortID(snaps[7])[:8], snaps[7], ids[7]},
		{strings.ToUpper(projections.ShortID(snaps[9])), snaps[9], touched}, // at rest, its sandbox touched since
		{projections.ShortID(taken)[:8], taken, touched},
		{strings.ToLower(taken), taken, touched},
	} {
		before := nd.Decoded()
		refs, err := nd.SnapshotsNamed(ctx, c.ref)
		if err != nil {
			t.Fatal(err)
		}
		if n := nd.Decoded() - before; n != 0 {
			t.Errorf("SnapshotsNamed(%q) decoded %d records, want none", c.ref, n)
		}
		snap, err := projections.MatchSnapshot(refs, c.ref)
		if err != nil || snap != c.snap {
			t.Errorf("MatchSnapshot(SnapshotsNamed(%q)) = %s, %v; want %s", c.ref, snap, err, c.snap)
		}
		if i := slices.IndexFunc(refs, func(r projections.SnapshotRef) bool { return r.ID == c.snap }); i < 0 || refs[i].Sandbox != c.of {
			t.Errorf("SnapshotsNamed(%q) = %v: want %s held by %s", c.ref, refs, c.snap, c.of)
		}
	}
	// The records are at rest: reading one decodes it.
	before := nd.Decoded()
	if _, found, err := nd.Sandbox(ctx, ids[7]); err != nil || !found || nd.Decoded()-before != 1 {
		t.Fatalf("reading a sandbox at rest decoded %d records (found %v, %v), want 1", nd.Decoded()-before, found, err)
	}
	// Every snapshot here was made within seconds: they share a prefix.
	all := snaps[0][:projections.MinPrefix]
	refs, err := nd.SnapshotsNamed(ctx, all)
	if err != nil {
		t.Fatal(err)
	}
	var amb *projections.AmbiguousError
	if _, err := projections.MatchSnapshot(refs, all); len(refs) > 2*store.NamedLimit+1 || !errors.As(err, &amb) {
		t.Fatalf("a prefix of every snapshot gave %d candidates (%v), want at most %d, ambiguous", len(refs), err, 2*store.NamedLimit+1)
	}
}
