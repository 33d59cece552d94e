package store

import (
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/oklog/ulid/v2"
	"pgregory.net/rapid"

	"github.com/nexus-sandbox/nexus/events"
	"github.com/nexus-sandbox/nexus/projections"
)

// TestSandboxViewAnswersAsTheWholeFold: the store and its overlay answer
// every question a store asks of the sandboxes exactly as the whole fold in
// memory does, after any history of events with checkpoints (and reopens
// of the store file) between them. The histories share a few IDs,
// handles, paths and snapshots, so sandboxes come and go, take over one
// another's handles and paths, and leave stored index entries stale.
func TestSandboxViewAnswersAsTheWholeFold(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		dir, err := os.MkdirTemp("", "sandboxview")
		if err != nil {
			rt.Fatal(err)
		}
		defer os.RemoveAll(dir)
		path := filepath.Join(dir, storeFile)
		st, err := openSandboxStore(path)
		if err != nil {
			rt.Fatal(err)
		}
		defer func() { st.close() }()

		var decoded atomic.Uint64
		full := projections.NewSandboxes()
		view := completeView(projections.NewSandboxes(), &decoded)
		ids := make([]string, 5)
		for i := range ids {
			ids[i] = ulid.Make().String()
		}
		slices.Sort(ids)
		steps := rapid.IntRange(1, 80).Draw(rt, "steps")
		for seq := uint64(1); seq <= uint64(steps); seq++ {
			switch rapid.IntRange(0, 9).Draw(rt, "action") {
			case 0:
				if err := view.checkpoint(st, ulid.Make()); err != nil {
					rt.Fatal(err)
				}
			case 1:
				// Checkpoint, close the file, and read it again as a new
				// store would.
				if err := view.checkpoint(st, ulid.Make()); err != nil {
					rt.Fatal(err)
				}
				st.close()
				if st, err = openSandboxStore(path); err != nil {
					rt.Fatal(err)
				}
				pos, ok, err := st.position()
				if err != nil || !ok || pos.Seq != full.Seq() {
					rt.Fatalf("reopened store at %+v (%v, %v), want seq %d", pos, ok, err, full.Seq())
				}
				view = newSandboxView(st, pos, &decoded)
			default:
				e := drawEvent(rt, ids, seq)
				full.Apply(seq, e)
				if err := view.apply(seq, e); err != nil {
					rt.Fatal(err)
				}
			}
			compareViews(rt, full, view, ids)
		}
	})
}

var (
	viewHandles = []string{"dev/a", "dev/b", "ci"}
	viewPaths   = []string{"disks/a.raw", "disks/b.raw", "run/c.sock", "supervisor/d"}
	// ULIDs, as snapshot IDs are, two sharing a prefix.
	viewSnaps = []string{"01KSSSSSSSSSSSSSSSSSSSSSS1", "01KSSSSSSSSSSSSSSSSSSSSST2", "01KTTTTTTTTTTTTTTTTTTTTTT3"}
)

func drawEvent(rt *rapid.T, ids []string, seq uint64) events.Event {
	id := rapid.SampledFrom(ids).Draw(rt, "sandbox")
	res := func(label string) []events.Resource {
		var out []events.Resource
		for _, p := range rapid.SliceOfNDistinct(rapid.SampledFrom(viewPaths), 0, 2, rapid.ID[string]).Draw(rt, label) {
			out = append(out, events.Resource{Kind: events.KindRawDisk, Path: p})
		}
		return out
	}
	var p events.Payload
	saga := ""
	switch rapid.IntRange(0, 12).Draw(rt, "event") {
	case 0:
		p, saga = events.SagaStartedEvent{Kind: events.SagaCreate}, "saga-"+id
	case 1:
		p, saga = events.SagaCompensatedEvent{Reason: "undone"}, "saga-"+id
	case 2:
		p = events.SandboxCreatedEvent{Handle: rapid.SampledFrom(viewHandles).Draw(rt, "handle"), Image: "img", Driver: "process", Resources: res("created")}
	case 3:
		p = events.SandboxForkedEvent{Parent: ids[0], Handle: rapid.SampledFrom(viewHandles).Draw(rt, "handle"), Image: "img", Driver: "process", Resources: res("forked")}
	case 4:
		p = events.SandboxStartedEvent{Driver: "process", VMMPid: int(seq), VMMStart: seq, Sockets: res("sockets"), RunMarker: "run"}
	case 11:
		p = events.SandboxReadyEvent{Run: "run", By: "agent"}
	case 5:
		p = events.SandboxStoppedEvent{}
	case 6:
		p = events.SupervisorStartedEvent{Pid: int(seq), Start: seq, StateDir: events.Resource{Kind: events.KindRawDisk, Path: rapid.SampledFrom(viewPaths).Draw(rt, "dir")}}
	case 7:
		snap := rapid.SampledFrom(viewSnaps).Draw(rt, "snap")
		p = events.SnapshotTakenEvent{SnapshotID: snap, Dir: events.Resource{Kind: events.KindSnapshot, Path: "snapshots/" + id + "/" + snap}}
	case 8:
		snap := rapid.SampledFrom(viewSnaps).Draw(rt, "snap")
		p = events.ResourceReclaimedEvent{Resource: events.Resource{Kind: events.KindSnapshot, Path: "snapshots/" + id + "/" + snap}, By: "rm"}
	case 9:
		p = events.ResourceReclaimedEvent{Resource: events.Resource{Kind: events.KindRawDisk, Path: rapid.SampledFrom(viewPaths).Draw(rt, "path")}, By: "reap"}
	case 10:
		p = events.VMMExitedEvent{Pid: int(seq), StartTicks: seq}
	default:
		p = events.SandboxRemovedEvent{}
	}
	e := events.New(ulid.Make(), time.Unix(int64(seq), 0).UTC(), id, p)
	e.Saga = saga
	return e
}

func compareViews(rt *rapid.T, full *projections.Sandboxes, view *sandboxView, ids []string) {
	ref := func(sb *projections.Sandbox) string {
		if sb == nil {
			return "none"
		}
		return sb.ID
	}
	for _, id := range ids {
		got, err := view.get(id)
		if err != nil {
			rt.Fatal(err)
		}
		if want := full.Get(id); !reflect.DeepEqual(got, want) {
			rt.Fatalf("get %s:\n got %+v\nwant %+v", id, got, want)
		}
	}
	wantStates := map[StateKey]int{}
	for _, sb := range full.List() {
		wantStates[StateOf(sb)]++
	}
	if got, err := view.states(); err != nil || !reflect.DeepEqual(got, wantStates) {
		rt.Fatalf("states: %v (%v), want %v", got, err, wantStates)
	}
	for _, h := range viewHandles {
		got, err := view.byHandle(h)
		if err != nil || ref(got) != ref(full.ByHandle(h)) {
			rt.Fatalf("byHandle %s: %s (%v), want %s", h, ref(got), err, ref(full.ByHandle(h)))
		}
	}
	// What a reference names (projections.Match over named): an ID, a
	// prefix of one, a short ID or a prefix of one, a handle.
	refs := slices.Clone(viewHandles)
	for _, id := range ids {
		refs = append(refs, id, id[:len(id)-1], projections.ShortID(id), projections.ShortID(id)[:4], id[:10])
	}
	for _, r := range refs {
		named, err := view.named(r, 16)
		if err != nil {
			rt.Fatal(err)
		}
		got, gerr := projections.Match(named, r)
		want, werr := projections.Match(full.Named(r), r)
		if got != want || fmt.Sprint(gerr) != fmt.Sprint(werr) {
			rt.Fatalf("Match(named %q) = %q, %v; want %q, %v", r, got, gerr, want, werr)
		}
	}
	// What a snapshot reference names (projections.MatchSnapshot over
	// snapshotsNamed): an ID in any case, a prefix of one, a prefix of
	// two, a short ID's prefix.
	var snapRefs []string
	for _, s := range viewSnaps {
		snapRefs = append(snapRefs, s, strings.ToLower(s), s[:len(s)-1], s[:5], projections.ShortID(s)[:6])
	}
	for _, r := range snapRefs {
		named, err := view.snapshotsNamed(r, 16)
		if err != nil {
			rt.Fatal(err)
		}
		var gotIDs, wantIDs []string
		for _, n := range named {
			gotIDs = append(gotIDs, n.ID)
			if sb := full.Get(n.Sandbox); sb == nil || !slices.Contains(sb.Snapshots, n.ID) {
				rt.Fatalf("snapshotsNamed %q: %s held by %s, which does not hold it", r, n.ID, n.Sandbox)
			}
		}
		for _, n := range full.SnapshotsNamed(r) {
			wantIDs = append(wantIDs, n.ID)
		}
		if gotIDs = slices.Compact(gotIDs); !slices.Equal(gotIDs, wantIDs) {
			rt.Fatalf("snapshotsNamed %q: %v, want %v", r, gotIDs, wantIDs)
		}
		got, gerr := projections.MatchSnapshot(named, r)
		want, werr := projections.MatchSnapshot(full.SnapshotsNamed(r), r)
		if got != want || fmt.Sprint(gerr) != fmt.Sprint(werr) {
			rt.Fatalf("MatchSnapshot(snapshotsNamed %q) = %q, %v; want %q, %v", r, got, gerr, want, werr)
		}
	}
	for _, s := range viewSnaps {
		got, err := view.snapshotOwner(s)
		if err != nil || ref(got) != ref(full.SnapshotOwner(s)) {
			rt.Fatalf("snapshotOwner %s: %s (%v), want %s", s, ref(got), err, ref(full.SnapshotOwner(s)))
		}
	}
	for _, paths := range [][]string{{viewPaths[0]}, {viewPaths[1]}, {viewPaths[2], viewPaths[3]}, viewPaths} {
		for _, except := range []string{"", ids[0], ids[2]} {
			id, p, found, err := view.ownerOf(paths, except)
			wid, wp, wfound := full.OwnerOf(paths, except)
			if err != nil || id != wid || p != wp || found != wfound {
				rt.Fatalf("ownerOf %v except %q: %q %q %v (%v), want %q %q %v", paths, except, id, p, found, err, wid, wp, wfound)
			}
		}
	}
	for _, after := range []string{"", ids[1], ids[4]} {
		for _, limit := range []int{2, 100} {
			got, err := view.page(after, limit)
			if err != nil {
				rt.Fatal(err)
			}
			if g, w := pageIDs(got), pageIDs(full.Page(after, limit)); !slices.Equal(g, w) {
				rt.Fatalf("page after %q limit %d: %v, want %v", after, limit, g, w)
			}
		}
	}
	if got := view.count(); got != full.Len() {
		rt.Fatalf("count %d, want %d", got, full.Len())
	}
	live, err := view.withProcesses()
	if err != nil {
		rt.Fatal(err)
	}
	var want []string
	for _, sb := range full.List() {
		if sb.HasProcess() {
			want = append(want, sb.ID)
		}
	}
	got := pageIDs(live)
	slices.Sort(got)
	if !slices.Equal(got, want) {
		rt.Fatalf("live %v, want %v", got, want)
	}
	if view.Seq() != full.Seq() {
		rt.Fatalf("seq %d, want %d", view.Seq(), full.Seq())
	}
}

func pageIDs(list []*projections.Sandbox) []string {
	out := make([]string, len(list))
	for i, sb := range list {
		out[i] = sb.ID
	}
	return out
}
