package testutil

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// A process a test leaves running under its state root is killed when the
// test ends, and the root is removed.
func TestShortRootKillsLeftoverProcesses(t *testing.T) {
	var root string
	var cmd *exec.Cmd
	t.Run("leaves a process", func(t *testing.T) {
		root = ShortRoot(t)
		marker := filepath.Join(root, "marker")
		if err := os.WriteFile(marker, nil, 0o600); err != nil {
			t.Fatal(err)
		}
		cmd = exec.Command("tail", "-f", marker)
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		found := false
		for _, p := range ProcessesUnder(root) {
			found = found || p.Pid == cmd.Process.Pid && strings.Contains(p.Cmdline, marker)
		}
		if !found {
			t.Fatalf("ProcessesUnder(%s) misses pid %d", root, cmd.Process.Pid)
		}
	})
	err := cmd.Wait()
	ws, ok := cmd.ProcessState.Sys().(syscall.WaitStatus)
	if err == nil || !ok || ws.Signal() != syscall.SIGKILL {
		t.Fatalf("leftover process ended with %v (%v), want SIGKILL", err, cmd.ProcessState)
	}
	if _, err := os.Stat(root); !os.IsNotExist(err) {
		t.Fatalf("root %s still there: %v", root, err)
	}
}

func TestScale(t *testing.T) {
	t.Setenv(ScaleEnv, "2.5")
	if got := Scale(2 * time.Second); got != 5*time.Second {
		t.Fatalf("Scale(2s) with %s=2.5 = %v", ScaleEnv, got)
	}
	want := time.Second
	if RaceEnabled {
		want = 3 * time.Second
	}
	for _, v := range []string{"", "0", "-1", "fast"} {
		t.Setenv(ScaleEnv, v)
		if got := Scale(time.Second); got != want {
			t.Errorf("Scale(1s) with %s=%q = %v, want the default %v", ScaleEnv, v, got, want)
		}
	}
}

func TestWaitUntilFailsAfterTheScaledLimit(t *testing.T) {
	t.Setenv(ScaleEnv, "2")
	ft := &fakeT{TB: t}
	start := time.Now()
	func() {
		defer func() { recover() }()
		WaitUntil(ft, 50*time.Millisecond, "ready", func() bool { return false })
	}()
	if !ft.failed || !strings.Contains(ft.msg, "still not ready after 100ms") {
		t.Fatalf("failed %v with %q", ft.failed, ft.msg)
	}
	if el := time.Since(start); el < 100*time.Millisecond {
		t.Fatalf("gave up after %v, before the scaled 100ms", el)
	}
	calls := 0
	WaitUntil(t, time.Minute, "counted", func() bool { calls++; return calls == 3 })
	if calls != 3 {
		t.Fatalf("cond called %d times", calls)
	}
}

// fakeT records a Fatalf instead of ending the test that checks it.
type fakeT struct {
	testing.TB
	failed bool
	msg    string
}

func (f *fakeT) Helper() {}
func (f *fakeT) Fatalf(format string, args ...any) {
	f.failed = true
	f.msg = strings.TrimSpace(strings.ReplaceAll(fmt.Sprintf(format, args...), "\n", " "))
	panic("fatal")
}

// A reap kept ambiguous only for an inconclusive /proc scan is asked
// again, a bounded number of times; any other verdict ends the loop.
func TestReapUntilConclusive(t *testing.T) {
	if !KeptInconclusive("ambiguous", "/proc scan inconclusive: pid 9: no such file") ||
		KeptInconclusive("live", ProcInconclusive) || KeptInconclusive("ambiguous", "journal unreadable") {
		t.Fatal("KeptInconclusive misjudges a reason")
	}
	passes := 0
	ReapUntilConclusive(t, "reap", func() (bool, string) { passes++; return passes < 3, "" })
	if passes != 3 {
		t.Fatalf("stopped after %d passes, want the first conclusive one, 3", passes)
	}
	ft := &fakeT{TB: t}
	passes = 0
	func() {
		defer func() { recover() }()
		ReapUntilConclusive(ft, "reap --apply", func() (bool, string) { passes++; return true, "kept x" })
	}()
	if !ft.failed || passes != ReapPasses || !strings.Contains(ft.msg, "reap --apply: the /proc scan was inconclusive 20 times running: kept x") {
		t.Fatalf("after %d passes: failed %v with %q", passes, ft.failed, ft.msg)
	}
}

// A child's output read while os/exec still copies it in: run under
// -race, an unguarded bytes.Buffer here is reported as a data race.
func TestBufferReadWhileWritten(t *testing.T) {
	var b Buffer
	cmd := exec.Command("sh", "-c", "for i in 1 2 3 4 5 6 7 8 9 10; do echo line $i; sleep 0.01; done")
	cmd.Stdout = &b
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 50; i++ {
		_ = b.String()
		time.Sleep(2 * time.Millisecond)
	}
	if err := cmd.Wait(); err != nil {
		t.Fatal(err)
	}
	if got := b.String(); !strings.HasPrefix(got, "line 1\n") || !strings.HasSuffix(got, "line 10\n") {
		t.Fatalf("buffer holds %q", got)
	}
}
