package journal_test

// Benchmarks for the journal. Every figure that has a target is reported as
// a ratio against a baseline measured in the same run on the same disk, so
// the numbers mean the same thing on a laptop and on a CI runner:
//
//	BenchmarkAppendVsRawFsync  ratio = journal.Append ns/op ÷ write(2)+fsync(2) ns/op   (target ≤ 1.5)
//	BenchmarkReplay100k/ratio  ratio = fold throughput ÷ raw consumer throughput        (target ≥ 0.8)
//
// See docs/benchmarks.md for how to run them and the figures last measured.

import (
	"context"
	"fmt"
	"math/rand"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nexus-sandbox/nexus/internal/jstest"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/oklog/ulid/v2"

	"github.com/nexus-sandbox/nexus/events"
	"github.com/nexus-sandbox/nexus/host/journal"
	"github.com/nexus-sandbox/nexus/projections"
	"github.com/nexus-sandbox/nexus/replay"
)

var benchT0 = time.Date(2026, 12, 3, 9, 0, 0, 0, time.UTC)

// benchEntropy is deterministic so two runs build byte-identical journals.
func benchEntropy(seed int64) *ulid.MonotonicEntropy {
	return ulid.Monotonic(rand.New(rand.NewSource(seed)), 0)
}

// benchDiskEvent is a disk.materialised event: with a real sandbox ULID and
// a relative disk path it encodes to ~215 bytes, a typical journal record.
func benchDiskEvent(entropy *ulid.MonotonicEntropy, i int, sandbox string) events.Event {
	at := benchT0.Add(time.Duration(i) * time.Millisecond)
	return events.New(ulid.MustNew(ulid.Timestamp(at), entropy), at, sandbox, events.DiskMaterialisedEvent{
		Resource:       events.Resource{Kind: events.KindRawDisk, Path: "disks/" + sandbox + ".raw"},
		Method:         "reflink",
		AllocatedBytes: 1 << 20,
		ApparentBytes:  8 << 30,
	})
}

// benchMessages builds n distinct ~200-byte appends (unique event and
// message ids), outside any timed region.
func benchMessages(b *testing.B, n int) []journal.Message {
	b.Helper()
	entropy := benchEntropy(1)
	sandbox := ulid.MustNew(ulid.Timestamp(benchT0), entropy).String()
	out := make([]journal.Message, n)
	for i := range out {
		e := benchDiskEvent(entropy, i, sandbox)
		out[i] = benchMessage(b, e)
	}
	return out
}

func benchMessage(b *testing.B, e events.Event) journal.Message {
	b.Helper()
	data, err := events.Encode(e)
	if err != nil {
		b.Fatal(err)
	}
	subject, err := e.Subject()
	if err != nil {
		b.Fatal(err)
	}
	return journal.Message{Subject: subject, ID: e.DedupID(), Data: data}
}

// benchHistory calls fn for n events of a realistic lifecycle mix over many
// sandboxes: each sandbox materialises its OS and workspace disks, is
// created owning both, and every other sandbox is later removed.
// 100,000 events cover ~28,600 sandboxes.
func benchHistory(n int, fn func(events.Event)) {
	entropy := benchEntropy(2)
	i := 0
	emit := func(sb string, p events.Payload) bool {
		if i >= n {
			return false
		}
		at := benchT0.Add(time.Duration(i) * time.Millisecond)
		fn(events.New(ulid.MustNew(ulid.Timestamp(at), entropy), at, sb, p))
		i++
		return true
	}
	for k := 0; i < n; k++ {
		sb := ulid.MustNew(ulid.Timestamp(benchT0.Add(time.Duration(i)*time.Millisecond)), entropy).String()
		raw := events.Resource{Kind: events.KindRawDisk, Path: "disks/" + sb + ".raw"}
		ws := events.Resource{Kind: events.KindWorkspaceDisk, Path: "disks/" + sb + "-workspace.ext4"}
		_ = emit(sb, events.DiskMaterialisedEvent{Resource: raw, Method: "reflink", AllocatedBytes: 1 << 20, ApparentBytes: 8 << 30}) &&
			emit(sb, events.DiskMaterialisedEvent{Resource: ws, Method: "mkfs", AllocatedBytes: 64 << 20, ApparentBytes: 4 << 30}) &&
			emit(sb, events.SandboxCreatedEvent{Handle: fmt.Sprintf("sb-%d", k), Image: "ghcr.io/nexus/base:24.04",
				Driver: "firecracker", Resources: []events.Resource{raw, ws}}) &&
			(k%2 == 1 || emit(sb, events.SandboxRemovedEvent{}))
	}
}

// benchBuildJournal fills the journal at dir with n events of benchHistory.
//
// Appending 100,000 events through journal.Append costs 100,000 fsyncs
// (SyncAlways), over a minute on this class of machine, so the fixture is
// written by a plain embedded server without SyncAlways onto a stream that
// journal.Open created: the records on disk are the same bytes (same
// subjects, Nats-Msg-Id headers and payloads); only the per-message fsync
// is skipped while building. journal.Open then verifies every block.
func benchBuildJournal(b *testing.B, dir string, n int) (totalBytes int64) {
	b.Helper()
	ctx := context.Background()
	j, err := journal.Open(ctx, journal.Options{Dir: dir})
	if err != nil {
		b.Fatal(err)
	}
	j.Close()

	// The journal opens this root next: the fixture's server is stopped
	// before the function returns.
	srv := jstest.Start(b, server.Options{ServerName: "nexus-bench-fixture", StoreDir: dir})
	defer jstest.Stop(srv)
	js := jstest.Connect(b, srv, jetstream.WithPublishAsyncMaxPending(4096))
	var pubErr error
	benchHistory(n, func(e events.Event) {
		if pubErr != nil {
			return
		}
		data, err := events.Encode(e)
		if err != nil {
			pubErr = err
			return
		}
		subject, err := e.Subject()
		if err != nil {
			pubErr = err
			return
		}
		totalBytes += int64(len(data))
		// A loaded machine (or -race) acks slowly: wait for room in the
		// async window instead of failing after the default 200 ms.
		_, pubErr = js.PublishMsgAsync(&nats.Msg{Subject: journal.AppendSubject(subject), Data: data,
			Header: nats.Header{jetstream.MsgIDHeader: []string{e.DedupID()}}}, jetstream.WithStallWait(time.Minute))
	})
	if pubErr != nil {
		b.Fatal(pubErr)
	}
	select {
	case <-js.PublishAsyncComplete():
	case <-time.After(2 * time.Minute):
		b.Fatal("fixture publish did not complete")
	}
	st, err := js.Stream(ctx, journal.StreamName)
	if err != nil {
		b.Fatal(err)
	}
	info, err := st.Info(ctx)
	if err != nil {
		b.Fatal(err)
	}
	if info.State.Msgs != uint64(n) {
		b.Fatalf("fixture stream holds %d messages, want %d", info.State.Msgs, n)
	}
	return totalBytes
}

func benchOpen(b *testing.B, dir string) *journal.Journal {
	b.Helper()
	j, err := journal.Open(context.Background(), journal.Options{Dir: dir})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { j.Close() })
	return j
}

// rawAppender is the baseline: write(2) then fsync(2) on an O_APPEND file.
type rawAppender struct{ f *os.File }

func newRawAppender(b *testing.B, dir string) *rawAppender {
	b.Helper()
	f, err := os.OpenFile(filepath.Join(dir, "raw.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { f.Close() })
	return &rawAppender{f: f}
}

func (r *rawAppender) append(b *testing.B, data []byte) {
	if _, err := r.f.Write(data); err != nil {
		b.Fatal(err)
	}
	if err := r.f.Sync(); err != nil { // fsync(2), as the file store's SyncAlways does
		b.Fatal(err)
	}
}

// BenchmarkAppendSynced: one writer, one durable (fsynced) append per op.
func BenchmarkAppendSynced(b *testing.B) {
	dir := b.TempDir()
	j := benchOpen(b, filepath.Join(dir, "journal"))
	msgs := benchMessages(b, b.N)
	ctx := context.Background()
	b.SetBytes(int64(len(msgs[0].Data)))
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if _, err := j.Append(ctx, msgs[i]); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "events/s")
}

// BenchmarkRawWriteFsync is the baseline for BenchmarkAppendSynced: the
// same bytes, written and fsynced to an append-only file in the same kind
// of temp dir.
func BenchmarkRawWriteFsync(b *testing.B) {
	dir := b.TempDir()
	raw := newRawAppender(b, dir)
	data := benchMessages(b, 1)[0].Data
	b.SetBytes(int64(len(data)))
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		raw.append(b, data)
	}
	b.StopTimer()
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "events/s")
}

// BenchmarkAppendVsRawFsync interleaves one journal append and one raw
// write+fsync of the same bytes per op, in the same temp dir, so both see
// the same disk at the same moment, and reports ratio = append ÷ raw.
// Target: ratio ≤ 1.5.
func BenchmarkAppendVsRawFsync(b *testing.B) {
	dir := b.TempDir()
	j := benchOpen(b, filepath.Join(dir, "journal"))
	raw := newRawAppender(b, dir)
	msgs := benchMessages(b, b.N)
	ctx := context.Background()
	var appendDur, rawDur time.Duration
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		t0 := time.Now()
		if _, err := j.Append(ctx, msgs[i]); err != nil {
			b.Fatal(err)
		}
		t1 := time.Now()
		raw.append(b, msgs[i].Data)
		t2 := time.Now()
		appendDur += t1.Sub(t0)
		rawDur += t2.Sub(t1)
	}
	b.StopTimer()
	b.ReportMetric(float64(appendDur.Nanoseconds())/float64(b.N), "append-ns/op")
	b.ReportMetric(float64(rawDur.Nanoseconds())/float64(b.N), "raw-ns/op")
	b.ReportMetric(float64(appendDur)/float64(rawDur), "ratio")
}

// BenchmarkAppendConcurrent: g goroutines share b.N appends. It also times
// a short run of raw write+fsync in the same dir afterwards and reports
// x-raw-fsync = events/s ÷ raw fsyncs/s (above 1 means the store batches
// fsyncs across writers; 1 or below means one fsync per event).
func BenchmarkAppendConcurrent(b *testing.B) {
	for _, g := range []int{1, 8, 32} {
		b.Run(fmt.Sprintf("g=%d", g), func(b *testing.B) {
			dir := b.TempDir()
			j := benchOpen(b, filepath.Join(dir, "journal"))
			msgs := benchMessages(b, b.N)
			ctx := context.Background()
			var next atomic.Int64
			var wg sync.WaitGroup
			errs := make(chan error, g)
			b.ResetTimer()
			for w := 0; w < g; w++ {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for {
						i := int(next.Add(1)) - 1
						if i >= len(msgs) {
							return
						}
						if _, err := j.Append(ctx, msgs[i]); err != nil {
							errs <- err
							return
						}
					}
				}()
			}
			wg.Wait()
			b.StopTimer()
			close(errs)
			for err := range errs {
				b.Fatal(err)
			}
			rate := float64(b.N) / b.Elapsed().Seconds()

			raw := newRawAppender(b, dir)
			const rawN = 300
			t0 := time.Now()
			for i := 0; i < rawN; i++ {
				raw.append(b, msgs[0].Data)
			}
			rawRate := rawN / time.Since(t0).Seconds()
			b.ReportMetric(rate, "events/s")
			b.ReportMetric(rawRate, "raw-fsync/s")
			b.ReportMetric(rate/rawRate, "x-raw-fsync")
		})
	}
}

const replayEvents = 100_000

// BenchmarkReplay100k reads a 100,000-event journal end to end.
//
//	raw:    journal.Read, counting bytes only (the consumer floor)
//	decode: events.Decode of the same 100,000 payloads from memory (no journal)
//	fold:   journal.Read + events.Decode + projections.NewSandboxes().Apply
//	ratio:  raw then fold each op; ratio = fold events/s ÷ raw events/s (target ≥ 0.8)
func BenchmarkReplay100k(b *testing.B) {
	dir := filepath.Join(b.TempDir(), "journal")
	start := time.Now()
	total := benchBuildJournal(b, dir, replayEvents)
	b.Logf("fixture: %d events, %d payload bytes, built in %v", replayEvents, total, time.Since(start).Round(time.Millisecond))
	j := benchOpen(b, dir)
	ctx := context.Background()

	readRaw := func(b *testing.B) {
		var n, size int64
		if err := j.Read(ctx, 1, journal.Subjects, func(r journal.Record) error {
			n++
			size += int64(len(r.Data))
			return nil
		}); err != nil {
			b.Fatal(err)
		}
		if n != replayEvents || size != total {
			b.Fatalf("raw read %d events, %d bytes; want %d, %d", n, size, replayEvents, total)
		}
	}
	readFold := func(b *testing.B) *projections.Sandboxes {
		o := projections.NewSandboxes()
		if err := j.Read(ctx, 1, journal.Subjects, func(r journal.Record) error {
			e, err := events.Decode(r.Data)
			if err != nil {
				return err
			}
			o.Apply(r.Seq, e)
			return nil
		}); err != nil {
			b.Fatal(err)
		}
		if o.Seq() != replayEvents {
			b.Fatalf("folded up to %d, want %d", o.Seq(), replayEvents)
		}
		return o
	}
	perEvent := func(b *testing.B, d time.Duration) {
		b.ReportMetric(float64(replayEvents)*float64(b.N)/d.Seconds(), "events/s")
	}

	b.Run("raw", func(b *testing.B) {
		b.SetBytes(total)
		for i := 0; i < b.N; i++ {
			readRaw(b)
		}
		perEvent(b, b.Elapsed())
	})
	b.Run("decode", func(b *testing.B) {
		var payloads [][]byte
		if err := j.Read(ctx, 1, journal.Subjects, func(r journal.Record) error {
			payloads = append(payloads, append([]byte(nil), r.Data...))
			return nil
		}); err != nil {
			b.Fatal(err)
		}
		b.SetBytes(total)
		b.ResetTimer()
		for i := 0; i < b.N; i++ {
			for _, p := range payloads {
				if _, err := events.Decode(p); err != nil {
					b.Fatal(err)
				}
			}
		}
		perEvent(b, b.Elapsed())
	})
	b.Run("fold", func(b *testing.B) {
		b.SetBytes(total)
		var owned int
		for i := 0; i < b.N; i++ {
			owned = readFold(b).Len()
		}
		perEvent(b, b.Elapsed())
		b.ReportMetric(float64(owned), "owned-paths")
	})
	b.Run("ratio", func(b *testing.B) {
		var rawDur, foldDur time.Duration
		for i := 0; i < b.N; i++ {
			t0 := time.Now()
			readRaw(b)
			t1 := time.Now()
			readFold(b)
			foldDur += time.Since(t1)
			rawDur += t1.Sub(t0)
		}
		n := float64(replayEvents) * float64(b.N)
		b.ReportMetric(n/rawDur.Seconds(), "raw-events/s")
		b.ReportMetric(n/foldDur.Seconds(), "fold-events/s")
		b.ReportMetric(float64(rawDur)/float64(foldDur), "ratio")
	})
}

// BenchmarkVerify1M is `nexus replay verify` over 1,000,000 events: a
// journal.Read feeding replay.Verifier (decode, continuity, id uniqueness,
// saga closure) against journal.Read alone counting bytes, paired in each
// op. ratio = verify events/s ÷ raw events/s (target ≥ 0.7). Run with
// -benchtime 1x: one op reads the million events twice.
func BenchmarkVerify1M(b *testing.B) {
	const n = 1_000_000
	dir := filepath.Join(b.TempDir(), "journal")
	start := time.Now()
	total := benchBuildJournal(b, dir, n)
	b.Logf("fixture: %d events, %d payload bytes, built in %v", n, total, time.Since(start).Round(time.Second))
	j := benchOpen(b, dir)
	ctx := context.Background()
	var rawDur, verifyDur time.Duration
	for i := 0; i < b.N; i++ {
		t0 := time.Now()
		var size int64
		if err := j.Read(ctx, 1, journal.Subjects, func(r journal.Record) error {
			size += int64(len(r.Data))
			return nil
		}); err != nil {
			b.Fatal(err)
		}
		rawDur += time.Since(t0)
		if size != total {
			b.Fatalf("raw read %d bytes, want %d", size, total)
		}

		t0 = time.Now()
		add, finish := replay.NewVerifier().Concurrent()
		if err := j.Read(ctx, 1, journal.Subjects, func(r journal.Record) error {
			add(replay.Record{Seq: r.Seq, MsgID: r.MsgID, Data: r.Data})
			return nil
		}); err != nil {
			b.Fatal(err)
		}
		rep := finish()
		verifyDur += time.Since(t0)
		if !rep.OK() || rep.Events != n {
			b.Fatalf("verify of the fixture: %d events, ok=%v", rep.Events, rep.OK())
		}
	}
	b.ReportMetric(float64(n)*float64(b.N)/rawDur.Seconds(), "raw-events/s")
	b.ReportMetric(float64(n)*float64(b.N)/verifyDur.Seconds(), "verify-events/s")
	b.ReportMetric(rawDur.Seconds()/verifyDur.Seconds(), "ratio")
}
