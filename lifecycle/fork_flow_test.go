package lifecycle

import (
	"context"
	"errors"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nexus-sandbox/nexus/events"
	"github.com/nexus-sandbox/nexus/host/vmm"
	"github.com/nexus-sandbox/nexus/projections"
	"github.com/nexus-sandbox/nexus/sagas"
)

// vmState asks sandbox id's VMM what its VM is doing.
func (f *flow) vmState(id string) vmm.State {
	f.t.Helper()
	ctx, cancel := context.WithTimeout(f.ctx, 5*time.Second)
	defer cancel()
	info, err := vmm.NewClient(f.m.Root.APISocket(id)).Info(ctx)
	if err != nil {
		f.t.Fatalf("VM of %s: %v", id, err)
	}
	return info.State
}

// of lists the events of one sandbox.
func of(evs []events.Event, id string) []events.Event {
	var out []events.Event
	for _, e := range evs {
		if e.Sandbox == id {
			out = append(out, e)
		}
	}
	return out
}

func TestForkCopiesEveryDiskOfTheParentIntoEachChild(t *testing.T) {
	t.Parallel()
	childTypes := append([]string{"saga.started", "intent.written", "disk.materialised", "disk.materialised",
		"resource.created", "resource.created", "sandbox.forked", "intent.retired"}, bootTypes...)
	childTypes = append(childTypes, "saga.finished")
	for _, running := range []bool{false, true} {
		t.Run(map[bool]string{false: "stopped parent", true: "running parent"}[running], func(t *testing.T) {
			f := newFlow(t)
			parent := f.create(CreateSpec{Handle: "p"})
			if !running {
				stop(f, parent)
			}
			before, _ := f.find(parent.ID)
			mark := f.j.mark()
			kids, err := f.m.Fork(f.ctx, ForkSpec{Parent: "p", Count: 2})
			if err != nil {
				t.Fatal(err)
			}
			evs := f.j.since(mark)
			if len(kids) != 2 {
				t.Fatalf("%d children", len(kids))
			}
			if got := of(evs, parent.ID); len(got) > 0 {
				t.Fatalf("the fork journaled %v about the parent", types(got))
			}
			for _, kid := range kids {
				if got := types(of(evs, kid.ID)); !reflect.DeepEqual(got, childTypes) {
					t.Fatalf("child %s journaled\n%v\nwant\n%v", kid.ID, got, childTypes)
				}
				if kid.Parent != parent.ID || kid.State != projections.StateRunning {
					t.Fatalf("child %+v: want running, parent %s", kid, parent.ID)
				}
				for _, rel := range []string{"disks/" + kid.ID + ".raw", "disks/" + kid.ID + "-workspace.ext4"} {
					if !f.exists(rel) || !kid.Owns(rel) {
						t.Errorf("child's %s: exists %v, owned %v (RL-14)", rel, f.exists(rel), kid.Owns(rel))
					}
				}
			}
			now, _ := f.find(parent.ID)
			if now.State != before.State || (running && f.vmState(parent.ID) != vmm.StateRunning) {
				t.Fatalf("parent after the fork: %s (VM %v); want it as it was, resumed", now.State, running)
			}
		})
	}
}

func TestForkRefusals(t *testing.T) {
	t.Parallel()
	f := newFlow(t)
	parent := f.create(CreateSpec{})
	exited := f.create(CreateSpec{})
	kill(t, exited.VMM)
	if _, err := f.m.VolumeCreate(f.ctx, "data", 8<<20, nil); err != nil {
		t.Fatal(err)
	}
	withVol := f.create(CreateSpec{Volumes: []Mount{{"data", "/data"}}})
	cases := []struct {
		name string
		spec ForkSpec
		is   error
		says string
	}{
		{"no children", ForkSpec{Parent: parent.ID, Count: 0}, ErrRefused, "--count 0: want 1..256"},
		{"too many", ForkSpec{Parent: parent.ID, Count: MaxForkChildren + 1}, ErrRefused, "want 1..256"},
		{"unknown parent", ForkSpec{Parent: "nope", Count: 1}, ErrNotFound, `no sandbox "nope"`},
		{"exited parent", ForkSpec{Parent: exited.ID, Count: 1}, ErrRefused, "its VMM exited (start or stop it first)"},
		{"a writable volume", ForkSpec{Parent: withVol.ID, Count: 1}, ErrRefused, "children would share a writable volume"},
		{"a volume the running parent locks", ForkSpec{Parent: withVol.ID, Count: 1, ReadOnlyVolumes: true}, ErrRefused, "holds volume(s) data read-write, locked"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			mark := f.j.mark()
			_, err := f.m.Fork(f.ctx, c.spec)
			wantErr(t, err, c.is, c.says)
			if got := f.j.since(mark); len(got) > 0 {
				t.Fatalf("a refused fork journaled %v", types(got))
			}
		})
	}
	// A stopped parent's volumes go to its children read-only.
	stop(f, withVol)
	kids, err := f.m.Fork(f.ctx, ForkSpec{Parent: withVol.ID, Count: 1, ReadOnlyVolumes: true})
	if err != nil {
		t.Fatal(err)
	}
	if v := kids[0].Volumes; len(v) != 1 || v[0].Name != "data" || !v[0].ReadOnly {
		t.Fatalf("child volumes %+v: want data, read-only", v)
	}
	// A running read-only holder keeps the parent from starting read-write.
	_, err = f.m.Start(f.ctx, withVol.ID)
	wantErr(t, err, ErrRefused, "hold them read-only, locked; stop those first")
}

// A running parent whose guest agent does not answer is not copied unless
// the operator accepts a crash-consistent copy.
func TestForkOfARunningParentNeedsItsFreeze(t *testing.T) {
	t.Parallel()
	f := newFlow(t)
	f.m.FreezeDeadline = 300 * time.Millisecond
	parent := f.create(CreateSpec{})
	if err := removeAll(f.root, "run/sb-"+parent.ID+".vsock"); err != nil {
		t.Fatal(err)
	}
	mark := f.j.mark()
	_, err := f.m.Fork(f.ctx, ForkSpec{Parent: parent.ID, Count: 1})
	wantErr(t, err, ErrRefused, "its guest agent did not freeze its filesystems", "--crash-consistent")
	if f.j.mark() != mark {
		t.Fatalf("a refused fork journaled %v", types(f.j.since(mark)))
	}
	var notices []string
	f.m.Notice = func(msg string) {
		if msg != HostGuestNotice { // every fork on the process driver tells it
			notices = append(notices, msg)
		}
	}
	kids, err := f.m.Fork(f.ctx, ForkSpec{Parent: parent.ID, Count: 1, CrashConsistent: true})
	if err != nil || len(kids) != 1 {
		t.Fatalf("crash-consistent fork: %v", err)
	}
	if len(notices) != 1 || !strings.Contains(notices[0], "crash-consistent only") {
		t.Fatalf("notices %q: want the one saying the copy is crash-consistent", notices)
	}
	if f.vmState(parent.ID) != vmm.StateRunning {
		t.Fatal("the parent was left paused")
	}
}

// A child whose saga fails is undone completely (nothing of it on disk or
// in the view), the others are kept, and the parent is resumed either way.
func TestForkUndoesAFailedChild(t *testing.T) {
	t.Parallel()
	boom := errors.New("injected")
	for _, failing := range []events.Type{events.DiskMaterialised, events.SandboxForked, events.SandboxStarted} {
		t.Run(string(failing), func(t *testing.T) {
			f := newFlow(t)
			parent := f.create(CreateSpec{})
			f.j.failType(failing, boom)
			mark := f.j.mark()
			kids, err := f.m.Fork(f.ctx, ForkSpec{Parent: parent.ID, Count: 1})
			wantErr(t, err, sagas.ErrCompensated, "injected")
			f.j.fail = nil
			evs := f.j.since(mark)
			child := ""
			for _, e := range evs {
				if e.Sandbox != parent.ID {
					child = e.Sandbox
				}
			}
			committed := failing == events.SandboxStarted // after the commit: kept, stopped
			if committed != (len(kids) == 1) {
				t.Fatalf("children reported %+v; want the committed child only", kids)
			}
			files := slices.DeleteFunc(f.files("disks", "supervisors", "sandboxes"), func(p string) bool { return !strings.Contains(p, child) })
			if !committed && len(files) > 0 {
				t.Fatalf("an undone child left %v", files)
			}
			if committed && (kids[0].State != projections.StateStopped || len(files) == 0) {
				t.Fatalf("a child that failed after its commit: %+v, files %v; want it stopped with its disks", kids[0], files)
			}
			if f.vmState(parent.ID) != vmm.StateRunning {
				t.Fatal("the parent was left paused")
			}
		})
	}
}

func TestChildHandles(t *testing.T) {
	for _, c := range []struct {
		template string
		count    int
		want     []string
		err      string
	}{
		{"", 2, []string{"", ""}, ""},
		{"web", 1, []string{"web"}, ""},
		{"web/{n}", 1, []string{"web/1"}, ""},
		{"web/{n}", 3, []string{"web/1", "web/2", "web/3"}, ""},
		{"w{n}/{n}", 2, []string{"w1/1", "w2/2"}, ""},
		{"web", 2, nil, `--handle "web" names one child: with --count 2 it needs {n}`},
	} {
		got, err := ChildHandles(c.template, c.count)
		if c.err != "" {
			if err == nil || !strings.Contains(err.Error(), c.err) {
				t.Errorf("%q x%d: %v, want %q", c.template, c.count, err, c.err)
			}
			continue
		}
		if err != nil || !slices.Equal(got, c.want) {
			t.Errorf("%q x%d = %q, %v; want %q", c.template, c.count, got, err, c.want)
		}
	}
}
