package store

import (
	"context"
	"crypto/rand"
	"slices"
	"testing"
	"time"

	"github.com/oklog/ulid/v2"

	"github.com/nexus-sandbox/nexus/events"
	"github.com/nexus-sandbox/nexus/host/journal"
)

// TestRetryPastTheDedupeWindowIsNotStoredTwice: JetStream recognises a
// message id sent again only within its de-duplication window (shortened
// to 1 s here). An append retried after it, the very events it sent
// before, gets the sequences they were stored at, and the journal does not
// grow; a different event is still appended.
func TestRetryPastTheDedupeWindowIsNotStoredTwice(t *testing.T) {
	ctx := context.Background()
	n, err := Open(ctx, t.TempDir(), Options{Journal: journal.Options{DedupeWindow: time.Second}})
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	sb := ulid.Make().String()
	made := time.Now().Add(-3 * time.Second) // the retry's events were made before the window
	old := func(p events.Payload) events.Event {
		return events.New(ulid.MustNew(ulid.Timestamp(made), rand.Reader), made, sb, p)
	}
	evs := []events.Event{
		old(events.SandboxCreatedEvent{Image: "i", Driver: "process"}),
		old(events.SandboxStartedEvent{VMMPid: 7, VMMStart: 7}),
	}
	first, err := n.Append(ctx, evs...)
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(1500 * time.Millisecond) // past the window: JetStream would store them again
	again, err := n.Append(ctx, evs...)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(again, first) {
		t.Fatalf("the retry was stored at %v, the original at %v", again, first)
	}
	last := uint64(0)
	if err := n.Events(ctx, Query{}, func(r Record) error { last = r.Seq; return nil }); err != nil {
		t.Fatal(err)
	}
	if last != first[len(first)-1] {
		t.Fatalf("the journal grew to %d after a retry of events stored at %v", last, first)
	}
	fresh, err := n.Append(ctx, old(events.SandboxStoppedEvent{}))
	if err != nil || fresh[0] != last+1 {
		t.Fatalf("a new event made as long ago: %v %v, want %d", fresh, err, last+1)
	}
}
