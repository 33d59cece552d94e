package node

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/oklog/ulid/v2"

	"github.com/nexus-sandbox/nexus/events"
	"github.com/nexus-sandbox/nexus/host/journal"
	"github.com/nexus-sandbox/nexus/host/smallfs"
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
		kind string
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
		{"reap dry run", ev(events.ReapDecidedEvent{}, ""), "", false},
		{"run swept", ev(events.RunSweptEvent{}, ""), "", true},
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
	saga := func(kind string, id string, step string, p events.Payload) events.Event {
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
