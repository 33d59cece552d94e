package main

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	hostproc "github.com/nexus-sandbox/nexus/host/proc"
	"github.com/nexus-sandbox/nexus/host/smallfs"
	"github.com/nexus-sandbox/nexus/internal/testutil"
)

// BenchmarkCreateHitVsReflink times `nexus create` on the process driver
// with its image in the cache (daemon running) against `cp
// --reflink=always` of the same image plus an fsync of the copy, both on
// one loop-mounted XFS made with reflink=1 that holds the image and the
// state root. The image is 1 GiB with 200 MiB allocated. Each op times one
// of each, the order alternating; removals and their writeback are
// untimed. Medians. NEXUS_BENCH_OTHER_NEXUS names another nexus (an older
// build, its nexusd beside it) timed the same way in the same ops, on a
// root of its own on the same filesystem. Without root or mkfs.xfs it
// skips and says so.
func BenchmarkCreateHitVsReflink(b *testing.B) {
	mnt := smallfs.MountXFS(b, 4<<30)
	image := benchImage1GIn(b, mnt)
	type side struct {
		bin, root string
		times     []time.Duration
	}
	sides := []*side{{bin: nexusBin, root: filepath.Join(mnt, "nx")}}
	if other := os.Getenv("NEXUS_BENCH_OTHER_NEXUS"); other != "" {
		sides = append(sides, &side{bin: other, root: filepath.Join(mnt, "other")})
	}
	for _, s := range sides {
		if err := os.Mkdir(s.root, 0o700); err != nil {
			b.Fatal(err)
		}
		// The OS disk's reflink is what is compared with cp's: a copy
		// root (under the overlay root a hit clones no image at all;
		// BenchmarkOverlayCreate measures that).
		copyRoot(b, s.root)
		// Registered after the mount's cleanup, so it runs before the unmount.
		b.Cleanup(func() {
			testutil.StopDaemons(s.root)
			testutil.KillProcessesUnder(s.root)
		})
		testutil.StartDaemon(b, s.bin, s.root)
	}
	create := func(s *side) time.Duration {
		t0 := time.Now()
		r := nexusBinEnv(b, s.bin, s.root, nil, "--driver", "process", "create", "-q", "--image", image)
		el := time.Since(t0)
		mustOK(b, r, "create")
		mustOK(b, nexusBinEnv(b, s.bin, s.root, nil, "--driver", "process", "rm", "-f", strings.TrimSpace(r.stdout)), "rm")
		syscall.Sync() // the removal's writeback is nobody's cost
		return el
	}
	var cpT []time.Duration
	cp := func() {
		cpT = append(cpT, timedCopy(b, "--reflink=always", image, filepath.Join(mnt, "cp.raw")))
		syscall.Sync()
	}
	// The first create of each side fills its cache: every timed one hits.
	for _, s := range sides {
		create(s)
	}
	cp()
	cpT = nil
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if i%2 == 1 {
			cp()
		}
		for _, s := range sides {
			s.times = append(s.times, create(s))
		}
		if i%2 == 0 {
			cp()
		}
	}
	b.StopTimer()
	b.ReportMetric(ms(median(sides[0].times)), "hit-ms")
	b.ReportMetric(ms(median(cpT)), "cp-reflink-fsync-ms")
	b.ReportMetric(float64(median(sides[0].times))/float64(median(cpT)), "hit/cp")
	if len(sides) > 1 {
		b.ReportMetric(ms(median(sides[1].times)), "other-hit-ms")
		b.ReportMetric(float64(median(sides[1].times))/float64(median(cpT)), "other-hit/cp")
	}
}

// BenchmarkSpawnToReady is what starting a sandbox's supervisor costs, from
// nexus-shim and from nexusd: the wall time from the spawn to its signal
// on the readiness pipe, and the CPU its process spent by then (every
// thread's, from /proc/PID/task/*/schedstat), interleaved per op.
func BenchmarkSpawnToReady(b *testing.B) {
	dir := filepath.Join(shortRoot(b), "supervisors")
	bins := map[string]string{"shim": filepath.Join(filepath.Dir(nexusBin), "nexus-shim"), "nexusd": daemonOf(nexusBin)}
	wall := map[string]time.Duration{}
	cpu := map[string]time.Duration{}
	spawn := func(name string, i int) {
		id := "01JBENCHSPAWN" + strconv.Itoa(i) + name
		state := filepath.Join(dir, id)
		logf, err := os.Create(state + ".log")
		if err != nil {
			b.Fatal(err)
		}
		defer logf.Close()
		argv := []string{bins[name], "supervisor", "--sandbox", id, "--state-dir", state, "--iid-socket", state + ".iid.sock"}
		t0 := time.Now()
		who, rd, err := hostproc.SpawnReady(argv, nil, logf)
		if err != nil {
			b.Fatal(err)
		}
		defer rd.Close()
		if err := rd.Wait(context.Background(), testutil.Scale(time.Minute)); err != nil {
			out, _ := os.ReadFile(state + ".log")
			b.Fatalf("%s supervisor: %v; log: %s", name, err, out)
		}
		wall[name] += time.Since(t0)
		cpu[name] += taskCPU(b, who.Pid)
		if err := hostproc.Terminate(who, testutil.Scale(30*time.Second)); err != nil {
			b.Fatal(err)
		}
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		spawn("shim", i)
		spawn("nexusd", i)
	}
	n := float64(b.N)
	for _, name := range []string{"shim", "nexusd"} {
		b.ReportMetric(float64(wall[name].Microseconds())/n, name+"-wall-us")
		b.ReportMetric(float64(cpu[name].Microseconds())/n, name+"-cpu-us")
	}
	b.ReportMetric(float64(cpu["shim"])/float64(cpu["nexusd"]), "shim/nexusd-cpu")
}

// taskCPU sums the time on CPU of every thread of pid
// (/proc/PID/task/*/schedstat, nanoseconds).
func taskCPU(b *testing.B, pid int) time.Duration {
	b.Helper()
	tasks, err := filepath.Glob(filepath.Join("/proc", strconv.Itoa(pid), "task", "*", "schedstat"))
	if err != nil || len(tasks) == 0 {
		b.Fatalf("threads of pid %d: %v", pid, err)
	}
	var sum time.Duration
	for _, p := range tasks {
		data, err := os.ReadFile(p)
		if err != nil {
			continue // a thread that exited meanwhile
		}
		f := strings.Fields(string(data))
		if len(f) == 0 {
			continue
		}
		ns, err := strconv.ParseInt(f[0], 10, 64)
		if err != nil {
			b.Fatalf("%s: %q", p, data)
		}
		sum += time.Duration(ns)
	}
	return sum
}
