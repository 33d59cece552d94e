package main

import (
	"bytes"
	"encoding/json"
	"testing"
	"time"

	"github.com/oklog/ulid/v2"

	"github.com/nexus-sandbox/nexus/events"
	"github.com/nexus-sandbox/nexus/replay"
)

// BenchmarkFleetLine: a plain line of `fleet events` per op, decoded and
// formatted in process (no NATS), over the records host/fleet's
// benchmark of `fleet events` reads (sandbox.created) and over a create's
// mix of events. "transcoded" is the command's path (the payload
// transcoded to JSON); "decoded" decodes the event (replay.DecodeFleet)
// and encodes its payload by reflection, as the command did before. Run
// with -count for pairs in the same run.
func BenchmarkFleetLine(b *testing.B) {
	at := time.Unix(0, 1_764_979_200_123_456_789)
	bench := func() events.Payload { return events.SandboxCreatedEvent{Image: "bench", Driver: "process"} }
	mix := []events.Payload{
		events.SagaStartedEvent{Kind: events.SagaCreate, Steps: []string{"intent", "os-disk", "commit"}},
		events.IntentWrittenEvent{Resource: events.Resource{Kind: events.KindCreateIntent, Path: "disks/01JDQ4Z6X1M9A3Y0C5TB2R8NKW.create-intent.json"}},
		events.DiskMaterialisedEvent{Resource: events.Resource{Kind: events.KindRawDisk, Path: "disks/01JDQ4Z6X1M9A3Y0C5TB2R8NKW.raw"}, Method: "reflink", AllocatedBytes: 4096, ApparentBytes: 1 << 30},
		events.SandboxCreatedEvent{Handle: "web-1", Image: "base.raw", Driver: "process", Resources: []events.Resource{{Kind: events.KindRawDisk, Path: "disks/01JDQ4Z6X1M9A3Y0C5TB2R8NKW.raw"}},
			Bootstrap: events.Bootstrap{CacheID: "img-1", Identity: "stat-sha256:ab"}, Boot: events.BootConfig{Cpus: 2, MemoryBytes: 1 << 30, Root: events.RootOverlay}, Labels: events.Labels{"team": "web"}},
		events.IntentRetiredEvent{Resource: events.Resource{Kind: events.KindCreateIntent, Path: "disks/01JDQ4Z6X1M9A3Y0C5TB2R8NKW.create-intent.json"}},
		events.SagaFinishedEvent{},
		events.SandboxStartedEvent{Driver: "process", VMMPid: 4242, VMMStart: 9000, Sockets: []events.Resource{{Kind: events.KindAPISocket, Path: "run/sb-x.sock"}}},
		events.SandboxReadyEvent{Run: "01JDQ4Z6X1M9A3Y0C5TB2R8NKV", By: "agent", BootAtMs: 1700000000000, ReadyAtMs: 1700000009000},
	}
	for _, set := range []struct {
		name     string
		payloads []events.Payload
	}{{"sandbox.created", []events.Payload{bench()}}, {"mix", mix}} {
		var recs []replay.FleetRecord
		for i := range 4096 {
			p := set.payloads[i%len(set.payloads)]
			e := events.New(ulid.Make(), at, ulid.Make().String(), p)
			if set.name == "mix" && p.EventType() != events.SandboxStarted && p.EventType() != events.SandboxReady {
				e = e.InSaga(ulid.Make().String(), "step")
			}
			data, err := events.Encode(e)
			if err != nil {
				b.Fatal(err)
			}
			recs = append(recs, replay.FleetRecord{Host: "host-a", Seq: uint64(i + 1), FleetSeq: uint64(i + 1), Data: data})
		}
		b.Run(set.name+"/transcoded", func(b *testing.B) {
			var out bytes.Buffer
			p := newFleetPrinter(&output{})
			b.ReportAllocs()
			for i := range b.N {
				if i%256 == 0 {
					out.Reset()
				}
				if err := p.print(&out, &out, recs[i%len(recs)]); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run(set.name+"/decoded", func(b *testing.B) {
			var out, payload bytes.Buffer
			var line []byte
			var l fleetLiner
			enc := json.NewEncoder(&payload)
			b.ReportAllocs()
			for i := range b.N {
				if i%256 == 0 {
					out.Reset()
				}
				e, err := replay.DecodeFleet(recs[i%len(recs)])
				if err != nil {
					b.Fatal(err)
				}
				payload.Reset()
				if enc.Encode(e.Payload) != nil {
					b.Fatal(err)
				}
				je := events.JSONEvent{Type: e.Type, Time: e.Time, Sandbox: []byte(e.Sandbox), Saga: []byte(e.Saga), Step: []byte(e.Step), Payload: bytes.TrimSuffix(payload.Bytes(), []byte("\n"))}
				line = l.append(line[:0], e.FleetSeq, e.Host, e.Seq, &je)
				out.Write(line)
			}
		})
	}
}
