package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nexus-sandbox/nexus/internal/testutil"
)

// startCost is what one process cost itself, as the kernel accounted it
// when it was reaped (wait4's rusage): user+sys CPU, and the page faults
// it took (each maps a page of the binary or of fresh memory).
type startCost struct {
	cpu    time.Duration
	faults int64
}

// costOf runs bin with args and returns its own cost. A daemon it talks
// to is another process, not waited for: its CPU is not counted.
func costOf(b *testing.B, env []string, bin string, args ...string) startCost {
	b.Helper()
	cmd := exec.Command(bin, args...)
	cmd.Env = append(os.Environ(), env...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		b.Fatalf("%s %v: %v\n%s", bin, args, err, out)
	}
	ru := cmd.ProcessState.SysUsage().(*syscall.Rusage)
	return startCost{cpu: time.Duration(ru.Utime.Nano() + ru.Stime.Nano()), faults: ru.Minflt + ru.Majflt}
}

// BenchmarkCLIStartCPU is what a command costs the process a user runs:
// `nexus version`, and `nexus ls` on an empty root through its (already
// started) daemon, against a minimal Go program (`func main() {}`). All are
// built in this run with the same go build flags (NEXUS_BENCH_BUILD_FLAGS,
// e.g. "-trimpath -ldflags=-s"), nexus as `make build` builds it: without
// the tests' hooks. Each op runs each program once, interleaved, the order
// rotating; the ratios are of the medians. NEXUS_BENCH_OTHER_NEXUS names
// another nexus (an older build, its nexusd beside it) measured the same
// way in the same ops, on a root of its own.
func BenchmarkCLIStartCPU(b *testing.B) {
	dir := b.TempDir()
	flags := strings.Fields(os.Getenv("NEXUS_BENCH_BUILD_FLAGS"))
	src := filepath.Join(dir, "main.go")
	if err := os.WriteFile(src, []byte("package main\n\nfunc main() {}\n"), 0o600); err != nil {
		b.Fatal(err)
	}
	minimal := filepath.Join(dir, "minimal")
	build := exec.Command("go", append(append([]string{"build"}, flags...), "-o", minimal, src)...)
	if out, err := build.CombinedOutput(); err != nil {
		b.Fatalf("build the minimal program: %v\n%s", err, out)
	}
	bin := filepath.Join(dir, "release")
	if err := testutil.BuildReleaseIn(mkdir(b, bin), flags...); err != nil {
		b.Fatal(err)
	}
	env := []string{"NEXUS_STATE_DIR="}
	type prog struct {
		name string
		bin  string
		args []string
		cost []startCost
	}
	progs := []*prog{{name: "minimal", bin: minimal}}
	add := func(prefix, nexus, root string) {
		stopDaemonsAtEnd(b, root)
		// The first command starts the daemon; the ops measure the CLI alone.
		costOf(b, env, nexus, "--state-dir", root, "ls")
		progs = append(progs,
			&prog{name: prefix + "version", bin: nexus, args: []string{"version"}},
			&prog{name: prefix + "ls", bin: nexus, args: []string{"--state-dir", root, "ls"}})
	}
	add("", filepath.Join(bin, "nexus"), filepath.Join(dir, "root"))
	if other := os.Getenv("NEXUS_BENCH_OTHER_NEXUS"); other != "" {
		add("other-", other, filepath.Join(dir, "other-root"))
	}
	// Once each untimed: every timed run finds its binary in the page cache.
	for _, p := range progs {
		costOf(b, env, p.bin, p.args...)
	}
	b.ResetTimer()
	for i := range b.N {
		for j := range progs {
			p := progs[(i+j)%len(progs)]
			p.cost = append(p.cost, costOf(b, env, p.bin, p.args...))
		}
	}
	b.StopTimer()
	base := medianCost(progs[0].cost)
	b.ReportMetric(float64(base.cpu.Microseconds()), "minimal-cpu-us")
	b.ReportMetric(float64(base.faults), "minimal-faults")
	for _, p := range progs[1:] {
		m := medianCost(p.cost)
		b.ReportMetric(float64(m.cpu.Microseconds()), p.name+"-cpu-us")
		b.ReportMetric(float64(m.faults), p.name+"-faults")
		b.ReportMetric(float64(m.cpu)/float64(base.cpu), p.name+"/minimal")
	}
}

// medianCost is the median CPU and, apart, the median page faults.
func medianCost(cs []startCost) startCost {
	cpu := make([]time.Duration, len(cs))
	faults := make([]int64, len(cs))
	for i, c := range cs {
		cpu[i], faults[i] = c.cpu, c.faults
	}
	slices.Sort(faults)
	return startCost{cpu: median(cpu), faults: faults[len(faults)/2]}
}

func mkdir(b *testing.B, dir string) string {
	b.Helper()
	if err := os.Mkdir(dir, 0o700); err != nil {
		b.Fatal(err)
	}
	return dir
}
