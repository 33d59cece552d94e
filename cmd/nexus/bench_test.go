package main

// Lifecycle benchmarks of the real binary with the process driver, each
// against a baseline measured in the same run (docs/benchmarks-lifecycle.md):
//
//	BenchmarkCreateVsCpSparse   nexus create of a 1 GiB image (200 MiB allocated) ÷ cp --sparse=always (+ fsync)
//	BenchmarkLifecycle100       p50/p99 of create-to-running and of rm over 100 sandboxes; journal events per create
//	BenchmarkFork16VsCreates    fork --count 16 ÷ 16 sequential creates, time and allocated bytes

import (
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nexus-sandbox/nexus/projections"
)

const mib = 1 << 20

// benchImage1G writes a 1 GiB sparse image with 200 MiB of random data in
// 1 MiB chunks at scattered, deterministic offsets, and fsyncs it.
func benchImage1G(b *testing.B) string {
	b.Helper()
	return benchImage1GIn(b, b.TempDir())
}

// benchImage1GIn is benchImage1G written into dir.
func benchImage1GIn(b *testing.B, dir string) string {
	b.Helper()
	path := filepath.Join(dir, "base.raw")
	f, err := os.Create(path)
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	rng := rand.New(rand.NewPCG(7, 7))
	buf := make([]byte, mib)
	for _, slot := range rng.Perm(1024)[:200] {
		for i := range buf {
			buf[i] = byte(rng.Uint32())
		}
		if _, err := f.WriteAt(buf, int64(slot)*mib); err != nil {
			b.Fatal(err)
		}
	}
	if err := f.Truncate(1024 * mib); err != nil {
		b.Fatal(err)
	}
	if err := f.Sync(); err != nil {
		b.Fatal(err)
	}
	return path
}

func allocated(b *testing.B, path string) int64 {
	b.Helper()
	var st syscall.Stat_t
	if err := syscall.Stat(path, &st); err != nil {
		b.Fatal(err)
	}
	return st.Blocks * 512
}

// allocatedUnder sums st_blocks*512 over the regular files below dir whose
// names contain one of ids.
func allocatedUnder(b *testing.B, dir string, ids []string) int64 {
	b.Helper()
	var total int64
	filepath.Walk(dir, func(p string, fi os.FileInfo, err error) error {
		if err != nil || !fi.Mode().IsRegular() {
			return nil
		}
		for _, id := range ids {
			if strings.Contains(p, id) {
				total += fi.Sys().(*syscall.Stat_t).Blocks * 512
				return nil
			}
		}
		return nil
	})
	return total
}

func median(ds []time.Duration) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[len(s)/2]
}

// percentile is the nearest-rank percentile p (0 < p ≤ 100) of ds.
func percentile(ds []time.Duration, p float64) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	rank := int(float64(len(s))*p/100+0.999999) - 1
	return s[max(0, min(rank, len(s)-1))]
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

func rmAll(b *testing.B, root string) {
	b.Helper()
	for _, sb := range sandboxes(b, root) {
		mustOK(b, proc(b, root, "rm", "-f", "--with-snapshots", sb.ID), "rm")
	}
}

// BenchmarkCreateVsCpSparse times a whole `nexus create` (preflight,
// intents, the OS disk copy, a workspace mkfs, the supervisor with its CA,
// the VMM, every event fsynced) against `cp --sparse=always` of the same
// image alone. cp is charged one fsync of its output, as create's copy is
// durable before it returns; ratio-vs-cp-nosync is reported too. Medians,
// order alternating, as in host/disk's BenchmarkCloneVsCpSparse.
func BenchmarkCreateVsCpSparse(b *testing.B) {
	image := benchImage1G(b)
	root := shortRoot(b)
	copyRoot(b, root) // the OS disk copy is what is compared with cp
	startDaemon(b, root)
	cpDir := b.TempDir()
	var createT, cpT, cpNoSyncT []time.Duration
	var createAlloc, cpAlloc int64
	timeCreate := func() {
		t0 := time.Now()
		sb := createJSON(b, root, "--image", image)
		createT = append(createT, time.Since(t0))
		createAlloc = allocated(b, filepath.Join(root, "disks", sb.ID+".raw"))
		mustOK(b, proc(b, root, "rm", "-f", "--with-snapshots", sb.ID), "rm")
	}
	timeCp := func() {
		dst := filepath.Join(cpDir, "copy.raw")
		t0 := time.Now()
		if out, err := exec.Command("cp", "--sparse=always", image, dst).CombinedOutput(); err != nil {
			b.Fatalf("cp: %v %s", err, out)
		}
		noSync := time.Since(t0)
		f, err := os.Open(dst)
		if err != nil {
			b.Fatal(err)
		}
		if err := f.Sync(); err != nil {
			b.Fatal(err)
		}
		f.Close()
		cpT = append(cpT, time.Since(t0))
		cpNoSyncT = append(cpNoSyncT, noSync)
		cpAlloc = allocated(b, dst)
		os.Remove(dst)
	}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if i%2 == 0 {
			timeCreate()
			timeCp()
		} else {
			timeCp()
			timeCreate()
		}
	}
	b.StopTimer()
	b.ReportMetric(float64(median(createT))/float64(median(cpT)), "ratio")
	b.ReportMetric(float64(median(createT))/float64(median(cpNoSyncT)), "ratio-vs-cp-nosync")
	b.ReportMetric(ms(median(createT)), "create-ms")
	b.ReportMetric(ms(median(cpT)), "cp-fsync-ms")
	b.ReportMetric(float64(createAlloc), "create-alloc-B")
	b.ReportMetric(float64(cpAlloc), "cp-alloc-B")
	if createAlloc > cpAlloc {
		b.Errorf("create allocated %d bytes for the OS disk, cp --sparse=always %d", createAlloc, cpAlloc)
	}
}

// BenchmarkLifecycle100 creates 100 sandboxes one after another, each
// timed from the command's start until it prints a running sandbox, then
// removes them one by one. Run it with -benchtime 1x: one op is 100
// sandboxes. "local" opens the journal in every command; "daemon" goes
// through nexus daemon.
func BenchmarkLifecycle100(b *testing.B) {
	for _, mode := range []string{"local", "daemon"} {
		b.Run(mode, func(b *testing.B) {
			image := makeImage(b)
			for i := 0; i < b.N; i++ {
				root := shortRoot(b)
				if mode == "daemon" {
					startDaemon(b, root)
				}
				var createT, rmT []time.Duration
				var ids []string
				before := countEvents(b, root)
				for range 100 {
					t0 := time.Now()
					sb := createJSON(b, root, "--image", image)
					createT = append(createT, time.Since(t0))
					if sb.State != projections.StateRunning {
						b.Fatalf("created sandbox is %s", sb.State)
					}
					ids = append(ids, sb.ID)
				}
				perCreate := float64(countEvents(b, root)-before) / 100
				for _, id := range ids {
					t0 := time.Now()
					mustOK(b, proc(b, root, "rm", "-f", "--with-snapshots", id), "rm")
					rmT = append(rmT, time.Since(t0))
				}
				b.ReportMetric(ms(percentile(createT, 50)), "create-p50-ms")
				b.ReportMetric(ms(percentile(createT, 99)), "create-p99-ms")
				b.ReportMetric(ms(percentile(rmT, 50)), "rm-p50-ms")
				b.ReportMetric(ms(percentile(rmT, 99)), "rm-p99-ms")
				b.ReportMetric(perCreate, "events/create")
			}
		})
	}
}

func countEvents(b *testing.B, root string) int {
	b.Helper()
	return strings.Count(mustOK(b, nexus(b, root, "events", "--all", "-q"), "events").stdout, "\n")
}

// BenchmarkFork16VsCreates compares one `fork --count 16` of a running
// sandbox with 16 sequential creates from the parent's image: wall time
// and the allocated bytes of what each made.
func BenchmarkFork16VsCreates(b *testing.B) {
	image := benchImage1G(b)
	for i := 0; i < b.N; i++ {
		root := shortRoot(b)
		startDaemon(b, root)
		parent := createJSON(b, root, "--image", image)

		t0 := time.Now()
		out := mustOK(b, proc(b, root, "fork", parent.ID, "--count", "16", "--json"), "fork").stdout
		forkT := time.Since(t0)
		var children []string
		for _, sb := range sandboxes(b, root) {
			if sb.ID != parent.ID {
				children = append(children, sb.ID)
			}
		}
		if len(children) != 16 || strings.Count(out, `"id"`) != 16 {
			b.Fatalf("fork made %d children", len(children))
		}
		forkAlloc := allocatedUnder(b, filepath.Join(root, "disks"), children)
		rmAll(b, root)

		t0 = time.Now()
		var created []string
		for range 16 {
			created = append(created, createJSON(b, root, "--image", image).ID)
		}
		createT := time.Since(t0)
		createAlloc := allocatedUnder(b, filepath.Join(root, "disks"), created)
		rmAll(b, root)

		b.ReportMetric(forkT.Seconds(), "fork16-s")
		b.ReportMetric(createT.Seconds(), "create16-s")
		b.ReportMetric(float64(forkT)/float64(createT), "time-ratio")
		b.ReportMetric(float64(forkAlloc), "fork16-alloc-B")
		b.ReportMetric(float64(createAlloc), "create16-alloc-B")
	}
}
