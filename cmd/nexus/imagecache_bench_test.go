package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/oklog/ulid/v2"

	"github.com/nexus-sandbox/nexus/events"
	"github.com/nexus-sandbox/nexus/host/imagecache"
	"github.com/nexus-sandbox/nexus/host/smallfs"
	"github.com/nexus-sandbox/nexus/internal/testutil"
	"github.com/nexus-sandbox/nexus/layout"
	"github.com/nexus-sandbox/nexus/store"
)

const benchEntries = 10000

// cacheFixture fills root with benchEntries committed entries (a sparse
// 64 MiB disk.raw with one data block, and identity.json), journals each
// as prepared and used, and adds 100 sandboxes referencing the first 100.
func cacheFixture(b *testing.B, root string) {
	b.Helper()
	r := layout.Root(root)
	if err := os.MkdirAll(r.Images(), 0o700); err != nil {
		b.Fatal(err)
	}
	n, err := store.Open(context.Background(), root, store.Options{})
	if err != nil {
		b.Fatal(err)
	}
	defer n.Close()
	now := time.Now()
	evs := make([]events.Event, 0, 2*benchEntries+100)
	for i := 0; i < benchEntries; i++ {
		id := fmt.Sprintf("img-%024x", i)
		if err := os.Mkdir(r.ImageEntry(id), 0o700); err != nil {
			b.Fatal(err)
		}
		f, err := os.Create(r.ImageDisk(id))
		if err != nil {
			b.Fatal(err)
		}
		f.WriteAt([]byte("boot"), 0)
		f.Truncate(64 << 20)
		f.Close()
		ident := imagecache.Identity{CacheID: id, Ref: "/images/base-" + id + ".raw", Identity: "stat-sha256:" + id, Layout: 1, PreparedMs: now.UnixMilli()}
		data, _ := json.Marshal(ident)
		os.WriteFile(r.ImageIdentity(id), data, 0o600)
		evs = append(evs,
			events.New(ulid.Make(), now, "", events.ImageCachePreparedEvent{CacheID: id, Ref: ident.Ref, Identity: ident.Identity, Layout: 1, Path: "images/" + id}),
			events.New(ulid.Make(), now, "", events.ImageCacheUsedEvent{CacheID: id, LastUseMs: now.UnixMilli() + int64(i)}))
	}
	for i := 0; i < 100; i++ {
		id := fmt.Sprintf("img-%024x", i)
		evs = append(evs, events.New(ulid.Make(), now, ulid.Make().String(), events.SandboxCreatedEvent{Image: "/images/base.raw", Driver: "process",
			Bootstrap: events.Bootstrap{CacheID: id, Identity: "stat-sha256:" + id}}))
	}
	if _, err := n.Append(context.Background(), evs...); err != nil {
		b.Fatal(err)
	}
}

func runQuiet(b *testing.B, name string, args ...string) int {
	b.Helper()
	cmd := exec.Command(name, args...)
	cmd.Env = append(os.Environ(), "NEXUS_STATE_DIR=")
	out, err := cmd.Output()
	if err != nil {
		b.Fatalf("%s %s: %v", name, strings.Join(args, " "), err)
	}
	return len(out)
}

// BenchmarkImageCacheList10k times `nexus image-cache list` over 10,000
// entries against `du -s --apparent-size` of the same images/ directory,
// back to back in each op, without and with a daemon serving the root.
func BenchmarkImageCacheList10k(b *testing.B) {
	root, err := os.MkdirTemp("", "nxb")
	if err != nil {
		b.Fatal(err)
	}
	defer os.RemoveAll(root)
	cacheFixture(b, root)
	images := filepath.Join(root, "images")
	list := func() {
		if n := runQuiet(b, nexusBin, "--state-dir", root, "image-cache", "list"); n == 0 {
			b.Fatal("list printed nothing")
		}
	}
	du := func() { runQuiet(b, "du", "-s", "--apparent-size", images) }
	paired := func(b *testing.B) {
		list()
		du() // warm both
		var listNs, duNs int64
		b.ResetTimer()
		for i := 0; i < b.N; i++ {
			t0 := time.Now()
			list()
			t1 := time.Now()
			du()
			t2 := time.Now()
			listNs += t1.Sub(t0).Nanoseconds()
			duNs += t2.Sub(t1).Nanoseconds()
		}
		b.ReportMetric(float64(listNs)/float64(b.N), "list-ns/op")
		b.ReportMetric(float64(duNs)/float64(b.N), "du-ns/op")
		b.ReportMetric(float64(listNs)/float64(duNs), "list/du")
	}
	b.Run("local", paired)
	b.Run("daemon", func(b *testing.B) {
		d := exec.Command(nexusBin, "--state-dir", root, "daemon")
		d.Env = append(os.Environ(), "NEXUS_STATE_DIR=")
		stderr, _ := d.StderrPipe()
		if err := d.Start(); err != nil {
			b.Fatal(err)
		}
		defer func() { d.Process.Signal(os.Interrupt); d.Wait() }()
		buf := make([]byte, 256)
		if n, err := stderr.Read(buf); err != nil || !strings.Contains(string(buf[:n]), "serving") {
			b.Fatalf("daemon: %q %v", buf[:n], err)
		}
		paired(b)
	})
}

// BenchmarkCreateColdVsWarmCache times `nexus create` (daemon running)
// when the image is not yet in the cache (prepare, then clone the entry:
// two copies) and when it is (one copy, as before the cache existed),
// against `cp --sparse=always` + fsync of the same image. The image is
// 256 MiB with 64 MiB of data; touching it between cold runs gives it a
// new identity, so each cold create prepares a new entry.
func BenchmarkCreateColdVsWarmCache(b *testing.B) {
	image := filepath.Join(b.TempDir(), "base.raw")
	f, err := os.Create(image)
	if err != nil {
		b.Fatal(err)
	}
	chunk := make([]byte, 1<<20)
	for i := range chunk {
		chunk[i] = byte(i*7 + 1)
	}
	for i := 0; i < 64; i++ {
		f.WriteAt(chunk, int64(i)*4<<20)
	}
	f.Truncate(256 << 20)
	f.Sync()
	f.Close()
	root, err := os.MkdirTemp("", "nxc")
	if err != nil {
		b.Fatal(err)
	}
	defer os.RemoveAll(root)
	d := exec.Command(nexusBin, "--state-dir", root, "daemon")
	d.Env = append(os.Environ(), "NEXUS_STATE_DIR=")
	stderr, _ := d.StderrPipe()
	if err := d.Start(); err != nil {
		b.Fatal(err)
	}
	defer func() { d.Process.Signal(os.Interrupt); d.Wait() }()
	buf := make([]byte, 256)
	if n, err := stderr.Read(buf); err != nil || !strings.Contains(string(buf[:n]), "serving") {
		b.Fatalf("daemon: %q %v", buf[:n], err)
	}
	create := func() time.Duration {
		t0 := time.Now()
		out, err := exec.Command(nexusBin, "--state-dir", root, "--driver", "process", "create", "--json", "--image", image).Output()
		el := time.Since(t0)
		if err != nil {
			b.Fatalf("create: %v", err)
		}
		var sb struct{ ID string }
		json.Unmarshal(out, &sb)
		runQuiet(b, nexusBin, "--state-dir", root, "--driver", "process", "rm", "-f", "--with-snapshots", sb.ID)
		return el
	}
	cp := func() time.Duration {
		dst := filepath.Join(root, "cp.raw")
		t0 := time.Now()
		runQuiet(b, "cp", "--sparse=always", image, dst)
		g, _ := os.Open(dst)
		g.Sync()
		g.Close()
		el := time.Since(t0)
		os.Remove(dst)
		return el
	}
	var cold, warm, cpT time.Duration
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		now := time.Now()
		os.Chtimes(image, now, now) // new ctime: a new identity, a cache miss
		cold += create()
		warm += create()
		cpT += cp()
		b.StopTimer()
		runQuiet(b, nexusBin, "--state-dir", root, "image-cache", "prune", "--unused")
		b.StartTimer()
	}
	n := float64(b.N)
	b.ReportMetric(float64(cold.Milliseconds())/n, "cold-ms")
	b.ReportMetric(float64(warm.Milliseconds())/n, "warm-ms")
	b.ReportMetric(float64(cpT.Milliseconds())/n, "cp-fsync-ms")
	b.ReportMetric(float64(cold)/float64(cpT), "cold/cp")
	b.ReportMetric(float64(warm)/float64(cpT), "warm/cp")
}

// BenchmarkCreateMissHitVsCp times `nexus create` (daemon running) of a
// 1 GiB image with 200 MiB allocated on a cache miss and on a hit, each
// against one `cp --sparse=always` + fsync of the same image in the same
// iteration (medians; the order rotates). "rootfs" runs on the state root's
// filesystem here; "xfs-reflink" on a loop-mounted XFS with reflink=1
// holding both the image and the root, where cp (coreutils ≥ 9 defaults to
// --reflink=auto) and nexus both share extents. Without root or mkfs.xfs
// the XFS half skips and says so.
func BenchmarkCreateMissHitVsCp(b *testing.B) {
	b.Run("rootfs", func(b *testing.B) {
		benchMissHit(b, b.TempDir(), shortRoot(b))
	})
	b.Run("xfs-reflink", func(b *testing.B) {
		mnt := smallfs.MountXFS(b, 4<<30)
		root := filepath.Join(mnt, "nx")
		if err := os.Mkdir(root, 0o700); err != nil {
			b.Fatal(err)
		}
		// Registered after the mount's cleanup, so it runs before the unmount.
		b.Cleanup(func() {
			testutil.StopDaemons(root)
			testutil.KillProcessesUnder(root)
		})
		benchMissHit(b, mnt, root)
	})
}

func benchMissHit(b *testing.B, imageDir, root string) {
	image := benchImage1GIn(b, imageDir)
	startDaemon(b, root)
	var missT, hitT, cpT []time.Duration
	create := func(into *[]time.Duration) {
		t0 := time.Now()
		sb := createJSON(b, root, "--image", image)
		*into = append(*into, time.Since(t0))
		mustOK(b, proc(b, root, "rm", "-f", "--with-snapshots", sb.ID), "rm")
		syscall.Sync() // the deletion's writeback is nobody's cost
	}
	cp := func() {
		cpT = append(cpT, timedCopy(b, "--sparse=always", image, filepath.Join(root, "cp.raw")))
		syscall.Sync()
	}
	steps := []func(){func() { create(&missT) }, func() { create(&hitT) }, cp}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		runQuiet(b, nexusBin, "--state-dir", root, "image-cache", "prune", "--unused")
		syscall.Sync()
		now := time.Now()
		os.Chtimes(image, now, now) // a new ctime: a new identity, so the first create misses
		b.StartTimer()
		// The miss must come before the hit; cp takes each place in turn.
		order := [][]int{{0, 1, 2}, {0, 2, 1}, {2, 0, 1}}[i%3]
		for _, s := range order {
			steps[s]()
		}
	}
	b.StopTimer()
	b.ReportMetric(ms(median(missT)), "miss-ms")
	b.ReportMetric(ms(median(hitT)), "hit-ms")
	b.ReportMetric(ms(median(cpT)), "cp-fsync-ms")
	b.ReportMetric(float64(median(missT))/float64(median(cpT)), "miss/cp")
	b.ReportMetric(float64(median(hitT))/float64(median(cpT)), "hit/cp")
}

// timedCopy is how long cp(1) with flag takes to copy src to dst and
// fsync dst, as a baseline a create is measured against; dst is removed.
func timedCopy(b *testing.B, flag, src, dst string) time.Duration {
	b.Helper()
	t0 := time.Now()
	if out, err := exec.Command("cp", flag, src, dst).CombinedOutput(); err != nil {
		b.Fatalf("cp %s: %v %s", flag, err, out)
	}
	g, err := os.Open(dst)
	if err != nil {
		b.Fatal(err)
	}
	if err := g.Sync(); err != nil {
		b.Fatal(err)
	}
	g.Close()
	el := time.Since(t0)
	os.Remove(dst)
	return el
}
