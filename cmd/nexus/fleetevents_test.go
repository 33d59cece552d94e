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
	"github.com/vmihailenco/msgpack/v5"

	"github.com/nexus-sandbox/nexus/events"
	"github.com/nexus-sandbox/nexus/host/fleetstate"
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
		je := &events.JSONEvent{Type: e.Type, Time: e.Time, Sandbox: []byte(e.Sandbox), Saga: []byte(e.Saga), Step: []byte(e.Step), Payload: data}
		if got := string(liner.append([]byte("kept"), e.FleetSeq, e.Host, e.Seq, je)); got != "kept"+want+"\n" {
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

// fleetLineOf is the line of `fleet events` for rec as the columns are
// spelled by fmt and the payload by json.Marshal, from the event Decode
// gives (replay.DecodeFleet), or the warning of a record that does not
// decode.
func fleetLineOf(rec replay.FleetRecord) (line, warning string) {
	e, err := replay.DecodeFleet(rec)
	if err != nil {
		return "", fmt.Sprintf("nexus: warning: skipped %s\n", fleetstate.Rejected{Stream: fleetstate.AggregateStream, Seq: rec.FleetSeq, Reason: err.Error()})
	}
	data, _ := json.Marshal(e.Payload)
	line = fmt.Sprintf("%6d  %-12s %6d  %s  %-22s %-26s %s", e.FleetSeq, e.Host, e.Seq, e.Time.Format(stampLayout), e.Type, dash(e.Sandbox), data)
	if e.Saga != "" {
		line += "  saga=" + e.Saga + " step=" + e.Step
	}
	return line + "\n", ""
}

// A plain line of every event type, its payload transcoded from the
// record, is byte for byte the line of the event Decode gives, its
// payload marshalled: zero payloads (each field absent), filled ones
// (labels out of order, strings JSON escapes), with and without sandbox,
// saga and step, an older schema upcast, records that do not decode; one
// record at a time and on every core.
func TestFleetEventsPlainLineIsTheDecodedEvents(t *testing.T) {
	id := ulid.Make()
	envelope := func(typ events.Type, schema uint16, sandbox, saga string, payload any) []byte {
		p, err := msgpack.Marshal(payload)
		if err != nil {
			t.Fatal(err)
		}
		m := map[string]any{"f": events.EnvelopeFormat, "id": id[:], "t": string(typ), "v": schema, "ts": int64(1_764_979_200_123_456_789), "p": msgpack.RawMessage(p)}
		if sandbox != "" {
			m["sb"] = sandbox
		}
		if saga != "" {
			m["saga"], m["step"] = saga, "commit"
		}
		data, err := msgpack.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		return data
	}
	sb := ulid.Make().String()
	var datas [][]byte
	for i, typ := range events.Types() {
		saga := ""
		if i%2 == 0 {
			saga = ulid.Make().String()
		}
		datas = append(datas, envelope(typ, events.CurrentSchema(typ), sb, saga, map[string]any{}))
	}
	for _, p := range []events.Payload{
		events.SandboxCreatedEvent{Handle: "wéb", Image: "<img&>", Driver: "process", Resources: []events.Resource{{Kind: events.KindRawDisk, Path: "disks/x.raw"}},
			Bootstrap: events.Bootstrap{CacheID: "c"}, Boot: events.BootConfig{Cpus: 2, MemoryBytes: 1 << 30}, Labels: events.Labels{"z": "1", "a": "\u2028", "m": "\xff"}},
		events.SagaStartedEvent{Kind: events.SagaCreate, Steps: []string{}},
		events.VolumeAttachedEvent{Name: "v", GuestPath: "/data", ReadOnly: true},
		events.JournalDigestEvent{Seq: 1<<64 - 1, Digest: "00"},
		events.OverlayRecoveredEvent{Overlay: "o", OldBytes: -1},
	} {
		for _, sandbox := range []string{sb, ""} {
			data, err := events.Encode(events.New(id, time.Unix(0, 1_764_979_200_123_456_789), sandbox, p).InSaga(sandbox, "step"))
			if err != nil {
				t.Fatal(err)
			}
			datas = append(datas, data)
		}
	}
	datas = append(datas,
		envelope(events.SandboxCreated, 1, sb, "", map[string]any{"handle": "h", "image": "i", "driver": "process", "disk": "disks/x.raw"}),
		envelope(events.SandboxStopped, 1, sb, "", nil),
		envelope(events.SandboxStopped, 1, sb, "", map[string]any{"surprise": 1}),
		envelope("sandbox.teleported", 1, sb, "", map[string]any{}),
		[]byte("not an event"))
	var recs []replay.FleetRecord
	var want, wantErr strings.Builder
	for i, data := range datas {
		rec := replay.FleetRecord{Host: []string{"host-a", "hé"}[i%2], Seq: uint64(i + 1), FleetSeq: uint64(1000 + i), Data: data}
		recs = append(recs, rec)
		line, warning := fleetLineOf(rec)
		want.WriteString(line)
		wantErr.WriteString(warning)
	}
	if n := strings.Count(wantErr.String(), "\n"); n != 3 {
		t.Fatalf("%d records do not decode, want 3: %s", n, wantErr.String())
	}
	var out, errOut bytes.Buffer
	print := printFleetEvent(&out, &errOut, &output{})
	for _, rec := range recs {
		if err := print(rec); err != nil {
			t.Fatal(err)
		}
	}
	if out.String() != want.String() || errOut.String() != wantErr.String() {
		t.Fatalf("one at a time:\n%s\n%s\nwant\n%s\n%s", out.String(), errOut.String(), want.String(), wantErr.String())
	}
	out.Reset()
	errOut.Reset()
	read := func(fn func(replay.FleetRecord) error) error {
		for _, r := range recs {
			if err := fn(r); err != nil {
				return err
			}
		}
		return nil
	}
	if err := printFleetEventsOrdered(&out, &errOut, &output{}, read); err != nil {
		t.Fatal(err)
	}
	if out.String() != want.String() || errOut.String() != wantErr.String() {
		t.Fatalf("on every core:\n%s\n%s\nwant\n%s\n%s", out.String(), errOut.String(), want.String(), wantErr.String())
	}
}
