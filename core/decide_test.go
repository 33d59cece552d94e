package core

import (
	"errors"
	"strings"
	"testing"

	"github.com/nexus-sandbox/nexus/events"
	"github.com/nexus-sandbox/nexus/projections"
)

const id = "01JDQ4Z6X1M9A3Y0C5TB2R8NKW"

func TestDecideTable(t *testing.T) {
	running := projections.Sandbox{ID: id, State: projections.StateRunning, VMM: &projections.Process{Pid: 1}}
	stopped := projections.Sandbox{ID: id, State: projections.StateStopped}
	creating := projections.Sandbox{ID: id, State: projections.StateCreating}
	exited := projections.Sandbox{ID: id, State: projections.StateExited, VMM: &projections.Process{Pid: 1, Exited: true}}
	failedNoVMM := projections.Sandbox{ID: id, State: projections.StateError}
	failedVMM := projections.Sandbox{ID: id, State: projections.StateError, VMM: &projections.Process{Pid: 1}}
	openStop := []projections.OpenSaga{{ID: "S1", Kind: "stop", Sandbox: id}}
	otherOpen := []projections.OpenSaga{{ID: "S2", Kind: "rm", Sandbox: "01JDQ4Z6X1M9A3Y0C5TB2R8NKX"}}
	cases := []struct {
		cmd  Command
		sb   projections.Sandbox
		open []projections.OpenSaga
		ok   bool
	}{
		{Start, stopped, nil, true},
		{Start, failedNoVMM, nil, true},
		{Start, failedVMM, nil, false},
		{Start, creating, nil, false},
		{Start, stopped, openStop, false},
		{Start, stopped, otherOpen, true},
		{Stop, running, nil, true},
		{Stop, running, openStop, false},
		{Remove, running, nil, false},
		{ForceRemove, running, nil, true},
		{ForceRemove, creating, nil, false},
		{SnapshotRemove, running, nil, true},
		{SnapshotRemove, stopped, nil, true},
		{SnapshotRemove, exited, nil, true},
		{SnapshotRemove, creating, nil, false},
		{SnapshotRemove, stopped, openStop, false},
		{ForceRemove, running, openStop, false},
		{Remove, stopped, nil, true},
		{Remove, failedVMM, nil, true},
		{Remove, creating, nil, false},
		{Remove, stopped, openStop, false},
		{Snapshot, running, nil, true},
		{Snapshot, stopped, nil, true},
		{Snapshot, failedNoVMM, nil, false},
		{Snapshot, creating, nil, false},
		{Fork, running, nil, true},
		{Fork, creating, nil, false},
		{Fork, running, openStop, false},
		{Restore, stopped, nil, true},
		{Restore, creating, nil, false},
		{"bogus", stopped, nil, false},
		{Start, exited, nil, true},
		{Stop, exited, nil, true},
		{Remove, exited, nil, true},
		{Snapshot, exited, nil, false},
		{Fork, exited, nil, false},
	}
	for _, c := range cases {
		err := Decide(c.cmd, c.sb, c.open)
		if (err == nil) != c.ok {
			t.Errorf("Decide(%s, %s, %d open) = %v, want ok=%v", c.cmd, c.sb.State, len(c.open), err, c.ok)
		}
		if err != nil && !errors.Is(err, ErrRefused) {
			t.Errorf("Decide(%s, %s) = %v, not ErrRefused", c.cmd, c.sb.State, err)
		}
	}
	// Nothing to do is not a refusal: stop of a stopped sandbox and start
	// of a running one are ErrAlready, unless a saga is open on it.
	for _, c := range []struct {
		cmd Command
		sb  projections.Sandbox
	}{{Start, running}, {Stop, stopped}} {
		var a *Already
		if err := Decide(c.cmd, c.sb, nil); !errors.As(err, &a) || errors.Is(err, ErrRefused) || a.State != c.sb.State {
			t.Errorf("Decide(%s, %s) = %v, want Already", c.cmd, c.sb.State, err)
		}
	}
	if err := Decide(Stop, stopped, openStop); errors.Is(err, ErrAlready) || !errors.Is(err, ErrRefused) {
		t.Errorf("stop of a stopped sandbox with an open saga = %v, want refused", err)
	}
	if err := Decide(Start, exited, nil); err != nil {
		t.Errorf("start of an exited sandbox = %v, want allowed", err)
	}
	var r *Refusal
	if err := Decide(Start, stopped, openStop); !errors.As(err, &r) || r.Saga == nil || r.Saga.ID != "S1" {
		t.Fatalf("refusal does not name the open saga: %v", err)
	}
}

func TestDecideVolumes(t *testing.T) {
	live := map[string]bool{id: true}
	free := &projections.Volume{Name: "v"}
	used := &projections.Volume{Name: "v", AttachedTo: []string{id}}
	stale := &projections.Volume{Name: "v", AttachedTo: []string{"gone"}}
	if DecideVolumeRemove(nil, "v", live) == nil || DecideVolumeRemove(used, "v", live) == nil {
		t.Fatal("missing or attached volume removed")
	}
	if err := DecideVolumeRemove(free, "v", live); err != nil {
		t.Fatal(err)
	}
	if err := DecideVolumeRemove(stale, "v", live); err != nil {
		t.Fatalf("attachment of a removed sandbox blocks removal: %v", err)
	}
	if DecideAttach(nil, "v") == nil || DecideAttach(used, "v") == nil || DecideAttach(free, "v") != nil {
		t.Fatal("attach decisions wrong")
	}
}

func TestEntitiesAndAdvance(t *testing.T) {
	e := events.Event{Envelope: events.Envelope{Sandbox: id}, Payload: events.VolumeAttachedEvent{Name: "v"}}
	got := EntitiesOf(e)
	if len(got) != 2 || got[0] != Sandbox(id) || got[1] != Volume("v") {
		t.Fatalf("EntitiesOf = %v", got)
	}
	x := []Expect{{Entity: Sandbox(id), Seq: 3}, {Entity: Volume("v"), Seq: 1}, {Entity: Volume("w"), Seq: 2}}
	Advance(x, []events.Event{e}, []uint64{9})
	if x[0].Seq != 9 || x[1].Seq != 9 || x[2].Seq != 2 {
		t.Fatalf("Advance = %v", x)
	}
}

func TestDecideSnapshots(t *testing.T) {
	bare := projections.Sandbox{ID: id}
	snapped := projections.Sandbox{ID: id, Snapshots: []string{"S1", "S2"}}
	if DecideSnapshots(bare, false) != nil || DecideSnapshots(snapped, true) != nil {
		t.Fatal("a removal without snapshots, or with --with-snapshots, refused")
	}
	err := DecideSnapshots(snapped, false)
	if !errors.Is(err, ErrRefused) || !strings.Contains(err.Error(), "S1, S2") || !strings.Contains(err.Error(), "--with-snapshots") {
		t.Fatalf("DecideSnapshots(snapped, false) = %v; want a refusal naming both and the flag", err)
	}
}
