package projections

import (
	"bytes"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/oklog/ulid/v2"
	"pgregory.net/rapid"

	"github.com/nexus-sandbox/nexus/events"
)

var t0 = time.Date(2026, 12, 3, 9, 0, 0, 0, time.UTC)

// genHistory draws a plausible journal: sandboxes are created (sometimes
// through a saga that is compensated), started, stopped, forked, given
// resources, and removed, in random interleavings.
func genHistory(t *rapid.T) []events.Event {
	n := rapid.IntRange(1, 300).Draw(t, "n")
	var live []string
	var out []events.Event
	entropy := ulid.Monotonic(bytes.NewReader(bytes.Repeat([]byte{7}, 1<<16)), 0)
	next := func(sb string, p events.Payload) {
		at := t0.Add(time.Duration(len(out)) * time.Millisecond)
		out = append(out, events.New(ulid.MustNew(ulid.Timestamp(at), entropy), at, sb, p))
	}
	for i := 0; i < n; i++ {
		pickLive := func() string { return live[rapid.IntRange(0, len(live)-1).Draw(t, "pick")] }
		switch op := rapid.IntRange(0, 9).Draw(t, "op"); {
		case op <= 2 || len(live) == 0:
			id := ulid.MustNew(ulid.Timestamp(t0), entropy).String()
			next(id, events.SagaStartedEvent{Kind: "create", Steps: []string{"intent", "disk", "commit"}})
			out[len(out)-1].Saga = "saga-" + id
			next(id, events.IntentWrittenEvent{Resource: events.Resource{Kind: events.KindCreateIntent, Path: "disks/" + id + ".create-intent.json"}})
			next(id, events.DiskMaterialisedEvent{Resource: events.Resource{Kind: events.KindRawDisk, Path: "disks/" + id + ".raw"}, AllocatedBytes: 4096})
			if rapid.Bool().Draw(t, "compensate") {
				next(id, events.ResourceReclaimedEvent{Resource: events.Resource{Kind: events.KindRawDisk, Path: "disks/" + id + ".raw"}, By: "saga"})
				next(id, events.SagaCompensatedEvent{Reason: "ENOSPC"})
				out[len(out)-1].Saga = "saga-" + id
				continue
			}
			next(id, events.SandboxCreatedEvent{Handle: fmt.Sprintf("h%d", i), Image: "base", Driver: "process",
				Resources: []events.Resource{{Kind: events.KindWorkspaceDisk, Path: "disks/" + id + "-workspace.ext4"}}})
			next(id, events.IntentRetiredEvent{Resource: events.Resource{Kind: events.KindCreateIntent, Path: "disks/" + id + ".create-intent.json"}})
			live = append(live, id)
		case op == 3:
			sb := pickLive()
			next(sb, events.SandboxStartedEvent{Driver: "process", VMMPid: 100 + i, VMMStart: uint64(i),
				Sockets: []events.Resource{{Kind: events.KindAPISocket, Path: "run/sb-" + sb + ".sock"}}})
			next(sb, events.SupervisorStartedEvent{Pid: 200 + i, Start: 1, StateDir: events.Resource{Kind: events.KindSupervisorState, Path: "supervisors/" + sb}})
			if rapid.Bool().Draw(t, "exit") {
				next(sb, events.VMMExitedEvent{Pid: 100 + i, StartTicks: uint64(i), Status: events.ExitUnknown, By: "daemon"})
				next(sb, events.SupervisorExitedEvent{Pid: 200 + i, StartTicks: 1, Status: events.ExitKilled, Code: 9, Signal: "SIGKILL", By: "daemon"})
			}
		case op == 4:
			sb := pickLive()
			next(sb, events.SandboxStoppedEvent{Reason: "user"})
			next(sb, events.ResourceReclaimedEvent{Resource: events.Resource{Kind: events.KindAPISocket, Path: "run/sb-" + sb + ".sock"}, By: "stop"})
		case op == 5:
			parent := pickLive()
			child := ulid.MustNew(ulid.Timestamp(t0), entropy).String()
			next(child, events.SandboxForkedEvent{Parent: parent, Image: "base", Driver: "process",
				Resources: []events.Resource{{Kind: events.KindShadowDisk, Path: "disks/" + child + "-p.shadow.data.ext4"}}})
			live = append(live, child)
		case op == 6:
			sb := pickLive()
			next(sb, events.VolumeAttachedEvent{Name: fmt.Sprintf("v%d", i), GuestPath: "/data"})
			next(sb, events.SnapshotTakenEvent{SnapshotID: fmt.Sprint(i), Dir: events.Resource{Kind: events.KindSnapshot, Path: fmt.Sprintf("snapshots/%s/%d", sb, i)}})
		case op == 7:
			sb := pickLive()
			next(sb, events.SandboxFailedEvent{Reason: "OverlayDiskFull", Message: "full"})
		case op == 8:
			next("", events.VolumeCreatedEvent{Name: fmt.Sprintf("v%d", i), Path: "volumes/x"})
		default:
			k := rapid.IntRange(0, len(live)-1).Draw(t, "rm")
			sb := live[k]
			live = append(live[:k], live[k+1:]...)
			next(sb, events.SandboxRemovedEvent{})
		}
	}
	return out
}

func fold(p Projection, evs []events.Event, from int) {
	for i := from; i < len(evs); i++ {
		p.Apply(uint64(i+1), evs[i])
	}
}

// TestSnapshotThenTailEqualsFullFold is the property start-up relies on:
// folding N events from scratch equals restoring a snapshot taken after K
// events and folding the remaining N-K, for every K.
func TestSnapshotThenTailEqualsFullFold(t *testing.T) {
	makers := []func() Projection{
		func() Projection { return NewSandboxes() },
		func() Projection { return NewSagas() },
		func() Projection { return NewVolumes() },
	}
	rapid.Check(t, func(t *rapid.T) {
		evs := genHistory(t)
		k := rapid.IntRange(0, len(evs)).Draw(t, "k")
		for _, mk := range makers {
			full := mk()
			fold(full, evs, 0)

			head := mk()
			fold(head, evs[:k], 0)
			snap, err := EncodeSnapshot(head, ulid.ULID{})
			if err != nil {
				t.Fatal(err)
			}
			resumed := mk()
			got, err := DecodeSnapshot(snap, resumed)
			if err != nil {
				t.Fatalf("%s: decode snapshot: %v", resumed.Name(), err)
			}
			if got.Seq != uint64(k) {
				t.Fatalf("%s: snapshot covers %d, want %d", resumed.Name(), got.Seq, k)
			}
			fold(resumed, evs, k)

			a, _ := full.MarshalState()
			b, _ := resumed.MarshalState()
			if !bytes.Equal(a, b) || full.Seq() != resumed.Seq() {
				t.Fatalf("%s: snapshot at %d + tail differs from a full fold of %d events", full.Name(), k, len(evs))
			}
		}
	})
}

func TestDamagedSnapshotIsRefusedAndStateKept(t *testing.T) {
	p := NewSandboxes()
	id := ulid.MustParse("01JDQ4Z6X1M9A3Y0C5TB2R8NKW")
	created := func(disk string) events.Event {
		return events.New(id, t0, id.String(), events.SandboxCreatedEvent{Image: "i", Driver: "process",
			Resources: []events.Resource{{Kind: events.KindRawDisk, Path: disk}}})
	}
	p.Apply(1, created("disks/a.raw"))
	good, err := EncodeSnapshot(p, id)
	if err != nil {
		t.Fatal(err)
	}
	flipped := append([]byte(nil), good...)
	flipped[len(flipped)-8] ^= 0xff
	cases := map[string][]byte{
		"garbage":   []byte("not a snapshot"),
		"truncated": good[:len(good)/2],
		"flipped":   flipped,
		"empty":     nil,
	}
	for name, data := range cases {
		target := NewSandboxes()
		target.Apply(7, created("disks/b.raw"))
		if _, err := DecodeSnapshot(data, target); !errors.Is(err, ErrBadSnapshot) {
			t.Errorf("%s: DecodeSnapshot = %v, want ErrBadSnapshot", name, err)
		}
		if _, ok := target.PathOwner("disks/b.raw"); !ok || target.Seq() != 7 {
			t.Errorf("%s: a refused snapshot changed the projection", name)
		}
	}
	if _, err := DecodeSnapshot(good, NewVolumes()); !errors.Is(err, ErrBadSnapshot) {
		t.Errorf("a sandboxes snapshot loaded into the volumes projection: %v", err)
	}
}

func TestOwnershipFollowsLifecycle(t *testing.T) {
	id := ulid.MustParse("01JDQ4Z6X1M9A3Y0C5TB2R8NKW")
	sb := id.String()
	s := NewSandboxes()
	seq := uint64(0)
	apply := func(p events.Payload) {
		seq++
		s.Apply(seq, events.New(id, t0, sb, p))
	}
	apply(events.SagaStartedEvent{Kind: "create"})
	if got := s.Get(sb); got == nil || got.State != StateCreating {
		t.Fatalf("after saga start: %+v", got)
	}
	apply(events.IntentWrittenEvent{Resource: events.Resource{Kind: events.KindCreateIntent, Path: "disks/" + sb + ".create-intent.json"}})
	apply(events.DiskMaterialisedEvent{Resource: events.Resource{Kind: events.KindRawDisk, Path: "disks/" + sb + ".raw"}})
	if owner, ok := s.PathOwner("disks/" + sb + ".raw"); !ok || owner != sb {
		t.Fatalf("materialised disk owner = %q, %v", owner, ok)
	}
	apply(events.SandboxCreatedEvent{Handle: "dev", Image: "base", Driver: "process"})
	apply(events.IntentRetiredEvent{Resource: events.Resource{Kind: events.KindCreateIntent, Path: "disks/" + sb + ".create-intent.json"}})
	if _, ok := s.PathOwner("disks/" + sb + ".create-intent.json"); ok {
		t.Fatal("retired intent still owned")
	}
	apply(events.SnapshotTakenEvent{SnapshotID: "S1", Dir: events.Resource{Kind: events.KindSnapshot, Path: "snapshots/" + sb + "/S1"}})
	for _, p := range []string{"snapshots/" + sb, "snapshots/" + sb + "/S1", "snapshots/" + sb + "/S1/memory-ranges"} {
		if owner, ok := s.PathOwner(p); !ok || owner != sb {
			t.Fatalf("PathOwner(%s) = %q, %v: want %s (the path, one below it, or one above it)", p, owner, ok, sb)
		}
	}
	if _, ok := s.PathOwner("snapshots"); ok {
		t.Fatal("a top-level directory is owned")
	}
	apply(events.SandboxStartedEvent{VMMPid: 10, VMMStart: 20})
	if got := s.Get(sb); got.State != StateRunning || got.VMM.Pid != 10 || got.Handle != "dev" {
		t.Fatalf("after start: %+v", got)
	}
	apply(events.SandboxRemovedEvent{})
	if len(s.Owned()) != 0 || s.Len() != 0 {
		t.Fatalf("after remove: %d owned, %d sandboxes", len(s.Owned()), s.Len())
	}
	if _, ok := s.PathOwner("snapshots/" + sb); ok {
		t.Fatal("a removed sandbox's snapshot directory is still owned")
	}
}
