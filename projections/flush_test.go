package projections

import (
	"testing"

	"github.com/oklog/ulid/v2"

	"github.com/nexus-sandbox/nexus/events"
)

// TestRunMarkerAndAcknowledgement: a run is unacknowledged from the moment
// its marker is journaled (before the VMM spawns); only an acknowledgement
// of that run vouches for the overlay; a spawn that failed before any VM
// existed restores the previous marker and acknowledgement.
func TestRunMarkerAndAcknowledgement(t *testing.T) {
	id := ulid.Make().String()
	s := NewSandboxes()
	seq := uint64(0)
	apply := func(p events.Payload) *Sandbox {
		seq++
		s.Apply(seq, events.New(ulid.Make(), t0, id, p))
		return s.Get(id)
	}
	apply(events.SandboxCreatedEvent{Image: "i", Driver: "process"})
	sb := apply(events.FlushPendingEvent{Run: "r1"})
	if sb.LastRun != "r1" || sb.FlushedRun != "" {
		t.Fatalf("pending r1: %+v", sb)
	}
	apply(events.SandboxStartedEvent{RunMarker: "r1"})
	sb = apply(events.FlushAcknowledgedEvent{Run: "r1"})
	if sb.FlushedRun != "r1" {
		t.Fatalf("ack r1: %+v", sb)
	}
	sb = apply(events.FlushPendingEvent{Run: "r2", Previous: "r1", PreviousFlushed: "r1"})
	if sb.LastRun != "r2" || sb.FlushedRun == sb.LastRun {
		t.Fatalf("r2 must be unacknowledged: %+v", sb)
	}
	if sb = apply(events.FlushAcknowledgedEvent{Run: "r1"}); sb.FlushedRun == "r2" {
		t.Fatal("an acknowledgement of r1 vouched for r2")
	}
	sb = apply(events.FlushRestoredEvent{Run: "r2", Previous: "r1", PreviousFlushed: "r1"})
	if sb.LastRun != "r1" || sb.FlushedRun != "r1" {
		t.Fatalf("restored: %+v", sb)
	}
	if sb = apply(events.FlushRestoredEvent{Run: "r9", Previous: "x"}); sb.LastRun != "r1" {
		t.Fatal("a restore of another run changed the marker")
	}
}
