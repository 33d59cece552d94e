package lifecycle

import (
	"errors"
	"reflect"
	"slices"
	"testing"

	"github.com/oklog/ulid/v2"

	"github.com/nexus-sandbox/nexus/events"
	"github.com/nexus-sandbox/nexus/internal/testutil"
	"github.com/nexus-sandbox/nexus/projections"
	"github.com/nexus-sandbox/nexus/sagas"
)

// reclaimTypes are rm's reclaim step: the disks, supervisor state, record
// dir and the three logs the journal owns, each journaled as reclaimed.
func reclaims(n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = "resource.reclaimed"
	}
	return out
}

func TestRemoveFromEachState(t *testing.T) {
	t.Parallel()
	stoppedRm := append(append([]string{"saga.started"}, reclaims(8)...), "sandbox.removed", "saga.finished")
	runningRm := append(append(append([]string{}, stopTypes[:len(stopTypes)-1]...), reclaims(8)...), "sandbox.removed", "saga.finished")
	cases := []struct {
		name  string
		setup func(f *flow, sb projections.Sandbox)
		opt   RemoveOptions
		is    error
		says  string
		want  []string
	}{
		{name: "stopped", setup: stop, want: stoppedRm},
		{name: "running", is: ErrRefused, says: "it is running (stop it first, or use `nexus rm -f`)"},
		{name: "running, forced", opt: RemoveOptions{Force: true}, want: runningRm},
		{name: "with a snapshot", setup: snapshot, opt: RemoveOptions{Force: true}, is: ErrRefused, says: "it has 1 snapshot(s)"},
		{name: "with a snapshot, and them too", setup: snapshot, opt: RemoveOptions{Force: true, WithSnapshots: true},
			want: append(append(append([]string{}, stopTypes[:len(stopTypes)-1]...), reclaims(10)...), "sandbox.removed", "saga.finished")},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			testutil.ShortSample(t, c.name == "stopped" || c.name == "running, forced")
			f := newFlow(t)
			sb := f.create(CreateSpec{Handle: "h"})
			if c.setup != nil {
				c.setup(f, sb)
			}
			// The plan (--dry-run) decides as the removal does, changing nothing.
			mark := f.j.mark()
			plan, paths, perr := f.m.RemovePlan(f.ctx, "h", c.opt)
			if f.j.mark() != mark {
				t.Fatalf("the plan journaled %v", types(f.j.since(mark)))
			}
			rep, err := f.m.RemoveWith(f.ctx, "h", c.opt)
			if c.is != nil {
				wantErr(t, err, c.is, c.says)
				wantErr(t, perr, c.is, c.says)
				if _, found := f.find(sb.ID); !found || f.j.mark() != mark {
					t.Fatalf("a refused rm journaled %v", types(f.j.since(mark)))
				}
				return
			}
			if err != nil || perr != nil {
				t.Fatalf("rm: %v, plan: %v", err, perr)
			}
			if got := types(f.j.since(mark)); !reflect.DeepEqual(got, c.want) {
				t.Fatalf("rm journaled\n%v\nwant\n%v", got, c.want)
			}
			if rep.ID != sb.ID || rep.Handle != "h" || rep.AllocatedBytes <= 0 || !reflect.DeepEqual(plan, rep) {
				t.Fatalf("rm reported %+v, its plan %+v: want the same, with bytes", rep, plan)
			}
			if !slices.Contains(paths, "disks/"+sb.ID+".raw") {
				t.Fatalf("the plan's paths %v lack the OS disk", paths)
			}
			if _, found := f.find(sb.ID); found {
				t.Fatal("the sandbox outlived its rm")
			}
			if left := f.files("disks", "supervisors", "sandboxes", "logs", "run", "snapshots", "leases"); len(left) > 0 {
				t.Fatalf("rm left %v", left)
			}
			if left := testutil.ProcessesUnder(f.root); len(left) > 0 {
				t.Fatalf("rm left processes %v", left)
			}
		})
	}
	t.Run("unknown", func(t *testing.T) {
		f := newFlow(t)
		_, err := f.m.RemoveWith(f.ctx, ulid.Make().String(), RemoveOptions{})
		wantErr(t, err, ErrNotFound, "no sandbox")
	})
}

func snapshot(f *flow, sb projections.Sandbox) {
	f.t.Helper()
	if _, err := f.m.Snapshot(f.ctx, sb.ID); err != nil {
		f.t.Fatal(err)
	}
}

// rm is a teardown: a step that fails leaves its saga open, never undone,
// and the next command on the sandbox (here rm again, holding its lease)
// finishes it the way recover would before deciding.
func TestRemoveInterruptedIsFinishedByTheNextCommand(t *testing.T) {
	t.Parallel()
	f := newFlow(t)
	sb := f.create(CreateSpec{})
	stop(f, sb)
	f.j.failType(events.SandboxRemoved, errors.New("injected"))
	_, err := f.m.RemoveWith(f.ctx, sb.ID, RemoveOptions{})
	wantErr(t, err, sagas.ErrLeftOpen, "remove: injected")
	f.j.fail = nil
	open, _ := f.j.OpenSagas(f.ctx)
	if len(open) != 1 || open[0].Kind != events.SagaRm {
		t.Fatalf("open sagas %+v: want the rm, left open", open)
	}
	if ev := ofType(f.j.since(0), events.SagaCompensated); len(ev) > 0 {
		t.Fatal("a teardown was compensated")
	}
	mark := f.j.mark()
	// The open saga is finished under the lease; the sandbox it removed
	// is then gone, which is this rm's answer.
	_, err = f.m.RemoveWith(f.ctx, sb.ID, RemoveOptions{})
	wantErr(t, err, ErrNotFound, "no sandbox")
	if got := types(f.j.since(mark)); !slices.Contains(got, "sandbox.removed") || got[len(got)-1] != "saga.finished" {
		t.Fatalf("the second command journaled %v: want the rm finished", got)
	}
	if _, found := f.find(sb.ID); found {
		t.Fatal("the sandbox outlived the finished rm")
	}
	if open, _ := f.j.OpenSagas(f.ctx); len(open) != 0 {
		t.Fatalf("sagas still open: %+v", open)
	}
}
