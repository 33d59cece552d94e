package guard

import (
	"errors"
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
		{Start, running, nil, false},
		{Start, creating, nil, false},
		{Start, stopped, openStop, false},
		{Start, stopped, otherOpen, true},
		{Stop, running, nil, true},
		{Stop, stopped, nil, false},
		{Stop, running, openStop, false},
		{Remove, running, nil, true},
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
