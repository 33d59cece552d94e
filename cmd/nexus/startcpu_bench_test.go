package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"
)

// cpuOf runs bin with args and returns the CPU (user+sys) the process
// itself spent, as the kernel accounted it.
func cpuOf(b *testing.B, env []string, bin string, args ...string) time.Duration {
	b.Helper()
	cmd := exec.Command(bin, args...)
	cmd.Env = append(os.Environ(), env...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		b.Fatalf("%s %v: %v\n%s", bin, args, err, out)
	}
	ru := cmd.ProcessState.SysUsage().(*syscall.Rusage)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkCLIStartCPU is what a command costs the CLI's own process:
// `nexus version`, and `nexus ls` on an empty root through its (already
// started) daemon, each against a minimal Go program built in the same run,
// interleaved per op. The ratios are the CPU of each over the minimal
// program's. NEXUS_BENCH_OTHER_NEXUS names another nexus (an older build)
// measured the same way in the same ops, on a root of its own.
func BenchmarkCLIStartCPU(b *testing.B) {
	dir := b.TempDir()
	src := filepath.Join(dir, "main.go")
	if err := os.WriteFile(src, []byte("package main\n\nfunc main() {}\n"), 0o600); err != nil {
		b.Fatal(err)
	}
	minimal := filepath.Join(dir, "minimal")
	if out, err := exec.Command("go", "build", "-o", minimal, src).CombinedOutput(); err != nil {
		b.Fatalf("build the minimal program: %v\n%s", err, out)
	}
	root := filepath.Join(dir, "root")
	stopDaemonsAtEnd(b, root)
	env := []string{"NEXUS_STATE_DIR="}
	// The first command starts the daemon; the ops measure the CLI alone.
	cpuOf(b, env, nexusBin, "--state-dir", root, "ls")
	other := os.Getenv("NEXUS_BENCH_OTHER_NEXUS")
	otherRoot := filepath.Join(dir, "other-root")
	if other != "" {
		stopDaemonsAtEnd(b, otherRoot)
		cpuOf(b, env, other, "--state-dir", otherRoot, "ls")
	}
	var base, version, ls, otherVersion, otherLs time.Duration
	b.ResetTimer()
	for range b.N {
		base += cpuOf(b, env, minimal)
		version += cpuOf(b, env, nexusBin, "version")
		ls += cpuOf(b, env, nexusBin, "--state-dir", root, "ls")
		if other != "" {
			otherVersion += cpuOf(b, env, other, "version")
			otherLs += cpuOf(b, env, other, "--state-dir", otherRoot, "ls")
		}
	}
	n := float64(b.N)
	b.ReportMetric(float64(base.Microseconds())/n, "minimal-cpu-us")
	b.ReportMetric(float64(version.Microseconds())/n, "version-cpu-us")
	b.ReportMetric(float64(ls.Microseconds())/n, "ls-cpu-us")
	b.ReportMetric(float64(version)/float64(base), "version/minimal")
	b.ReportMetric(float64(ls)/float64(base), "ls/minimal")
	if other != "" {
		b.ReportMetric(float64(otherVersion)/float64(base), "other-version/minimal")
		b.ReportMetric(float64(otherLs)/float64(base), "other-ls/minimal")
	}
}
