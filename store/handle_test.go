package store

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/oklog/ulid/v2"

	"github.com/nexus-sandbox/nexus/core"
	"github.com/nexus-sandbox/nexus/events"
)

// createWithHandle is a create's commit: the sandbox and its claim of
// handle, in one append, on a decision that saw the handle at rev.
func createWithHandle(ctx context.Context, n *Store, handle string, rev uint64) (string, []uint64, error) {
	id := ulid.Make().String()
	saga := ulid.Make().String()
	ev := func(p events.Payload, step string) events.Event {
		e := events.New(ulid.Make(), time.Now(), id, p)
		e.Saga, e.Step = saga, step
		return e
	}
	expect := []core.Expect{{Entity: core.Sandbox(id)}, {Entity: core.Handle(handle), Seq: rev}}
	seqs, err := n.AppendExpect(ctx, expect, ev(events.SagaStartedEvent{Kind: events.SagaCreate}, "saga.started"),
		ev(events.SandboxCreatedEvent{Handle: handle, Image: "img", Driver: "process"}, "commit"),
		ev(events.HandleClaimedEvent{Sandbox: id, Handle: handle}, "commit#2"))
	return id, seqs, err
}

// The store refuses a sandbox a handle another live sandbox holds, naming
// the holder, even on a decision that saw the handle's last claim: the
// journal's own check (the claim's expected sequence) would let it by.
func TestStoreRefusesAHeldHandle(t *testing.T) {
	ctx := context.Background()
	n := openTestNode(t)
	a, seqs, err := createWithHandle(ctx, n, "d9", 0)
	if err != nil {
		t.Fatal(err)
	}
	rev := n.Rev(core.Handle("d9"))
	if rev != seqs[2] {
		t.Fatalf("Rev(handle/d9) = %d, want the claim's %d", rev, seqs[2])
	}
	b, _, err := createWithHandle(ctx, n, "d9", rev)
	var held *core.HandleHeld
	if !errors.As(err, &held) || held.Holder != a || !errors.Is(err, core.ErrRefused) {
		t.Fatalf("create of a held handle = %v, want refused naming %s", err, a)
	}
	if sb, found, _ := n.Sandbox(ctx, b); found && sb.Handle != "" {
		t.Fatalf("refused sandbox holds %q", sb.Handle)
	}
	// Removed, its holder frees the handle: no release event needed.
	if _, err := n.Append(ctx, events.New(ulid.Make(), time.Now(), a, events.SandboxRemovedEvent{})); err != nil {
		t.Fatal(err)
	}
	c, _, err := createWithHandle(ctx, n, "d9", rev)
	if err != nil {
		t.Fatalf("create of a handle whose holder is removed: %v", err)
	}
	if sb, _, _ := n.Sandbox(ctx, "d9"); sb.ID != c {
		t.Fatalf("d9 is %s, want %s", sb.ID, c)
	}
}

// The journal refuses, by itself, a claim decided before another claim of
// the same handle: with the store's admission switched off, the claim's
// expected subject sequence still keeps the second create out, whole.
func TestJournalRefusesAStaleClaim(t *testing.T) {
	ctx := context.Background()
	n := openTestNode(t)
	a, seqs, err := createWithHandle(ctx, n, "d9", 0)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { admit = core.Admit }()
	admit = func(_ core.Journal, _ []core.Expect, evs []events.Event) (int, error) { return len(evs), nil }
	b, _, err := createWithHandle(ctx, n, "d9", 0) // decided when d9 was free
	var stale *core.StaleError
	if !errors.As(err, &stale) || stale.Entity != core.Handle("d9") || stale.Actual != seqs[2] {
		t.Fatalf("claim decided on a free d9 after %s claimed it = %v, want stale on handle/d9 at %d", a, err, seqs[2])
	}
	admit = core.Admit
	err = n.Events(ctx, Query{Sandbox: b}, func(r Record) error {
		if r.Event.Type == events.SandboxCreated {
			t.Errorf("the refused create's commit is in the journal at %d", r.Seq)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if sb, _, _ := n.Sandbox(ctx, "d9"); sb.ID != a {
		t.Fatalf("d9 is %s, want %s", sb.ID, a)
	}
}
