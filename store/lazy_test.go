package store_test

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/oklog/ulid/v2"

	"github.com/nexus-sandbox/nexus/core"
	"github.com/nexus-sandbox/nexus/events"
	"github.com/nexus-sandbox/nexus/projections"
	"github.com/nexus-sandbox/nexus/store"
)

// fillRoot journals n committed sandboxes (two disks each, handle sb-<i>)
// into a new root, closes it (which writes the snapshots) and returns the
// root and the sandbox IDs in creation order.
func fillRoot(tb testing.TB, n int) (string, []string) {
	tb.Helper()
	ctx := context.Background()
	root := tb.TempDir()
	nd, err := store.Open(ctx, root, store.Options{})
	if err != nil {
		tb.Fatal(err)
	}
	var ids []string
	for from := 0; from < n; from += 1000 {
		evs := make([]events.Event, min(1000, n-from))
		for i := range evs {
			id := ulid.Make().String()
			ids = append(ids, id)
			evs[i] = events.New(ulid.Make(), time.Now(), id, events.SandboxCreatedEvent{
				Handle: fmt.Sprintf("sb-%d", from+i), Image: "ghcr.io/nexus/base:24.04", Driver: "process",
				Resources: []events.Resource{{Kind: events.KindRawDisk, Path: "disks/" + id + ".raw"}, {Kind: events.KindWorkspaceDisk, Path: "disks/" + id + "-workspace.ext4"}},
			})
		}
		if _, err := nd.Append(ctx, evs...); err != nil {
			tb.Fatal(err)
		}
	}
	if err := nd.Close(); err != nil {
		tb.Fatal(err)
	}
	return root, ids
}

// TestLazyOpenDecodesOnlyTheSandboxAsked is the structural O(1) test
// without a daemon: on a root of 2,000 sandboxes (snapshots written,
// plus a tail), a lazy Open and a read of one sandbox by ID decode that
// sandbox's events alone (Decoded), and the record equals what a full load
// holds. A store that decoded the projections to answer would count 2,000.
func TestLazyOpenDecodesOnlyTheSandboxAsked(t *testing.T) {
	ctx := context.Background()
	root, ids := fillRoot(t, 2000)
	target := ids[1234]
	// A tail after the snapshots, about the target and another sandbox.
	nd, err := store.Open(ctx, root, store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	tail := []events.Event{
		events.New(ulid.Make(), time.Now(), target, events.SandboxStartedEvent{VMMPid: 42, VMMStart: 7}),
		events.New(ulid.Make(), time.Now(), ids[5], events.SandboxStartedEvent{VMMPid: 43, VMMStart: 8}),
		events.New(ulid.Make(), time.Now(), target, events.SandboxStoppedEvent{}),
	}
	if _, err := nd.Append(ctx, tail...); err != nil {
		t.Fatal(err)
	}
	want, found, err := nd.Sandbox(ctx, target)
	if err != nil || !found {
		t.Fatalf("full node: %v %v", found, err)
	}
	if err := nd.Close(); err != nil {
		t.Fatal(err)
	}

	lazy, err := store.Open(ctx, root, store.Options{Lazy: true})
	if err != nil {
		t.Fatal(err)
	}
	defer lazy.Close()
	if d := lazy.Decoded(); d != 0 {
		t.Fatalf("a lazy Open decoded %d records before anything was asked", d)
	}
	for _, ref := range []string{target, strings.ToLower(target)} {
		before := lazy.Decoded()
		got, found, err := lazy.Sandbox(ctx, ref)
		if err != nil || !found {
			t.Fatalf("lazy Sandbox(%s): %v %v", ref, found, err)
		}
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("lazy Sandbox(%s) = %+v, want the full view's %+v", ref, got, want)
		}
		// sandbox.created, started, stopped: its own three events.
		if d := lazy.Decoded() - before; d != 3 {
			t.Fatalf("reading one sandbox of 2,000 decoded %d records, want its own 3 events", d)
		}
	}
	if _, found, err := lazy.Sandbox(ctx, ulid.Make().String()); err != nil || found {
		t.Fatalf("an unknown ID: found %v, %v", found, err)
	}
	// A handle is looked up in the sandbox store's index: the load folds
	// the tail past the store (the 3 events above, which Close left
	// unwritten, and the 2 records they touch) and reads the one record the
	// index names, not the 2,000.
	before := lazy.Decoded()
	if got, found, err := lazy.Sandbox(ctx, "sb-1234"); err != nil || !found || !reflect.DeepEqual(got, want) {
		t.Fatalf("by handle: %+v %v %v, want %+v", got, found, err, want)
	}
	if d := lazy.Decoded() - before; d > 3+2+1 {
		t.Fatalf("a read by handle decoded %d records, want the tail's 5 and the one it names", d)
	}
	// A short ID, or a prefix of one, is found by a seek in the store's
	// short-ID index, which holds keys alone: no record is decoded.
	short := projections.ShortID(target)
	for _, ref := range []string{short, short[:6], strings.ToUpper(short[:8])} {
		before := lazy.Decoded()
		refs, err := lazy.Named(ctx, ref)
		if err != nil {
			t.Fatal(err)
		}
		if id, err := projections.Match(refs, ref); err != nil || id != target {
			t.Fatalf("Match(Named(%q)) = %q, %v; want %s", ref, id, err, target)
		}
		if d := lazy.Decoded() - before; d != 0 {
			t.Fatalf("naming a sandbox by its short ID %q decoded %d records, want none", ref, d)
		}
	}
	// Once loaded, an append and a read still agree with the journal.
	if _, err := lazy.Append(ctx, events.New(ulid.Make(), time.Now(), target, events.SandboxStartedEvent{VMMPid: 44, VMMStart: 9})); err != nil {
		t.Fatal(err)
	}
	if got, _, _ := lazy.Sandbox(ctx, target); got.VMM == nil || got.VMM.Pid != 44 {
		t.Fatalf("after an append the loaded view shows %+v", got.VMM)
	}
}

// TestLazyNodeAppendsLikeAFullOne: an append on a lazy store loads the views
// first, so its guard sees the journal: an expectation older than the
// sandbox's last event is refused, the current one is accepted.
func TestLazyNodeAppendsLikeAFullOne(t *testing.T) {
	ctx := context.Background()
	root, ids := fillRoot(t, 10)
	lazy, err := store.Open(ctx, root, store.Options{Lazy: true})
	if err != nil {
		t.Fatal(err)
	}
	defer lazy.Close()
	sb, found, err := lazy.Sandbox(ctx, ids[3])
	if err != nil || !found || sb.Rev == 0 {
		t.Fatalf("lazy read: %+v %v %v", sb, found, err)
	}
	ent := core.Sandbox(ids[3])
	start := func() events.Event {
		return events.New(ulid.Make(), time.Now(), ids[3], events.SandboxStartedEvent{VMMPid: 1, VMMStart: 1})
	}
	var stale *core.StaleError
	if _, err := lazy.AppendExpect(ctx, []core.Expect{{Entity: ent, Seq: sb.Rev - 1}}, start()); !errors.As(err, &stale) {
		t.Fatalf("a stale expectation on a lazy node: %v, want a StaleError", err)
	}
	seqs, err := lazy.AppendExpect(ctx, []core.Expect{{Entity: ent, Seq: sb.Rev}}, start())
	if err != nil {
		t.Fatal(err)
	}
	if got := lazy.Rev(ent); got != seqs[0] {
		t.Fatalf("rev after the append: %d, want %d", got, seqs[0])
	}
}

// BenchmarkOpenInspect is what `nexus inspect ID` without a daemon costs
// on roots of 1,000, 10,000 and 100,000 sandboxes (snapshots written): store.Open,
// one Sandbox by ID, Close. Each op runs three, interleaved so the machine
// is the same for each:
//
//	full: Open loading every projection (snapshots decoded, tail folded), as before
//	lazy: Open with Options.Lazy (what a command's store does now)
//	floor: a lazy Open and Close alone, no read: the journal's own start
//
// Compare across sizes for the growth; docs/benchmarks.md has the figures.
func BenchmarkOpenInspect(b *testing.B) {
	ctx := context.Background()
	for _, size := range []int{1_000, 10_000, 100_000} {
		root, ids := fillRoot(b, size)
		target := ids[size/2]
		run := func(o store.Options, read bool) time.Duration {
			t0 := time.Now()
			n, err := store.Open(ctx, root, o)
			if err != nil {
				b.Fatal(err)
			}
			if read {
				if _, found, err := n.Sandbox(ctx, target); err != nil || !found {
					b.Fatalf("inspect: %v %v", found, err)
				}
			}
			if err := n.Close(); err != nil {
				b.Fatal(err)
			}
			return time.Since(t0)
		}
		b.Run(fmt.Sprintf("sandboxes=%d", size), func(b *testing.B) {
			var full, lazy, floor time.Duration
			for i := 0; i < b.N; i++ {
				full += run(store.Options{}, true)
				lazy += run(store.Options{Lazy: true}, true)
				floor += run(store.Options{Lazy: true}, false)
			}
			ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 / float64(b.N) }
			b.ReportMetric(ms(full), "full-ms/op")
			b.ReportMetric(ms(lazy), "lazy-ms/op")
			b.ReportMetric(ms(floor), "floor-ms/op")
			b.ReportMetric(float64(lazy)/float64(full), "lazy/full")
		})
	}
}

// TestLazyReadOfALongHistoryReadsItsRecord: a sandbox started and stopped
// 600 times is read by ID from its record in the sandbox store plus the
// events after the store's position, not replayed from its first event,
// and the record is the one a full load holds.
func TestLazyReadOfALongHistoryReadsItsRecord(t *testing.T) {
	ctx := context.Background()
	root, ids := fillRoot(t, 10)
	target := ids[7]
	nd, err := store.Open(ctx, root, store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	var history []events.Event
	for i := range 600 {
		history = append(history,
			events.New(ulid.Make(), time.Now(), target, events.SandboxStartedEvent{VMMPid: 100 + i, VMMStart: 7}),
			events.New(ulid.Make(), time.Now(), target, events.SandboxStoppedEvent{}))
	}
	if _, err := nd.Append(ctx, history...); err != nil {
		t.Fatal(err)
	}
	if err := nd.Close(); err != nil { // a tail of 1,200: checkpointed
		t.Fatal(err)
	}
	nd, err = store.Open(ctx, root, store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	tail := events.New(ulid.Make(), time.Now(), target, events.SandboxStartedEvent{VMMPid: 9999, VMMStart: 8})
	if _, err := nd.Append(ctx, tail); err != nil {
		t.Fatal(err)
	}
	want, _, err := nd.Sandbox(ctx, target)
	if err != nil {
		t.Fatal(err)
	}
	if err := nd.Close(); err != nil { // a tail of 1: left to the next open
		t.Fatal(err)
	}

	lazy, err := store.Open(ctx, root, store.Options{Lazy: true})
	if err != nil {
		t.Fatal(err)
	}
	defer lazy.Close()
	got, found, err := lazy.Sandbox(ctx, target)
	if err != nil || !found || !reflect.DeepEqual(got, want) {
		t.Fatalf("lazy read: %+v %v %v, want %+v", got, found, err, want)
	}
	if got.VMM == nil || got.VMM.Pid != 9999 {
		t.Fatalf("the event after the store's position was not folded: %+v", got.VMM)
	}
	// Its record and the one event after the store, not 1,202 events.
	if d := lazy.Decoded(); d != 2 {
		t.Fatalf("reading a sandbox with 1,202 events decoded %d records, want its stored record and the 1 event after it", d)
	}
}

// TestLazyAppendDecodesOnlyWhatItTouches is the structural O(1) test for
// an appending command without a daemon: on a root of 2,000
// sandboxes, a guarded append about one sandbox (its expectation read by
// ID), a lookup by handle and an owner check decode that sandbox's record
// and the few events past the sandbox store's last checkpoint, not the
// 2,000 records a whole load decodes; and the append is checkpointed by
// rewriting that one record, not every sandbox.
func TestLazyAppendDecodesOnlyWhatItTouches(t *testing.T) {
	ctx := context.Background()
	root, ids := fillRoot(t, 2000)
	target := ids[777]
	nd, err := store.Open(ctx, root, store.Options{Lazy: true})
	if err != nil {
		t.Fatal(err)
	}
	sb, found, err := nd.Sandbox(ctx, target)
	if err != nil || !found {
		t.Fatalf("read: %v %v", found, err)
	}
	start := events.New(ulid.Make(), time.Now(), target, events.SandboxStartedEvent{VMMPid: 4242, VMMStart: 1})
	if _, err := nd.AppendExpect(ctx, []core.Expect{{Entity: core.Sandbox(target), Seq: sb.Rev}}, start); err != nil {
		t.Fatal(err)
	}
	if got, _, err := nd.Sandbox(ctx, "sb-777"); err != nil || got.ID != target || got.VMM == nil || got.VMM.Pid != 4242 {
		t.Fatalf("by handle after the append: %+v %v", got, err)
	}
	if owner, _, found, err := nd.OwnerOf(ctx, []string{"disks/" + ids[5] + ".raw"}, ""); err != nil || !found || owner != ids[5] {
		t.Fatalf("owner: %s %v %v", owner, found, err)
	}
	// The lazy read (record + nothing past the store), the load's seeding
	// of the appended sandbox, the handle's and the owner's records.
	if d := nd.Decoded(); d > 6 {
		t.Fatalf("an append and two lookups on a root of 2,000 sandboxes decoded %d records", d)
	}
	if err := nd.Close(); err != nil {
		t.Fatal(err)
	}
	full, err := store.Open(ctx, root, store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer full.Close()
	if got, _, _ := full.Sandbox(ctx, target); got.VMM == nil || got.VMM.Pid != 4242 {
		t.Fatalf("reopened: the appended start is lost: %+v", got.VMM)
	}
	if n, err := full.SandboxCount(ctx); err != nil || n != 2000 {
		t.Fatalf("reopened: %d sandboxes (%v), want 2,000", n, err)
	}
}
