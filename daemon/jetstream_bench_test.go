package daemon_test

import (
	"context"
	"fmt"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/nexus-sandbox/nexus/internal/jstest"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/nexus-sandbox/nexus/events"
	"github.com/nexus-sandbox/nexus/host/journal"
)

// BenchmarkAppendVsJetStream measures appends through the daemon against
// JetStream alone storing the same messages with the same durability, in
// alternating rounds of one run:
//
//	daemon:    g writers, each its own client connection (a separate
//	           command), each appending one event and waiting for its
//	           acknowledgement (which comes once the journal's fsync of
//	           its group covers it)
//	jetstream: an embedded nats-server run with SyncAlways (nats-server's
//	           `sync_interval: always`: every stored message is fsynced
//	           before it is acknowledged), on a stream the journal created
//	           (its configuration exactly), g publishers, each its own
//	           connection, publishing the same encoded events on their
//	           journal subjects with their message ids and waiting for
//	           each acknowledgement; any grouping is the server's own
//	ratio:     daemon events/s ÷ jetstream events/s (target: ≥ 0.8)
//
// cpu-us/event and js-cpu-us/event are this process's CPU per event while
// each side ran (the daemon, its clients and the server are all in it).
func BenchmarkAppendVsJetStream(b *testing.B) {
	for _, g := range []int{8, 32} {
		b.Run(fmt.Sprintf("g=%d", g), func(b *testing.B) {
			dir := b.TempDir()
			n := max(b.N, 2*g)
			evs := benchEvents(b, g, n)
			d := startBenchDaemon(b, filepath.Join(dir, "root"), g)
			js := startSyncAlwaysJetStream(b, filepath.Join(dir, "jetstream"), g)

			const roundEvents = 128
			var jsTime, daemonTime, jsCPU, daemonCPU time.Duration
			b.ResetTimer()
			for from := 0; from < n; from += roundEvents {
				k := min(roundEvents, n-from)
				t0, c0 := time.Now(), cpuNow()
				js.run(b, evs, from, k)
				jsCPU += cpuNow() - c0
				jsTime += time.Since(t0)
				t0, c0 = time.Now(), cpuNow()
				d.run(b, evs, from, k)
				daemonCPU += cpuNow() - c0
				daemonTime += time.Since(t0)
			}
			b.StopTimer()
			js.check(b, uint64(n))
			jsRate := float64(n) / jsTime.Seconds()
			rate := float64(n) / daemonTime.Seconds()
			b.ReportMetric(jsRate, "js-events/s")
			b.ReportMetric(rate, "events/s")
			b.ReportMetric(rate/jsRate, "ratio")
			b.ReportMetric(float64(daemonCPU.Microseconds())/float64(n), "cpu-us/event")
			b.ReportMetric(float64(jsCPU.Microseconds())/float64(n), "js-cpu-us/event")
		})
	}
}

// syncAlwaysJetStream is JetStream alone: a server of its own on a copy of
// the journal's stream, fsyncing every message before acknowledging it.
type syncAlwaysJetStream struct {
	pubs []jetstream.JetStream
	js   jetstream.JetStream
}

func startSyncAlwaysJetStream(b *testing.B, dir string, g int) *syncAlwaysJetStream {
	b.Helper()
	ctx := context.Background()
	// The journal creates its stream (subjects, transform, republish,
	// de-duplication window, limits) and closes; the server below then
	// serves that very stream with nothing of nexus in front of it.
	j, err := journal.Open(ctx, journal.Options{Dir: dir})
	if err != nil {
		b.Fatal(err)
	}
	if err := j.Close(); err != nil {
		b.Fatal(err)
	}
	srv := jstest.Start(b, server.Options{ServerName: "jetstream-alone", StoreDir: dir,
		SyncAlways: true, JetStreamMaxStore: 1 << 40})
	s := &syncAlwaysJetStream{}
	for range g + 1 {
		s.pubs = append(s.pubs, jstest.Connect(b, srv, jetstream.WithDefaultTimeout(time.Minute)))
	}
	s.js, s.pubs = s.pubs[g], s.pubs[:g]
	if _, err := s.js.Stream(ctx, journal.StreamName); err != nil {
		b.Fatalf("the journal's stream on the plain server: %v", err)
	}
	return s
}

// run publishes k events in all, the writers taking turns as
// benchDaemon.run's do, each waiting for every acknowledgement.
func (s *syncAlwaysJetStream) run(b *testing.B, evs [][]events.Event, from, k int) {
	b.Helper()
	g := len(evs)
	var wg sync.WaitGroup
	for w := range evs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := from + (w-from%g+g)%g; i < from+k; i += g {
				e := evs[w][i/g]
				data, err := events.Encode(e)
				if err != nil {
					b.Error(err)
					return
				}
				subject, err := e.Subject()
				if err != nil {
					b.Error(err)
					return
				}
				msg := &nats.Msg{Subject: journal.AppendSubject(subject), Data: data, Header: nats.Header{}}
				ack, err := s.pubs[w].PublishMsg(context.Background(), msg,
					jetstream.WithMsgID(e.DedupID()), jetstream.WithExpectStream(journal.StreamName))
				if err != nil {
					b.Error(err)
					return
				}
				if ack.Duplicate {
					b.Errorf("event %s stored as a duplicate", e.ID)
					return
				}
			}
		}()
	}
	wg.Wait()
}

// check fails unless the stream holds exactly the n events published.
func (s *syncAlwaysJetStream) check(b *testing.B, n uint64) {
	b.Helper()
	st, err := s.js.Stream(context.Background(), journal.StreamName)
	if err != nil {
		b.Fatal(err)
	}
	info, err := st.Info(context.Background())
	if err != nil {
		b.Fatal(err)
	}
	if info.State.Msgs != n {
		b.Fatalf("jetstream stored %d messages, want %d", info.State.Msgs, n)
	}
}
