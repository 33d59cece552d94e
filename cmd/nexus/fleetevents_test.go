package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
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

// A whole read decodes on every core and prints exactly what one
// goroutine printing record after record prints, in the same order, an
// undecodable record reported and gone past; a failing write is the
// read's error.
func TestFleetEventsOrderedPrintsWhatTheSerialPrints(t *testing.T) {
	var recs []replay.FleetRecord
	for i := range 5000 {
		data, err := events.Encode(events.New(ulid.Make(), time.Unix(int64(i), 0), ulid.Make().String(), events.SandboxCreatedEvent{Image: "i", Driver: "process"}))
		if err != nil {
			t.Fatal(err)
		}
		if i == 300 {
			data = []byte("not an event")
		}
		recs = append(recs, replay.FleetRecord{Host: "host-a", Seq: uint64(i + 1), FleetSeq: uint64(i + 1), Data: data})
	}
	read := func(fn func(replay.FleetRecord) error) error {
		for _, r := range recs {
			if err := fn(r); err != nil {
				return err
			}
		}
		return nil
	}
	for _, o := range []*output{{}, {json: true}} {
		var want, wantErr, got, gotErr bytes.Buffer
		if err := read(printFleetEvent(&want, &wantErr, o)); err != nil {
			t.Fatal(err)
		}
		if err := printFleetEventsOrdered(&got, &gotErr, o, read); err != nil {
			t.Fatal(err)
		}
		if got.String() != want.String() || gotErr.String() != wantErr.String() || strings.Count(got.String(), "\n") != len(recs)-1 {
			t.Fatalf("json %v: ordered printed %d lines (stderr %q), the serial %d (stderr %q)", o.json,
				strings.Count(got.String(), "\n"), gotErr.String(), strings.Count(want.String(), "\n"), wantErr.String())
		}
	}
	if err := printFleetEventsOrdered(failingWriter{}, io.Discard, &output{}, read); err == nil || !strings.Contains(err.Error(), "output closed") {
		t.Fatalf("a failing output: %v", err)
	}
}

type failingWriter struct{}

func (failingWriter) Write([]byte) (int, error) { return 0, errors.New("output closed") }

// A line of `fleet events` is spelled as fmt spells its columns (padded
// by runes, numbers right-aligned, a wide value not cut), the payload as
// json.Marshal spells it, saga and step last when the event has them,
// whichever line the liner wrote before.
func TestFleetLineIsFmtsSpelling(t *testing.T) {
	sb := ulid.Make().String()
	at := time.Date(2026, 12, 5, 23, 1, 2, 345_000_000, time.UTC)
	created := events.SandboxCreatedEvent{Handle: "wéb", Image: "i", Driver: "process"}
	var liner fleetLiner
	for _, e := range []replay.FleetEntry{
		{Host: "host-a", FleetSeq: 1, Entry: replay.Entry{Seq: 1, Time: at, Type: events.SandboxCreated, Sandbox: sb, Payload: events.SandboxCreatedEvent{Image: "<a&b>", Driver: "process\u2028", Labels: events.Labels{"k": "v"}}}},
		{Host: "host-a", FleetSeq: 1, Entry: replay.Entry{Seq: 1, Time: at, Type: events.SandboxCreated, Sandbox: sb, Payload: created}},
		{Host: "a-host-name-longer-than-twelve", FleetSeq: 12_345_678, Entry: replay.Entry{Seq: 9_876_543, Time: at.Add(time.Hour), Type: events.SandboxCreated, Payload: created, Saga: "s1", Step: "boot"}},
		{Host: "hé", FleetSeq: 0, Entry: replay.Entry{Time: at.In(time.FixedZone("x", 3600)), Type: "a.type.name.wider.than.twenty-two", Sandbox: "ünïcode"}},
	} {
		data, _ := json.Marshal(e.Payload)
		want := fmt.Sprintf("%6d  %-12s %6d  %s  %-22s %-26s %s", e.FleetSeq, e.Host, e.Seq, e.Time.Format(stampLayout), e.Type, dash(e.Sandbox), data)
		if e.Saga != "" {
			want += "  saga=" + e.Saga + " step=" + e.Step
		}
		if got := string(appendFleetLine([]byte("kept"), e)); got != "kept"+want+"\n" {
			t.Errorf("line:\n%q\nwant\n%q", got, "kept"+want+"\n")
		}
		if got := string(liner.append([]byte("kept"), e)); got != "kept"+want+"\n" {
			t.Errorf("line of a liner used before:\n%q\nwant\n%q", got, "kept"+want+"\n")
		}
	}
}

// A line's time is spelled as the layout spells it, in the time's own
// zone, whatever the year and the milliseconds.
func TestStampIsTheLayoutsSpelling(t *testing.T) {
	zone := time.FixedZone("x", -5*3600-1800)
	for _, at := range []time.Time{
		time.Date(2026, 12, 5, 23, 1, 2, 345_678_901, time.UTC),
		time.Date(2026, 1, 9, 0, 0, 0, 0, time.UTC),
		time.Date(1, 1, 1, 1, 1, 1, 1_000_000, time.UTC),
		time.Date(999, 10, 31, 9, 59, 59, 999_999_999, time.UTC),
		time.Date(9999, 12, 31, 23, 59, 59, 5_000_000, zone),
		time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC),
		time.Date(-1, 1, 1, 0, 0, 0, 0, time.UTC),
		time.Unix(0, 1_764_979_200_123_456_789),
		time.Unix(0, 1_764_979_200_123_456_789).In(zone),
	} {
		if got, want := string(appendStamp([]byte("kept"), at)), "kept"+at.Format(stampLayout); got != want {
			t.Errorf("%v: %q, want %q", at, got, want)
		}
	}
}
