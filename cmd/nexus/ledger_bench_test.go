package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/oklog/ulid/v2"

	"github.com/nexus-sandbox/nexus/client"
	"github.com/nexus-sandbox/nexus/control/local"
	"github.com/nexus-sandbox/nexus/events"
	"github.com/nexus-sandbox/nexus/host/driver"
	"github.com/nexus-sandbox/nexus/host/durable"
	hostledger "github.com/nexus-sandbox/nexus/host/ledger"
	"github.com/nexus-sandbox/nexus/layout"
	"github.com/nexus-sandbox/nexus/ledger"
	"github.com/nexus-sandbox/nexus/lifecycle"
	"github.com/nexus-sandbox/nexus/session"
	"github.com/nexus-sandbox/nexus/store"
)

const benchRuns, benchNames = 1000, 10

// runsHeld keeps the benchmark's own runs (and their liveness locks) open.
var runsHeld []*hostledger.Run

// writeRuns lays out n runs of benchNames sandboxes each, owned by pid and
// start (live or dead as the caller chooses), through the real writer.
func writeRuns(b *testing.B, dir string, n, pid int, startMs int64) {
	b.Helper()
	for i := range n {
		run := fmt.Sprintf("run-%05d", i)
		r, err := hostledger.Open(dir, ledger.Record{Schema: 1, Run: run, Pid: pid, StartTimeMs: startMs, Driver: "process"})
		if err != nil {
			b.Fatal(err)
		}
		var names []byte
		for j := range benchNames {
			names = fmt.Appendf(names, "%s-sb-%02d\n", run, j)
		}
		// One write instead of ten fsynced appends: the layout is the same.
		if err := os.WriteFile(filepath.Join(dir, run+".sandboxes"), names, 0o600); err != nil {
			b.Fatal(err)
		}
		runsHeld = append(runsHeld, r) // our own runs keep their locks
	}
}

// readRecords is the baseline: the irreducible I/O of the rule, done the
// plainest way: list the directory, read every record, read the owner's
// /proc/<pid>/stat once per record.
func readRecords(b *testing.B, dir string, pid int) {
	des, err := os.ReadDir(dir)
	if err != nil {
		b.Fatal(err)
	}
	stat := fmt.Sprintf("/proc/%d/stat", pid)
	for _, de := range des {
		if filepath.Ext(de.Name()) != ".json" {
			continue
		}
		if _, err := os.ReadFile(filepath.Join(dir, de.Name())); err != nil {
			b.Fatal(err)
		}
		if _, err := os.ReadFile(stat); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkSweepHappyPath1000Live: the init-time sweep a client runs before
// its first create, on a root with 1,000 live runs of 10 sandboxes each.
// Nothing is swept, so no journal is opened and no process spawned.
//   - locked: runs written by nexus's own writer in this (live) process,
//     each holding its record's liveness lock, as every nexus client does;
//   - unlocked: the same runs as a client in another language may leave
//     them, without the lock, judged by pid and start time.
//
// Baseline: ReadDir, then ReadFile of each record and of its owner's
// /proc/<pid>/stat: the rule's I/O done the plainest way.
func BenchmarkSweepHappyPath1000Live(b *testing.B) {
	for _, locked := range []bool{true, false} {
		name := map[bool]string{true: "locked", false: "unlocked"}[locked]
		b.Run(name, func(b *testing.B) {
			root := b.TempDir()
			dir := hostledger.Dir(root)
			me, err := hostledger.SelfRecord("x", "process", "")
			if err != nil {
				b.Fatal(err)
			}
			start := me.StartTimeMs
			if !locked {
				start++ // not this process's exact record: Open takes no lock
			}
			writeRuns(b, dir, benchRuns, me.Pid, start)
			want := map[bool]string{true: ledger.ReasonOwnerLocked, false: ledger.ReasonOwnerAlive}[locked]
			ctx := context.Background()
			var sweep, base time.Duration
			b.ResetTimer()
			for range b.N {
				t0 := time.Now()
				out, err := client.Sweep(ctx, nexusBin, root, "process", "self-run")
				sweep += time.Since(t0)
				if err != nil || len(out) != benchRuns || out[0].Reason != want {
					b.Fatalf("sweep: %v %d %+v", err, len(out), out[:1])
				}
				t0 = time.Now()
				readRecords(b, dir, me.Pid)
				base += time.Since(t0)
			}
			b.ReportMetric(float64(sweep.Microseconds())/float64(b.N)/1000, "ms/sweep")
			b.ReportMetric(float64(base.Microseconds())/float64(b.N)/1000, "ms/baseline")
			b.ReportMetric(float64(sweep)/float64(base), "ratio")
		})
	}
}

// BenchmarkSweepDead1000x10: 1,000 dead runs of 10 listed sandboxes each,
// swept by nexus's own sweep code (lifecycle lookups, one run.swept event
// fsynced into the journal per run, the files deleted and the directory
// fsynced). The names exist in no journal, so this is the ledger's own cost
// per run; tearing a real sandbox down is lifecycle rm's cost on top.
// Baseline per run: what any durable sweeper must do at least: read the
// three files, one fsync of a 200-byte append, unlink the three files,
// fsync the directory.
func BenchmarkSweepDead1000x10(b *testing.B) {
	ctx := context.Background()
	var sweep, base time.Duration
	for range b.N {
		b.StopTimer()
		root := shortBenchRoot(b)
		n, err := store.Open(ctx, root, store.Options{})
		if err != nil {
			b.Fatal(err)
		}
		m := &lifecycle.Manager{Root: layout.Root(root), B: local.Backend{Store: n}, Driver: driver.Driver{Name: driver.Process}}
		dir := hostledger.Dir(root)
		writeRuns(b, dir, benchRuns, 1<<22, 1_700_000_000_000) // pid beyond pid_max: never running
		self := ledger.Self{Run: "bench", Driver: "process"}
		plan, err := hostledger.Plan(dir, self, time.Now())
		if err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
		t0 := time.Now()
		out, err := hostledger.Apply(ctx, dir, plan, self, "init", session.NewSweepActions(m))
		sweep += time.Since(t0)
		b.StopTimer()
		if err != nil || len(out) != benchRuns || len(out[0].NotFound) != benchNames {
			b.Fatalf("apply: %v %+v", err, out[:1])
		}
		n.Close()

		writeRuns(b, dir, benchRuns, 1<<22, 1_700_000_000_000)
		logf, err := os.OpenFile(filepath.Join(root, "baseline.log"), os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600)
		if err != nil {
			b.Fatal(err)
		}
		rec := make([]byte, 200)
		b.StartTimer()
		t0 = time.Now()
		for i := range benchRuns {
			run := filepath.Join(dir, fmt.Sprintf("run-%05d", i))
			for _, suf := range []string{".json", ".sandboxes", ".networks"} {
				os.ReadFile(run + suf)
			}
			logf.Write(rec)
			logf.Sync()
			for _, suf := range []string{".networks", ".sandboxes", ".json"} {
				os.Remove(run + suf)
			}
			durable.SyncDir(dir)
		}
		base += time.Since(t0)
		b.StopTimer()
		logf.Close()
		os.RemoveAll(root)
	}
	b.ReportMetric(float64(sweep.Microseconds())/float64(b.N)/benchRuns/1000, "ms/run")
	b.ReportMetric(float64(base.Microseconds())/float64(b.N)/benchRuns/1000, "ms/run-baseline")
	b.ReportMetric(float64(sweep)/float64(base), "ratio")
}

func shortBenchRoot(b *testing.B) string {
	dir, err := os.MkdirTemp("", "nxb")
	if err != nil {
		b.Fatal(err)
	}
	return dir
}

// BenchmarkJournalKept1000: what journaling the keep decisions of a sweep
// over 1,000 live runs adds to the client's first create: one run.kept
// event naming the 1,000 runs, appended (and fsynced) to a real journal.
// Baseline: appending one small event (a run.swept naming one sandbox) to
// the same journal, the cost of any single journaled step.
func BenchmarkJournalKept1000(b *testing.B) {
	ctx := context.Background()
	root := shortBenchRoot(b)
	defer os.RemoveAll(root)
	n, err := store.Open(ctx, root, store.Options{})
	if err != nil {
		b.Fatal(err)
	}
	defer n.Close()
	out := make([]ledger.Outcome, benchRuns)
	for i := range out {
		out[i] = ledger.Outcome{Run: ulid.Make().String(), Verdict: "keep", Reason: ledger.ReasonOwnerLocked}
	}
	kept := hostledger.KeptEvents("init", ledger.Self{Run: ulid.Make().String(), Driver: "process"}, time.Now(), out)
	if len(kept) != 1 {
		b.Fatalf("%d events", len(kept))
	}
	small := events.RunSweptEvent{RunID: "r", Verdict: "sweep", Reason: ledger.ReasonOwnerGone, By: "init", NotFound: []string{ulid.Make().String()}}
	var keptT, base time.Duration
	for range b.N {
		t0 := time.Now()
		if _, err := n.Append(ctx, events.New(ulid.Make(), time.Now(), "", kept[0])); err != nil {
			b.Fatal(err)
		}
		keptT += time.Since(t0)
		t0 = time.Now()
		if _, err := n.Append(ctx, events.New(ulid.Make(), time.Now(), "", small)); err != nil {
			b.Fatal(err)
		}
		base += time.Since(t0)
	}
	b.ReportMetric(float64(keptT.Microseconds())/float64(b.N)/1000, "ms/kept-event")
	b.ReportMetric(float64(base.Microseconds())/float64(b.N)/1000, "ms/small-event")
	b.ReportMetric(float64(keptT)/float64(base), "ratio")
}
