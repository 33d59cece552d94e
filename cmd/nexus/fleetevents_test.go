package main

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/oklog/ulid/v2"

	"github.com/nexus-sandbox/nexus/events"
	"github.com/nexus-sandbox/nexus/replay"
)

// `fleet events` reports a record that does not decode and prints the
// events after it: one bad record must not end every fleet-wide read.
func TestFleetEventsSkipsAnUndecodableRecord(t *testing.T) {
	sb := ulid.Make().String()
	data, err := events.Encode(events.New(ulid.Make(), time.Unix(1, 0), sb, events.SandboxCreatedEvent{Handle: "web", Image: "i", Driver: "process"}))
	if err != nil {
		t.Fatal(err)
	}
	var out, errOut bytes.Buffer
	print := printFleetEvent(&out, &errOut, &output{})
	for _, rec := range []replay.FleetRecord{
		{Host: "host-a", Seq: 1, FleetSeq: 1, Data: []byte("not an event")},
		{Host: "host-a", Seq: 2, FleetSeq: 2, Data: data},
	} {
		if err := print(rec); err != nil {
			t.Fatalf("record %d: %v", rec.FleetSeq, err)
		}
	}
	if !strings.Contains(errOut.String(), "skipped NEXUS-FLEET sequence 1") || !strings.Contains(errOut.String(), "host host-a seq 1") {
		t.Fatalf("stderr: %q", errOut.String())
	}
	if lines := strings.Split(strings.TrimSpace(out.String()), "\n"); len(lines) != 1 || !strings.Contains(lines[0], sb) {
		t.Fatalf("stdout: %q", out.String())
	}
}
