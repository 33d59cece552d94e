package store_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/nexus-sandbox/nexus/internal/journalfixture"
	"github.com/nexus-sandbox/nexus/store"
)

// dedupeWindow is the journal stream's Duplicates window: an open reloads
// the message ids stored within it (nats-server's rebuildDedupe).
const dedupeWindow = 2 * time.Minute

// BenchmarkOpenGrowth is "opening a root" at 1k, 10k and 100k
// sandboxes and at 10 sandboxes with 1M events: a lazy store.Open, one
// Sandbox read by ID, Close, two ways interleaved in each op:
//
//	full: journal/VERIFIED removed first, so Open verifies every block
//	      (what every open did before verified.go)
//	incremental: Open as it is, verifying only what changed
//
// Fixtures are built first, then the benchmark waits until the newest
// append is older than the de-duplication window, as on any root not
// written to in the last 2 minutes: inside the window nats-server reloads
// every message id stored in it on open, which is bounded by time, not
// by history (docs/benchmarks.md section 8). Set NEXUS_BENCH_FRESH=1 to
// skip the wait and measure that worst case instead. The last
// sub-benchmark reports the growth factors 1k→100k (and 1k→1M events).
func BenchmarkOpenGrowth(b *testing.B) {
	ctx := context.Background()
	type fixture struct {
		name   string
		root   string
		target string
	}
	var fixtures []fixture
	for _, size := range []int{1_000, 10_000, 100_000} {
		root, ids := fillRoot(b, size)
		fixtures = append(fixtures, fixture{fmt.Sprintf("sandboxes=%d", size), root, ids[size/2]})
	}
	if os.Getenv("NEXUS_BENCH_1M") != "0" {
		t0 := time.Now()
		root := b.TempDir()
		ids := journalfixture.History(b, root, 1_000_000)
		b.Logf("1M-event fixture built in %v", time.Since(t0).Round(time.Second))
		fixtures = append(fixtures, fixture{"sandboxes=10,events=1M", root, ids[len(ids)-1]})
	}
	if os.Getenv("NEXUS_BENCH_FRESH") != "1" {
		b.Logf("waiting %v for the de-duplication window to pass", dedupeWindow)
		time.Sleep(dedupeWindow + 5*time.Second)
	}

	run := func(f fixture, verifyAll bool) (time.Duration, int64) {
		if verifyAll {
			if err := os.Remove(filepath.Join(f.root, "journal", "VERIFIED")); err != nil && !os.IsNotExist(err) {
				b.Fatal(err)
			}
		}
		t0 := time.Now()
		n, err := store.Open(ctx, f.root, store.Options{Lazy: true})
		if err != nil {
			b.Fatal(err)
		}
		if _, found, err := n.Sandbox(ctx, f.target); err != nil || !found {
			b.Fatalf("read %s: %v %v", f.target, found, err)
		}
		checked := n.Journal().BlockCheck().Bytes
		if err := n.Close(); err != nil {
			b.Fatal(err)
		}
		return time.Since(t0), checked
	}
	type result struct{ full, incr float64 }
	results := map[string]result{}
	for _, f := range fixtures {
		// Verify (and record) every block once, outside the timing, so
		// the first incremental op starts from a recorded root.
		run(f, true)
		b.Run(f.name, func(b *testing.B) {
			var full, incr time.Duration
			var fullBytes, incrBytes int64
			for i := 0; i < b.N; i++ {
				d, n := run(f, true)
				full, fullBytes = full+d, fullBytes+n
				d, n = run(f, false)
				incr, incrBytes = incr+d, incrBytes+n
			}
			ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 / float64(b.N) }
			b.ReportMetric(ms(full), "full-ms/op")
			b.ReportMetric(ms(incr), "incr-ms/op")
			b.ReportMetric(float64(fullBytes)/float64(b.N), "full-verified-B/op")
			b.ReportMetric(float64(incrBytes)/float64(b.N), "incr-verified-B/op")
			b.ReportMetric(float64(incr)/float64(full), "incr/full")
			results[f.name] = result{ms(full), ms(incr)}
		})
	}
	b.Run("growth", func(b *testing.B) {
		base, ok := results["sandboxes=1000"]
		if !ok {
			b.Skip("no 1k result")
		}
		if r, ok := results["sandboxes=100000"]; ok {
			b.ReportMetric(r.full/base.full, "full-1k→100k")
			b.ReportMetric(r.incr/base.incr, "incr-1k→100k")
		}
		if r, ok := results["sandboxes=10,events=1M"]; ok {
			b.ReportMetric(r.full/base.full, "full-1k→1M-events")
			b.ReportMetric(r.incr/base.incr, "incr-1k→1M-events")
		}
	})
}
