package store_test

// BenchmarkStartup100k measures store.Open on a state root whose journal holds
// 100,000 events, with and without a valid projections snapshot, against
// journal.Open alone (the floor every start pays) measured in the same run.
// See docs/benchmarks.md.

import (
	"context"
	"fmt"
	"math/rand"
	"os"
	"path/filepath"
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
	"github.com/nexus-sandbox/nexus/store"
)

const (
	startupEvents = 100_000
	startupTail   = 1_000 // events after the older snapshot (below node's 10,000 snapshot threshold)
)

var benchT0 = time.Date(2026, 12, 3, 9, 0, 0, 0, time.UTC)

// benchHistory calls fn for events [from, to) of a deterministic lifecycle
// mix over many sandboxes: each materialises its OS and workspace disks
// (disk.materialised), is created owning both (sandbox.created, schema 2),
// and every other sandbox is later removed (sandbox.removed).
func benchHistory(from, to int, fn func(events.Event)) {
	entropy := ulid.Monotonic(rand.New(rand.NewSource(2)), 0)
	i := 0
	emit := func(sb string, p events.Payload) bool {
		if i >= to {
			return false
		}
		at := benchT0.Add(time.Duration(i) * time.Millisecond)
		e := events.New(ulid.MustNew(ulid.Timestamp(at), entropy), at, sb, p)
		if i >= from {
			fn(e)
		}
		i++
		return true
	}
	for k := 0; i < to; k++ {
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

// benchAppendJournal appends events [from, to) of benchHistory to the
// journal at dir. Appending through journal.Append would cost one fsync per
// event (SyncAlways), over a minute for 100,000, so the fixture is written by
// a plain embedded server without SyncAlways onto the stream journal.Open
// created: the same records on disk (subjects, Nats-Msg-Id headers,
// payloads), without the per-message fsync while building.
func benchAppendJournal(b testing.TB, dir string, from, to int) {
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
	benchHistory(from, to, func(e events.Event) {
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
	if info.State.LastSeq != uint64(to) {
		b.Fatalf("fixture stream ends at %d, want %d", info.State.LastSeq, to)
	}
}

// copyDir replaces dst with a copy of the flat directory src.
func copyDir(b *testing.B, src, dst string) {
	b.Helper()
	if err := os.RemoveAll(dst); err != nil {
		b.Fatal(err)
	}
	if src == "" {
		return
	}
	if err := os.MkdirAll(dst, 0o700); err != nil {
		b.Fatal(err)
	}
	ents, err := os.ReadDir(src)
	if err != nil {
		b.Fatal(err)
	}
	for _, e := range ents {
		data, err := os.ReadFile(filepath.Join(src, e.Name()))
		if err != nil {
			b.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dst, e.Name()), data, 0o600); err != nil {
			b.Fatal(err)
		}
	}
}

type startupFixture struct {
	root     string
	snapTip  string // projections/ snapshotted at the last event
	snapTail string // projections/ snapshotted startupTail events before the end
	wantLive int
}

func buildStartupFixture(b *testing.B) *startupFixture {
	b.Helper()
	base := b.TempDir()
	f := &startupFixture{
		root:     filepath.Join(base, "root"),
		snapTip:  filepath.Join(base, "snap-tip"),
		snapTail: filepath.Join(base, "snap-tail"),
	}
	if err := os.Mkdir(f.root, 0o700); err != nil {
		b.Fatal(err)
	}
	jdir := filepath.Join(f.root, "journal")
	proj := filepath.Join(f.root, "projections")
	start := time.Now()
	benchAppendJournal(b, jdir, 0, startupEvents-startupTail)
	// A cold open folds ≥10,000 events, so it writes snapshots at the tip.
	n := openNode(b, f.root)
	closeNode(b, n)
	copyDir(b, proj, f.snapTail)
	benchAppendJournal(b, jdir, startupEvents-startupTail, startupEvents)
	copyDir(b, "", proj)
	n = openNode(b, f.root)
	live, err := n.SandboxCount(context.Background())
	if err != nil {
		b.Fatal(err)
	}
	f.wantLive = live
	closeNode(b, n)
	copyDir(b, proj, f.snapTip)
	b.Logf("fixture: %d events, %d live sandboxes, built in %v",
		startupEvents, f.wantLive, time.Since(start).Round(time.Millisecond))
	return f
}

func openNode(b *testing.B, root string) *store.Store {
	b.Helper()
	n, err := store.Open(context.Background(), root, store.Options{})
	if err != nil {
		b.Fatal(err)
	}
	return n
}

func closeNode(b *testing.B, n *store.Store) {
	b.Helper()
	if err := n.Close(); err != nil {
		b.Fatal(err)
	}
}

func (f *startupFixture) check(b *testing.B, n *store.Store) {
	b.Helper()
	live, err := n.SandboxCount(context.Background())
	if err != nil {
		b.Fatal(err)
	}
	var seq uint64
	n.View(func(v store.Views) { seq = v.Seq() })
	if live != f.wantLive || seq != startupEvents {
		b.Fatalf("opened node: %d live at seq %d; want %d at %d", live, seq, f.wantLive, startupEvents)
	}
}

// timedOpen restores projections/ from snap ("" = none), then times one
// store.Open; the restore, the check and Close are outside the benchmark timer.
func (f *startupFixture) timedOpen(b *testing.B, snap string) time.Duration {
	b.Helper()
	b.StopTimer()
	copyDir(b, snap, filepath.Join(f.root, "projections"))
	b.StartTimer()
	t0 := time.Now()
	n := openNode(b, f.root)
	d := time.Since(t0)
	b.StopTimer()
	f.check(b, n)
	closeNode(b, n)
	b.StartTimer()
	return d
}

func (f *startupFixture) timedJournalOpen(b *testing.B) time.Duration {
	b.Helper()
	t0 := time.Now()
	j, err := journal.Open(context.Background(), journal.Options{Dir: filepath.Join(f.root, "journal")})
	if err != nil {
		b.Fatal(err)
	}
	d := time.Since(t0)
	b.StopTimer()
	j.Close()
	b.StartTimer()
	return d
}

// snapshotViews are fresh projections for every snapshot the store writes.
func snapshotViews() []projections.Projection {
	return []projections.Projection{projections.NewSandboxes(),
		projections.NewSagas(), projections.NewVolumes()}
}

// timedSnapshotDecode decodes the tip snapshots into fresh projections:
// the part of a warm start that is not the journal.
func (f *startupFixture) timedSnapshotDecode(b *testing.B) time.Duration {
	b.Helper()
	var d time.Duration
	for _, p := range snapshotViews() {
		b.StopTimer()
		data, err := os.ReadFile(filepath.Join(f.snapTip, p.Name()+".snap"))
		if os.IsNotExist(err) {
			b.StartTimer()
			continue // a projection this node version does not snapshot
		}
		if err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
		t0 := time.Now()
		snap, err := projections.DecodeSnapshot(data, p)
		d += time.Since(t0)
		if err != nil || snap.Seq != startupEvents {
			b.Fatalf("decode %s snapshot: seq %d, %v", p.Name(), snap.Seq, err)
		}
	}
	return d
}

// BenchmarkStartup100k:
//
//	journal-only:          journal.Open alone (block verification + server start): the floor
//	snapshot-decode-only:  projections.DecodeSnapshot of the three tip snapshots, no journal
//	without-snapshot:      store.Open with no projections/ (replays all 100,000 and writes snapshots)
//	with-snapshot:         store.Open with a snapshot at the last event (replays nothing)
//	with-snapshot+1k-tail: store.Open with a snapshot 1,000 events back (replays the 1,000)
//	ratio:                 without and with snapshot alternately each op;
//	                       ratio = with ÷ without (lower is better), and
//	                       over-floor = with-snapshot ÷ journal-only
func BenchmarkStartup100k(b *testing.B) {
	f := buildStartupFixture(b)
	ms := func(d time.Duration, n int) float64 { return float64(d.Microseconds()) / 1000 / float64(n) }
	run := func(name string, open func(b *testing.B) time.Duration) {
		b.Run(name, func(b *testing.B) {
			var total time.Duration
			for i := 0; i < b.N; i++ {
				total += open(b)
			}
			b.ReportMetric(ms(total, b.N), "ms/open")
		})
	}
	run("journal-only", f.timedJournalOpen)
	run("snapshot-decode-only", f.timedSnapshotDecode)
	run("without-snapshot", func(b *testing.B) time.Duration { return f.timedOpen(b, "") })
	run("with-snapshot", func(b *testing.B) time.Duration { return f.timedOpen(b, f.snapTip) })
	run("with-snapshot+1k-tail", func(b *testing.B) time.Duration { return f.timedOpen(b, f.snapTail) })
	b.Run("ratio", func(b *testing.B) {
		var floor, cold, warm, tail time.Duration
		for i := 0; i < b.N; i++ {
			floor += f.timedJournalOpen(b)
			cold += f.timedOpen(b, "")
			warm += f.timedOpen(b, f.snapTip)
			tail += f.timedOpen(b, f.snapTail)
		}
		b.ReportMetric(0, "ns/op") // the sum of four opens means nothing
		b.ReportMetric(ms(floor, b.N), "journal-ms")
		b.ReportMetric(ms(cold, b.N), "without-ms")
		b.ReportMetric(ms(warm, b.N), "with-ms")
		b.ReportMetric(ms(tail, b.N), "with+1k-ms")
		b.ReportMetric(float64(warm)/float64(cold), "ratio")
		b.ReportMetric(float64(warm)/float64(floor), "over-floor")
	})
}
