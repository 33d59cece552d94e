package lifecycle

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/oklog/ulid/v2"

	"github.com/nexus-sandbox/nexus/events"
	"github.com/nexus-sandbox/nexus/host/vmm"
	"github.com/nexus-sandbox/nexus/projections"
	"github.com/nexus-sandbox/nexus/sagas"
)

func (f *flow) manifest(sandbox, snap string) manifest {
	f.t.Helper()
	data, err := os.ReadFile(filepath.Join(f.m.Root.Snapshot(sandbox, snap), "manifest.json"))
	if err != nil {
		f.t.Fatal(err)
	}
	var man manifest
	if err := json.Unmarshal(data, &man); err != nil {
		f.t.Fatal(err)
	}
	return man
}

// A snapshot copies every disk; of a running guest it also saves the VM
// (frozen by its agent, paused, resumed after), and a restore of it brings
// the guest back from that state rather than booting cold.
func TestSnapshotAndRestoreFromEachState(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name     string
		running  bool
		snapshot []string
		restore  []string // the restored child's journal
	}{
		{name: "stopped", snapshot: []string{"saga.started", "resource.created", "snapshot.taken", "saga.finished"},
			restore: append(append([]string{"saga.started", "intent.written", "disk.materialised", "disk.materialised",
				"resource.created", "resource.created", "sandbox.restored", "intent.retired"}, bootTypes...), "saga.finished")},
		{name: "running", running: true, snapshot: []string{"saga.started", "resource.created", "snapshot.taken", "saga.finished"},
			restore: append(append([]string{"saga.started", "intent.written", "disk.materialised", "disk.materialised",
				"resource.created", "resource.created", // stage-restore: the child's snapshots dir and its staged VM state
				"resource.created", "resource.created", "sandbox.restored", "intent.retired"}, bootTypes...), "saga.finished")},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			f := newFlow(t)
			sb := f.create(CreateSpec{Handle: "src"})
			if !c.running {
				stop(f, sb)
			}
			mark := f.j.mark()
			snap, err := f.m.Snapshot(f.ctx, "src")
			if err != nil {
				t.Fatal(err)
			}
			if got := types(f.j.since(mark)); !reflect.DeepEqual(got, c.snapshot) {
				t.Fatalf("snapshot journaled %v, want %v", got, c.snapshot)
			}
			man := f.manifest(sb.ID, snap)
			if man.Sandbox != sb.ID || man.VMState != c.running || man.Frozen != c.running || len(man.Disks) != 2 {
				t.Fatalf("manifest %+v: want two disks, VM state and a freeze only of a running guest", man)
			}
			if c.running && f.vmState(sb.ID) != vmm.StateRunning {
				t.Fatal("the snapshotted guest was left paused")
			}
			now, _ := f.find(sb.ID)
			if !slices.Contains(now.Snapshots, snap) || !now.Owns(f.m.rel(f.m.Root.Snapshot(sb.ID, snap))) {
				t.Fatalf("sandbox snapshots %v: want %s, owned (RL-15)", now.Snapshots, snap)
			}

			mark = f.j.mark()
			child, err := f.m.Restore(f.ctx, snap[:12], RestoreOptions{}) // a unique prefix names it
			if err != nil {
				t.Fatal(err)
			}
			if got := types(of(f.j.since(mark), child.ID)); !reflect.DeepEqual(got, c.restore) {
				t.Fatalf("restore journaled\n%v\nwant\n%v", got, c.restore)
			}
			if child.State != projections.StateRunning || child.Snapshot != snap || f.vmState(child.ID) != vmm.StateRunning {
				t.Fatalf("restored %+v: want running, from %s", child, snap)
			}
			if c.running && !f.exists("snapshots/"+child.ID+"/restore/config.json") {
				t.Fatalf("no staged VM state: %v", f.files("snapshots/"+child.ID))
			}
			// The source keeps its snapshot; the restore owns only copies.
			for _, r := range child.Resources {
				if strings.Contains(r.Path, sb.ID) {
					t.Errorf("the restored child owns %s, a path of its source", r.Path)
				}
			}

			mark = f.j.mark()
			plan, err := f.m.SnapshotRemovePlan(f.ctx, snap)
			if err != nil || plan.ID != snap || f.j.mark() != mark {
				t.Fatalf("snapshot rm plan %+v, %v", plan, err)
			}
			info, err := f.m.SnapshotRemove(f.ctx, snap)
			if err != nil || info.ID != snap || info.Sandbox != sb.ID || info.AllocatedBytes <= 0 {
				t.Fatalf("snapshot rm: %+v, %v", info, err)
			}
			if got := types(f.j.since(mark)); !reflect.DeepEqual(got, []string{"saga.started", "resource.reclaimed", "saga.finished"}) {
				t.Fatalf("snapshot rm journaled %v", got)
			}
			if f.exists("snapshots/" + sb.ID + "/" + snap) {
				t.Fatal("the snapshot directory outlived its rm")
			}
			if list, _ := f.m.Snapshots(f.ctx, "src"); len(list) != 0 {
				t.Fatalf("snapshots listed after the rm: %+v", list)
			}
		})
	}
}

func TestSnapshotAndRestoreRefusals(t *testing.T) {
	t.Parallel()
	f := newFlow(t)
	sb := f.create(CreateSpec{})
	stop(f, sb)
	snap, err := f.m.Snapshot(f.ctx, sb.ID)
	if err != nil {
		t.Fatal(err)
	}
	exited := f.create(CreateSpec{})
	kill(t, exited.VMM)
	tamper := func(disks []manifestDisk) func() {
		path := filepath.Join(f.m.Root.Snapshot(sb.ID, snap), "manifest.json")
		orig, _ := os.ReadFile(path)
		man := f.manifest(sb.ID, snap)
		man.Disks = disks
		data, _ := json.Marshal(man)
		os.WriteFile(path, data, 0o600)
		return func() { os.WriteFile(path, orig, 0o600) }
	}
	cases := []struct {
		name  string
		setup func() func()
		run   func() error
		is    error
		says  string
	}{
		{name: "snapshot of an exited sandbox", run: func() error { _, err := f.m.Snapshot(f.ctx, exited.ID); return err }, is: ErrRefused, says: "it is exited"},
		{name: "snapshot of an unknown sandbox", run: func() error { _, err := f.m.Snapshot(f.ctx, "nope"); return err }, is: ErrNotFound, says: `no sandbox "nope"`},
		{name: "restore of an unknown snapshot", run: func() error { _, err := f.m.Restore(f.ctx, "nope", RestoreOptions{}); return err }, is: ErrNotFound, says: `no snapshot "nope"`},
		{name: "rm of an unknown snapshot", run: func() error { _, err := f.m.SnapshotRemove(f.ctx, "nope"); return err }, is: ErrNotFound, says: `no snapshot "nope"`},
		{name: "a manifest naming a file outside", setup: func() func() {
			return tamper([]manifestDisk{{Kind: events.KindRawDisk, File: "../../disks/x.raw"}})
		}, run: func() error { _, err := f.m.Restore(f.ctx, snap, RestoreOptions{}); return err }, says: "outside the snapshot"},
		{name: "a manifest naming a missing disk", setup: func() func() {
			return tamper([]manifestDisk{{Kind: events.KindRawDisk, File: "gone.raw"}})
		}, run: func() error { _, err := f.m.Restore(f.ctx, snap, RestoreOptions{}); return err }, is: ErrRefused, says: "gone.raw"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if c.setup != nil {
				defer c.setup()()
			}
			mark := f.j.mark()
			wantErr(t, c.run(), c.is, c.says)
			if got := f.j.since(mark); len(got) > 0 {
				t.Fatalf("a refusal journaled %v", types(got))
			}
		})
	}
}

// A capture that fails removes the directory it made (and the sandbox's
// snapshots directory it made for it); a restore that fails leaves nothing
// of its child, its staged VM state included.
func TestSnapshotAndRestoreUndoAFailedStep(t *testing.T) {
	t.Parallel()
	boom := errors.New("injected")
	t.Run("capture", func(t *testing.T) {
		f := newFlow(t)
		sb := f.create(CreateSpec{})
		f.j.failType(events.SnapshotTaken, boom)
		_, err := f.m.Snapshot(f.ctx, sb.ID)
		wantErr(t, err, sagas.ErrCompensated, "capture: injected")
		if left := f.files("snapshots"); len(left) > 0 {
			t.Fatalf("an undone capture left %v", left)
		}
		if f.vmState(sb.ID) != vmm.StateRunning {
			t.Fatal("the guest was left paused")
		}
	})
	for _, failing := range []events.Type{events.ResourceCreated, events.SandboxRestored} {
		t.Run("restore/"+string(failing), func(t *testing.T) {
			f := newFlow(t)
			sb := f.create(CreateSpec{})
			snap, err := f.m.Snapshot(f.ctx, sb.ID) // of a running guest: staged VM state
			if err != nil {
				t.Fatal(err)
			}
			before := f.files("disks", "snapshots", "supervisors", "sandboxes")
			f.j.failType(failing, boom)
			_, err = f.m.Restore(f.ctx, snap, RestoreOptions{})
			wantErr(t, err, sagas.ErrCompensated, "injected")
			if after := f.files("disks", "snapshots", "supervisors", "sandboxes"); !reflect.DeepEqual(after, before) {
				t.Fatalf("an undone restore changed the root:\n%v\nwas\n%v", after, before)
			}
		})
	}
}

// A snapshot reference that is not an exact ID (a prefix of its ID or of
// its short ID, any case) is resolved from the snapshots the backend says
// it could name (SnapshotsNamed), never from the sandbox list; a prefix
// of two is ambiguous and one of none is not found, as restore and
// snapshot rm always said.
func TestSnapshotReferencesReadNoSandboxList(t *testing.T) {
	t.Parallel()
	f := newFlow(t)
	sb := f.create(CreateSpec{Handle: "src"})
	stop(f, sb)
	snap, err := f.m.Snapshot(f.ctx, "src")
	if err != nil {
		t.Fatal(err)
	}
	// Two snapshots of another sandbox, journaled as taken, that share a
	// prefix.
	other := f.create(CreateSpec{})
	stop(f, other)
	const s1, s2 = "01KSSSSSSSSSSSSSSSSSSSSSS1", "01KSSSSSSSSSSSSSSSSSSSSST2"
	for _, s := range []string{s1, s2} {
		if _, err := f.j.Append(f.ctx, events.New(ulid.Make(), time.Now(), other.ID, events.SnapshotTakenEvent{SnapshotID: s,
			Dir: events.Resource{Kind: events.KindSnapshot, Path: "snapshots/" + other.ID + "/" + s}})); err != nil {
			t.Fatal(err)
		}
	}
	cases := []struct {
		ref, want, of string
		says          string // the refusal's end, if any
	}{
		{ref: strings.ToLower(snap), want: snap, of: sb.ID},
		{ref: strings.ToLower(snap[:len(snap)-1]), want: snap, of: sb.ID},
		{ref: projections.ShortID(snap)[:8], want: snap, of: sb.ID},
		{ref: strings.ToUpper(projections.ShortID(snap)), want: snap, of: sb.ID},
		{ref: "01kssssssssssssssssssssst", want: s2, of: other.ID},
		{ref: "01kss", says: `"01kss" matches 2 snapshots: ` + s1 + ", " + s2},
		{ref: "01KZZ", says: `no snapshot "01KZZ"`},
		{ref: sb.ID[:12], says: `no snapshot "` + sb.ID[:12] + `"`}, // a sandbox's prefix names no snapshot
	}
	for _, c := range cases {
		before := f.j.lists.Load()
		info, err := f.m.SnapshotRemovePlan(f.ctx, c.ref)
		if c.says != "" {
			if err == nil || !strings.HasSuffix(err.Error(), c.says) {
				t.Errorf("snapshot %q: %+v, %v; want %s", c.ref, info, err, c.says)
			}
		} else if err != nil || info.ID != c.want || info.Sandbox != c.of {
			t.Errorf("snapshot %q: %+v, %v; want %s of %s", c.ref, info, err, c.want, c.of)
		}
		if n := f.j.lists.Load() - before; n != 0 {
			t.Errorf("resolving snapshot %q read the sandbox list %d times, want none", c.ref, n)
		}
	}
	var amb *projections.AmbiguousError
	if _, err := f.m.Restore(f.ctx, "01KSS", RestoreOptions{}); !errors.As(err, &amb) || amb.What != "snapshots" {
		t.Fatalf("restore of a prefix of two snapshots: %v, want ambiguous", err)
	}
	before := f.j.lists.Load()
	if info, err := f.m.SnapshotRemove(f.ctx, projections.ShortID(snap)[:6]); err != nil || info.ID != snap {
		t.Fatalf("snapshot rm by a short ID's prefix: %+v, %v", info, err)
	}
	if n := f.j.lists.Load() - before; n != 0 {
		t.Fatalf("snapshot rm by a prefix read the sandbox list %d times, want none", n)
	}
}
