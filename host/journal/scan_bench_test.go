package journal_test

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/nexus-sandbox/nexus/events"
	"github.com/nexus-sandbox/nexus/host/journal"
)

// BenchmarkEventsByPosition is "events read by position" over
// 100,000 events: a full dump through Scan (and with every event decoded,
// as `nexus events` does) against a raw ordered consumer over the same
// stream, paired in each op (target: dump ≥ 0.8x raw), and the cost of a
// tail, of one type's tail and of a late start, which read only what they
// return.
func BenchmarkEventsByPosition(b *testing.B) {
	dir := filepath.Join(b.TempDir(), "journal")
	total := benchBuildJournal(b, dir, replayEvents)
	j := benchOpen(b, dir)
	ctx := context.Background()

	raw := func(b *testing.B) time.Duration {
		t0 := time.Now()
		cons, err := j.StreamForBench().OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{})
		if err != nil {
			b.Fatal(err)
		}
		it, err := cons.Messages(jetstream.PullMaxMessages(1024))
		if err != nil {
			b.Fatal(err)
		}
		defer it.Stop()
		var n, size int64
		for n < replayEvents {
			m, err := it.Next()
			if err != nil {
				b.Fatal(err)
			}
			n++
			size += int64(len(m.Data()))
		}
		if size != total {
			b.Fatalf("raw read %d bytes, want %d", size, total)
		}
		return time.Since(t0)
	}
	dump := func(b *testing.B, decode bool) time.Duration {
		t0 := time.Now()
		var n, size int64
		if err := j.Scan(ctx, journal.Range{}, func(r journal.Record) error {
			n++
			size += int64(len(r.Data))
			if decode {
				_, err := events.Decode(r.Data)
				return err
			}
			return nil
		}); err != nil {
			b.Fatal(err)
		}
		if n != replayEvents || size != total {
			b.Fatalf("dump read %d events, %d bytes; want %d, %d", n, size, replayEvents, total)
		}
		return time.Since(t0)
	}
	b.Run("dump-vs-raw", func(b *testing.B) {
		var rawD, dumpD, decD time.Duration
		for i := 0; i < b.N; i++ {
			rawD += raw(b)
			dumpD += dump(b, false)
			decD += dump(b, true)
		}
		n := float64(replayEvents) * float64(b.N)
		b.ReportMetric(n/rawD.Seconds(), "raw-events/s")
		b.ReportMetric(n/dumpD.Seconds(), "dump-events/s")
		b.ReportMetric(float64(rawD)/float64(dumpD), "dump/raw")
		b.ReportMetric(float64(rawD)/float64(decD), "decoded-dump/raw")
	})
	positional := func(name string, r journal.Range, want int) {
		b.Run(name, func(b *testing.B) {
			for i := 0; i < b.N; i++ {
				before := j.RecordsRead()
				if err := j.Scan(ctx, r, func(journal.Record) error { return nil }); err != nil {
					b.Fatal(err)
				}
				if got := j.RecordsRead() - before; got != uint64(want) {
					b.Fatalf("read %d records, want %d", got, want)
				}
			}
		})
	}
	positional("tail-10", journal.Range{Tail: 10}, 10)
	positional("type-tail-10", journal.Range{Tail: 10, Filters: []string{"nexus.events.sandbox.created.*"}}, 10)
	positional("since-last-100", journal.Range{From: replayEvents - 99}, 100)
}
