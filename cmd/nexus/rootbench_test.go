package main

import (
	"crypto/rand"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nexus-sandbox/nexus/host/smallfs"
	"github.com/nexus-sandbox/nexus/internal/testutil"
)

// overlayFilesystems are the filesystems the overlay root's create is
// measured and checked on, each loop-mounted fresh: ext4 (no reflink) and
// XFS made with reflink=1.
var overlayFilesystems = []struct {
	name  string
	mount func(testing.TB, int64) string
}{{"ext4", smallfs.Mount}, {"xfs", smallfs.MountXFS}}

// overlayFS mounts fs for a state root and returns the root on it; its
// cleanup stops whatever runs there before the filesystem is unmounted.
func overlayFS(t testing.TB, mount func(testing.TB, int64) string) string {
	t.Helper()
	mnt := mount(t, 4<<30)
	root := filepath.Join(mnt, "nx")
	if err := os.Mkdir(root, 0o700); err != nil {
		t.Fatal(err)
	}
	// Registered after the mount's cleanup, so it runs before the unmount.
	t.Cleanup(func() {
		testutil.StopDaemons(root)
		testutil.KillProcessesUnder(root)
	})
	return root
}

// emptyImage is a sparse image of size bytes holding no data at all.
func emptyImage(t testing.TB, size int64) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "empty.raw")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := f.Truncate(size); err != nil {
		t.Fatal(err)
	}
	return path
}

// sandboxDiskBytes is what the sandbox id's own disks allocate (st_blocks,
// so a reflinked extent counts in full), and the empty overlay's: the
// overlay template every empty workspace is cloned from.
func sandboxDiskBytes(t testing.TB, root, id string) (mine, emptyOverlay int64) {
	t.Helper()
	mine = allocatedIn(t, filepath.Join(root, "disks"), id)
	tmpls, _ := filepath.Glob(filepath.Join(root, "images", "*.template", "disk.raw"))
	if len(tmpls) != 1 {
		t.Fatalf("overlay templates %v, want one", tmpls)
	}
	var st syscall.Stat_t
	if err := syscall.Stat(tmpls[0], &st); err != nil {
		t.Fatal(err)
	}
	return mine, st.Blocks * 512
}

// allocatedIn sums st_blocks*512 of the files in dir whose names begin
// with prefix.
func allocatedIn(t testing.TB, dir, prefix string) int64 {
	t.Helper()
	matches, _ := filepath.Glob(filepath.Join(dir, prefix+"*"))
	var total int64
	for _, p := range matches {
		var st syscall.Stat_t
		if err := syscall.Stat(p, &st); err != nil {
			t.Fatal(err)
		}
		total += st.Blocks * 512
	}
	return total
}

// TestOverlayCreateWritesNoImageBytes: on ext4 and on XFS, a create of a
// 64 MiB image holding 32 MiB of data (more than the empty overlay
// allocates, so a copy of it could not hide below the bound) under the
// overlay root, on a cache miss and on a hit, leaves the sandbox disks
// that allocate no more than the empty overlay: the image's bytes are
// written once, into the cache entry, and never into a sandbox's own
// files.
func TestOverlayCreateWritesNoImageBytes(t *testing.T) {
	testutil.StartsSandboxes(t)
	t.Parallel()
	image := filepath.Join(t.TempDir(), "data.raw")
	data := make([]byte, 32<<20)
	rand.Read(data)
	if err := os.WriteFile(image, data, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(image, 64<<20); err != nil {
		t.Fatal(err)
	}
	for _, fs := range overlayFilesystems {
		t.Run(fs.name, func(t *testing.T) {
			root := overlayFS(t, fs.mount)
			for _, c := range []string{"miss", "hit"} {
				sb := createJSON(t, root, "--image", image)
				if got := inspectJSON(t, root, sb.ID).Root; got != "overlay" {
					t.Fatalf("%s: root %q, want overlay", c, got)
				}
				mine, empty := sandboxDiskBytes(t, root, sb.ID)
				t.Logf("%s on %s: the sandbox's disks allocate %d bytes, the empty overlay %d", c, fs.name, mine, empty)
				if mine > empty {
					t.Errorf("%s on %s: the disks of %s allocate %d bytes, more than the empty overlay's %d", c, fs.name, sb.ID, mine, empty)
				}
			}
			if rows := cacheList(t, root); len(rows) != 1 || len(rows[0].Sandboxes) != 2 {
				t.Fatalf("cache after a miss and a hit: %+v", rows)
			}
		})
	}
}

// BenchmarkOverlayCreate times `nexus create` (process driver, daemon
// running, the real binary) under the overlay root on a loop-mounted ext4
// and XFS (reflink=1) holding the state root, each op timing in turn, in
// a rotating order:
//
//	hit    a create of a 1 GiB image with 200 MiB of data already cached
//	empty  a create of a 1 GiB image with no data, already cached
//	miss   a create of the 1 GiB image after a touch (a new identity: a miss)
//	cp     cp --sparse=always of the image onto the same filesystem + fsync
//
// and reports hit/empty (target ≤ 1.1x) and miss/(cp+hit) (target ≤ 1.1x)
// over the medians. The images live on another filesystem (b.TempDir()),
// so neither nexus nor cp can reflink them: both write the bytes. It also
// fails if a hit's sandbox disks allocate more than the empty overlay.
func BenchmarkOverlayCreate(b *testing.B) {
	for _, fs := range overlayFilesystems {
		b.Run(fs.name, func(b *testing.B) {
			root := overlayFS(b, fs.mount)
			image := benchImage1G(b)
			empty := emptyImage(b, 1<<30)
			startDaemon(b, root)
			var hitT, emptyT, missT, cpT []time.Duration
			create := func(img string, into *[]time.Duration) {
				syscall.Sync() // earlier writeback is nobody's cost
				t0 := time.Now()
				sb := createJSON(b, root, "--image", img)
				*into = append(*into, time.Since(t0))
				if into == &hitT {
					if mine, emptyOverlay := sandboxDiskBytes(b, root, sb.ID); mine > emptyOverlay {
						b.Errorf("a hit's disks allocate %d bytes, the empty overlay %d", mine, emptyOverlay)
					}
				}
				mustOK(b, proc(b, root, "rm", "-f", "--with-snapshots", sb.ID), "rm")
			}
			cp := func() {
				syscall.Sync()
				cpT = append(cpT, timedCopy(b, "--sparse=always", image, filepath.Join(root, "cp.raw")))
			}
			miss := func() {
				now := time.Now()
				os.Chtimes(image, now, now) // a new ctime: a new identity
				create(image, &missT)
			}
			// Both images cached before any timing.
			create(image, new([]time.Duration))
			create(empty, new([]time.Duration))
			steps := []func(){func() { create(image, &hitT) }, func() { create(empty, &emptyT) }, miss, cp}
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				for j := range steps {
					steps[(i+j)%len(steps)]()
				}
				// The entries the misses left behind go, untimed; the
				// image's newest entry is prepared again by the next miss
				// and the hit after it.
				b.StopTimer()
				load, _ := os.ReadFile("/proc/loadavg")
				b.Logf("op %d: hit %.0f ms, empty %.0f ms, miss %.0f ms, cp %.0f ms; load %s", i, ms(hitT[i]), ms(emptyT[i]), ms(missT[i]), ms(cpT[i]), strings.Fields(string(load))[0])
				runQuiet(b, nexusBin, "--state-dir", root, "image-cache", "prune", "--unused")
				create(image, new([]time.Duration))
				create(empty, new([]time.Duration))
				b.StartTimer()
			}
			b.StopTimer()
			hit, emp, mis, c := median(hitT), median(emptyT), median(missT), median(cpT)
			b.ReportMetric(ms(hit), "hit-ms")
			b.ReportMetric(ms(emp), "empty-ms")
			b.ReportMetric(ms(mis), "miss-ms")
			b.ReportMetric(ms(c), "cp-fsync-ms")
			b.ReportMetric(float64(hit)/float64(emp), "hit/empty")
			b.ReportMetric(float64(mis)/float64(c+hit), "miss/(cp+hit)")
		})
	}
}
