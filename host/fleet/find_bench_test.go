package fleet_test

import (
	"context"
	"fmt"
	"math/rand"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/oklog/ulid/v2"

	"github.com/nexus-sandbox/nexus/events"
	"github.com/nexus-sandbox/nexus/host/fleet"
	"github.com/nexus-sandbox/nexus/host/journal"
	"github.com/nexus-sandbox/nexus/replay"
)

// BenchmarkFleetFind: `nexus fleet find` over an aggregate of
// NEXUS_BENCH_FLEET_EVENTS events (default 1,000,000; 3 hosts, 10 events
// per sandbox) against the baseline an operator has without nexus, a
// get of the last message by subject (what `nats stream get
// --last-for SUBJECT` sends) on the same stream. find by ID reads the
// sandbox's events; find by handle first reads every host's
// sandbox.created events.
func BenchmarkFleetFind(b *testing.B) {
	n := 1_000_000
	if s := os.Getenv("NEXUS_BENCH_FLEET_EVENTS"); s != "" {
		var err error
		if n, err = strconv.Atoi(s); err != nil {
			b.Fatal(err)
		}
	}
	srv, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: -1, JetStream: true, StoreDir: b.TempDir(), NoLog: true, NoSigs: true})
	if err != nil {
		b.Fatal(err)
	}
	srv.Start()
	defer srv.Shutdown()
	if !srv.ReadyForConnections(10 * time.Second) {
		b.Fatal("server not ready")
	}
	nc, err := nats.Connect(srv.ClientURL())
	if err != nil {
		b.Fatal(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc, jetstream.WithPublishAsyncMaxPending(16384))
	ctx := context.Background()
	s, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: fleet.AggregateStream, Subjects: []string{"host-a.>", "host-b.>", "host-c.>"}, AllowDirect: true})
	if err != nil {
		b.Fatal(err)
	}
	hosts := []string{"host-a", "host-b", "host-c"}
	entropy := ulid.Monotonic(rand.New(rand.NewSource(7)), 0)
	var target, targetHost string
	steps := []events.Payload{
		events.SagaStartedEvent{Kind: "create", Steps: []string{"intent", "os-disk", "commit"}},
		events.IntentWrittenEvent{Resource: events.Resource{Kind: events.KindCreateIntent, Path: "disks/x.create-intent.json"}},
		events.DiskMaterialisedEvent{Resource: events.Resource{Kind: events.KindRawDisk, Path: "disks/x.raw"}, Method: "reflink"},
		nil, // sandbox.created, with the handle
		events.IntentRetiredEvent{Resource: events.Resource{Kind: events.KindCreateIntent, Path: "disks/x.create-intent.json"}},
		events.SagaFinishedEvent{},
		events.SandboxStartedEvent{Driver: "process", VMMPid: 42},
		events.SandboxStoppedEvent{Reason: "user"},
		events.SandboxStartedEvent{Driver: "process", VMMPid: 43},
		events.WarningRaisedEvent{Reason: "bench", Message: "tenth event"},
	}
	at := time.Date(2026, 12, 3, 9, 0, 0, 0, time.UTC)
	for i := 0; i < n/len(steps); i++ {
		host := hosts[i%len(hosts)]
		id := ulid.MustNew(ulid.Timestamp(at), entropy).String()
		handle := fmt.Sprintf("sb-%d", i)
		if i == n/len(steps)/2 {
			target, targetHost, handle = id, host, "target"
		}
		for _, p := range steps {
			if p == nil {
				p = events.SandboxCreatedEvent{Handle: handle, Image: "base.raw", Driver: "process"}
			}
			at = at.Add(time.Millisecond)
			e := events.New(ulid.MustNew(ulid.Timestamp(at), entropy), at, id, p)
			data, err := events.Encode(e)
			if err != nil {
				b.Fatal(err)
			}
			subj, _ := e.Subject()
			if _, err := js.PublishAsync(host+"."+subj, data); err != nil {
				b.Fatal(err)
			}
		}
		if i%1000 == 999 {
			<-js.PublishAsyncComplete()
		}
	}
	<-js.PublishAsyncComplete()
	if info, err := s.Info(ctx); err != nil || info.State.Msgs != uint64(n/len(steps)*len(steps)) {
		b.Fatalf("aggregate holds %+v (%v)", info.State, err)
	}
	f, err := fleet.Dial(srv.ClientURL(), "")
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	read := func(filters []string, fn func(replay.FleetRecord) error) error {
		return f.Scan(ctx, journal.Range{Filters: filters}, func(r fleet.Record) error {
			return fn(replay.FleetRecord{Host: r.Host, Seq: r.HostSeq, FleetSeq: r.Seq, Data: r.Data})
		})
	}
	find := func(b *testing.B, ref string) {
		for b.Loop() {
			found, err := replay.FleetFind(read, ref)
			if err != nil || len(found) != 1 || found[0].ID != target || found[0].Host != targetHost || found[0].State != "running" {
				b.Fatalf("find %s: %+v %v", ref, found, err)
			}
		}
	}
	b.Run("find-id", func(b *testing.B) { find(b, target) })
	b.Run("find-handle", func(b *testing.B) { find(b, "target") })
	b.Run("get-last-by-subject", func(b *testing.B) {
		for b.Loop() {
			m, err := s.GetLastMsgForSubject(ctx, targetHost+".nexus.events.*.*."+target)
			if err != nil || m.Subject != targetHost+".nexus.events.warning.raised."+target {
				b.Fatalf("get last: %v %v", m, err)
			}
		}
	})
}
