package store

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/oklog/ulid/v2"
	"golang.org/x/sys/unix"

	"github.com/nexus-sandbox/nexus/events"
	"github.com/nexus-sandbox/nexus/host/journal"
	"github.com/nexus-sandbox/nexus/host/smallfs"
	"github.com/nexus-sandbox/nexus/internal/testutil"
)

func TestFreesSpace(t *testing.T) {
	ev := func(p events.Payload, step string) events.Event {
		e := events.New(ulid.Make(), time.Unix(0, 0), "", p)
		e.Step = step
		return e
	}
	cases := []struct {
		name string
		e    events.Event
		kind events.SagaKind
		want bool
	}{
		{"rm saga start", ev(events.SagaStartedEvent{Kind: "rm"}, "saga.started"), "rm", true},
		{"rm saga step", ev(events.SupervisorStoppedEvent{Pid: 1}, "supervisor-stop"), "rm", true},
		{"reap saga step", ev(events.ReapDecidedEvent{}, "decide"), "reap", true},
		{"recover saga step", ev(events.SupervisorStoppedEvent{Pid: 1}, "supervisor-orphan"), "recover", true},
		{"create saga start", ev(events.SagaStartedEvent{Kind: "create"}, "saga.started"), "create", false},
		{"create step", ev(events.DiskMaterialisedEvent{}, "os-disk"), "create", false},
		{"create undo", ev(events.ResourceReclaimedEvent{}, "undo.os-disk"), "create", true},
		{"create undo, second event", ev(events.SupervisorStoppedEvent{}, "undo.supervisor#2"), "create", true},
		{"create compensated", ev(events.SagaCompensatedEvent{}, "saga.compensated"), "create", true},
		{"start saga", ev(events.FlushPendingEvent{}, "run-mark"), "start", false},
		{"volume removed", ev(events.VolumeRemovedEvent{Name: "v"}, ""), "", true},
		{"volume created", ev(events.VolumeCreatedEvent{Name: "v"}, ""), "", false},
		{"image cache pruned", ev(events.ImageCachePrunedEvent{}, ""), "", true},
		{"reap dry run", ev(events.ReapDecidedEvent{}, ""), "", true},
		{"stop saga", ev(events.SupervisorStoppedEvent{Pid: 1}, "supervisor-stop"), "stop", false},
		{"snapshot taken", ev(events.SnapshotTakenEvent{}, "capture"), "snapshot", false},
		{"run swept", ev(events.RunSweptEvent{}, ""), "", true},
		{"vmm exited", ev(events.VMMExitedEvent{}, ""), "", true},
		{"supervisor exited", ev(events.SupervisorExitedEvent{}, ""), "", true},
	}
	for _, c := range cases {
		if got := freesSpace(c.e, c.kind); got != c.want {
			t.Errorf("%s: freesSpace = %v, want %v", c.name, got, c.want)
		}
	}
}

// TestReserveAdmitsFreeingSagas: on a filesystem short of space, a create
// saga is refused at its first event while an rm saga runs to its end,
// including the events whose type alone does not say they free space.
func TestReserveAdmitsFreeingSagas(t *testing.T) {
	mnt := smallfs.Mount(t, 48<<20)
	root := filepath.Join(mnt, "root")
	ctx := context.Background()
	n, err := Open(ctx, root, Options{Journal: journal.Options{Space: &journal.Space{Reserve: 16 << 20, Floor: 2 << 20}}})
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	sb := ulid.Make().String()
	saga := func(kind events.SagaKind, id string, step string, p events.Payload) events.Event {
		e := events.New(ulid.Make(), time.Now(), sb, p)
		e.Saga, e.Step = id, step
		return e
	}
	if _, err := n.Append(ctx, saga("create", "c1", "saga.started", events.SagaStartedEvent{Kind: "create", Steps: []string{"x"}})); err != nil {
		t.Fatal(err)
	}
	filler := smallfs.Fill(t, mnt, 6<<20)
	defer os.Remove(filler)

	_, err = n.Append(ctx, saga("create", "c2", "saga.started", events.SagaStartedEvent{Kind: "create", Steps: []string{"x"}}))
	if !errors.Is(err, journal.ErrNoSpace) {
		t.Fatalf("create saga start on a short disk: %v, want ErrNoSpace", err)
	}
	for _, e := range []events.Event{
		saga("rm", "r1", "saga.started", events.SagaStartedEvent{Kind: "rm", Steps: []string{"supervisor-stop", "remove"}}),
		saga("rm", "r1", "supervisor-stop", events.SupervisorStoppedEvent{Pid: 42, Reason: "rm"}),
		saga("rm", "r1", "remove", events.SandboxRemovedEvent{}),
		saga("rm", "r1", "saga.finished", events.SagaFinishedEvent{}),
		saga("create", "c1", "undo.x", events.SupervisorStoppedEvent{Pid: 7}),
		saga("create", "c1", "saga.compensated", events.SagaCompensatedEvent{Reason: "disk full"}),
	} {
		if _, err := n.Append(ctx, e); err != nil {
			t.Fatalf("%s of saga %s refused on a short disk: %v", e.Step, e.Saga, err)
		}
	}
	var open int
	n.View(func(v Views) { open = len(v.Sagas.Open()) })
	if open != 0 {
		t.Fatalf("%d sagas left open", open)
	}
}

// TestSnapshotOnFullProjectionsKeepsAppending: the append that triggers a
// projections snapshot succeeds even when projections/ is out of space
// (its event is stored and folded), and the snapshot is written once space
// is back.
func TestSnapshotOnFullProjectionsKeepsAppending(t *testing.T) {
	testutil.SkipInShort(t, "appends tens of thousands of events")
	if os.Geteuid() != 0 {
		t.Skip("SKIPPED: needs root to mount a full filesystem at projections/; this test did not run")
	}
	root := t.TempDir()
	// tmpfs keeps 10,000 fsynced appends quick; projections/ gets its own.
	if err := unix.Mount("tmpfs", root, "tmpfs", 0, "size=256m,mode=0700"); err != nil {
		t.Skipf("SKIPPED: mount tmpfs: %v; this test did not run", err)
	}
	t.Cleanup(func() { unix.Unmount(root, unix.MNT_DETACH) })
	proj := filepath.Join(root, "projections")
	os.Mkdir(proj, 0o700)
	if err := unix.Mount("tmpfs", proj, "tmpfs", 0, "size=16m,mode=0700"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Unmount(proj, unix.MNT_DETACH) })
	filler := smallfs.Fill(t, proj, 0)

	ctx := context.Background()
	n, err := Open(ctx, root, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	appendVolumes := func(from, count int) {
		t.Helper()
		evs := make([]events.Event, 0, count)
		for i := from; i < from+count; i++ {
			evs = append(evs, events.New(ulid.Make(), time.Now(), "", events.VolumeCreatedEvent{Name: fmt.Sprintf("v%d", i), Path: "volumes/v", SizeBytes: 1}))
		}
		if _, err := n.Append(ctx, evs...); err != nil {
			t.Fatalf("append of events %d..%d with projections/ full: %v", from, from+count-1, err)
		}
	}
	for i := 0; i < snapshotEvery; i += 1000 {
		appendVolumes(i, 1000)
	}
	if snaps, _ := filepath.Glob(filepath.Join(proj, "*.snap")); len(snaps) != 0 {
		t.Fatalf("snapshots written to a full filesystem: %v", snaps)
	}
	var vols int
	n.View(func(v Views) { vols = len(v.Volumes.List()) })
	if vols != snapshotEvery {
		t.Fatalf("%d volumes folded, want %d", vols, snapshotEvery)
	}
	// Closing cannot snapshot either; opening again, which folds the whole
	// journal and would snapshot it, must still work for reads.
	if err := n.Close(); !errors.Is(err, unix.ENOSPC) {
		t.Fatalf("Close with projections/ full: %v, want the snapshot's ENOSPC", err)
	}
	if n, err = Open(ctx, root, Options{}); err != nil {
		t.Fatalf("Open with projections/ full: %v", err)
	}
	defer n.Close()
	n.View(func(v Views) { vols = len(v.Volumes.List()) })
	if vols != snapshotEvery {
		t.Fatalf("reopened: %d volumes folded, want %d", vols, snapshotEvery)
	}
	os.Remove(filler)
	appendVolumes(snapshotEvery, snapshotRetry)
	if snaps, _ := filepath.Glob(filepath.Join(proj, "*.snap")); len(snaps) != len(n.views) {
		t.Fatalf("after space came back: %d snapshots, want %d", len(snaps), len(n.views))
	}
}
