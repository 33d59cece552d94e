package core

import (
	"testing"

	"github.com/nexus-sandbox/nexus/events"
)

const id = "01JDQ4Z6X1M9A3Y0C5TB2R8NKW"

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
