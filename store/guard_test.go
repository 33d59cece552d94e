package store_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/oklog/ulid/v2"

	"github.com/nexus-sandbox/nexus/core"
	"github.com/nexus-sandbox/nexus/events"
	"github.com/nexus-sandbox/nexus/store"
)

func TestAppendExpectRefusesStaleDecisionsAndClosedSagas(t *testing.T) {
	ctx := context.Background()
	n, err := store.Open(ctx, t.TempDir(), store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	id := ulid.Make().String()
	saga := ulid.Make().String()
	ev := func(p events.Payload) events.Event {
		e := events.New(ulid.Make(), time.Now(), id, p)
		e.Saga, e.Step = saga, string(p.EventType())
		return e
	}
	ent := core.Sandbox(id)
	// A new sandbox: the create decision saw nothing about it.
	seqs, err := n.AppendExpect(ctx, []core.Expect{{Entity: ent, Seq: 0}}, ev(events.SagaStartedEvent{Kind: "create"}))
	if err != nil {
		t.Fatal(err)
	}
	if n.Rev(ent) != seqs[0] {
		t.Fatalf("Rev = %d, want %d", n.Rev(ent), seqs[0])
	}
	// A second create decided on the same empty state loses.
	_, err = n.AppendExpect(ctx, []core.Expect{{Entity: ent, Seq: 0}}, ev(events.SagaStartedEvent{Kind: "create"}))
	var stale *core.StaleError
	if !errors.As(err, &stale) || stale.Actual != seqs[0] || stale.Latest != events.SagaStarted {
		t.Fatalf("second decision on the same state = %v, want stale at %d (saga.started)", err, seqs[0])
	}
	// Another sandbox's events do not make this one's decision stale.
	other := events.New(ulid.Make(), time.Now(), ulid.Make().String(), events.WarningRaisedEvent{Reason: "x"})
	if _, err := n.Append(ctx, other); err != nil {
		t.Fatal(err)
	}
	if _, err := n.AppendExpect(ctx, []core.Expect{{Entity: ent, Seq: seqs[0]}}, ev(events.SagaCompensatedEvent{Reason: "test"})); err != nil {
		t.Fatalf("fresh decision refused: %v", err)
	}
	// The saga is closed: nothing more may be written in its name.
	if _, err := n.Append(ctx, ev(events.ResourceReclaimedEvent{By: "late"})); !errors.Is(err, core.ErrSagaClosed) {
		t.Fatalf("event of a closed saga = %v, want ErrSagaClosed", err)
	}
}
