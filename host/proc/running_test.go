package proc

import (
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/nexus-sandbox/nexus/internal/testutil"
)

func TestRunningMatchesOfAndSeesZombiesAsGone(t *testing.T) {
	self, err := Of(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	id, running, err := Running(os.Getpid())
	if err != nil || !running || id != self {
		t.Fatalf("Running(self) = %v %v %v, want %v true", id, running, err, self)
	}
	// A zombie: exited, not yet waited for.
	c := exec.Command("true")
	if err := c.Start(); err != nil {
		t.Fatal(err)
	}
	var ws syscall.WaitStatus
	// Wait for the exit without reaping (WNOWAIT), so the pid stays a zombie.
	var info unix.Siginfo
	if err := unix.Waitid(unix.P_PID, c.Process.Pid, &info, unix.WEXITED|unix.WNOWAIT, nil); err != nil {
		t.Fatal(err)
	}
	_, running, err = Running(c.Process.Pid)
	if err != nil || running {
		t.Fatalf("zombie: running=%v err=%v", running, err)
	}
	syscall.Wait4(c.Process.Pid, &ws, 0, nil)
	if _, running, err = Running(c.Process.Pid); err != nil || running {
		t.Fatalf("reaped: running=%v err=%v", running, err)
	}
}

func TestWithArgsFindsAProcessByItsCommandLine(t *testing.T) {
	cmd := exec.Command("sleep", "4242.5")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { cmd.Process.Kill(); cmd.Wait() }()
	// exec's success reaches the parent a moment before the kernel has
	// the new command line in place: wait for it to be readable.
	testutil.WaitUntil(t, 10*time.Second, "sleep's command line", func() bool {
		args, err := Args(cmd.Process.Pid)
		return err == nil && len(args) == 2 && args[1] == "4242.5"
	})
	if got := WithArgs("4242.5"); !slices.Contains(got, cmd.Process.Pid) {
		t.Fatalf("WithArgs(4242.5) = %v, want pid %d among them", got, cmd.Process.Pid)
	}
	if got := WithArgs("4242.6"); slices.Contains(got, cmd.Process.Pid) {
		t.Fatalf("WithArgs matched other arguments: %v", got)
	}
	if got := WithArgs("4242.5", "extra"); slices.Contains(got, cmd.Process.Pid) {
		t.Fatalf("WithArgs matched a longer prefix than the command line: %v", got)
	}
}

// One scan over a /proc-shaped tree: each process once, this process
// left out, a long command line cut and flagged, a vanished one reported.
func TestScanCmdlines(t *testing.T) {
	root := t.TempDir()
	write := func(pid int, data string) {
		dir := filepath.Join(root, strconv.Itoa(pid))
		if err := os.Mkdir(dir, 0o700); err != nil {
			t.Fatal(err)
		}
		if data != "" {
			if err := os.WriteFile(filepath.Join(dir, "cmdline"), []byte(data), 0o600); err != nil {
				t.Fatal(err)
			}
		}
	}
	write(11, "a\x00b\x00")
	write(12, "0123456789\x00")
	write(13, "") // no cmdline file: gone mid-scan
	write(os.Getpid(), "self\x00")
	os.Mkdir(filepath.Join(root, "self"), 0o700)
	got := map[int]Cmdline{}
	err := ScanCmdlines(root, 8, func(c Cmdline) {
		c.Data = slices.Clone(c.Data)
		if _, dup := got[c.Pid]; dup {
			t.Errorf("pid %d visited twice", c.Pid)
		}
		got[c.Pid] = c
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 3 {
		t.Fatalf("visited %v, want pids 11, 12, 13 only", got)
	}
	if c := got[11]; c.Err != nil || c.Truncated || !slices.Equal(c.Args(), []string{"a", "b"}) {
		t.Errorf("pid 11: %+v, args %q", c, c.Args())
	}
	if c := got[12]; c.Err != nil || !c.Truncated || string(c.Data) != "01234567" {
		t.Errorf("pid 12: %+v, want the first 8 bytes, truncated", c)
	}
	if c := got[13]; c.Err == nil {
		t.Errorf("pid 13: %+v, want an error", c)
	}
	if err := ScanCmdlines(filepath.Join(root, "none"), 8, func(Cmdline) { t.Error("visited a missing root") }); err == nil {
		t.Error("a missing root: no error")
	}
}

func TestArgs(t *testing.T) {
	cmd := exec.Command("sleep", "4242.7")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { cmd.Process.Kill(); cmd.Wait() }()
	// Start returns once exec has closed the child's close-on-exec pipe,
	// which the kernel does before it lays out the new argv: for a moment
	// the command line reads empty.
	var argv []string
	var err error
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(time.Millisecond) {
		argv, err = Args(cmd.Process.Pid)
		if err != nil || len(argv) > 0 || time.Now().After(deadline) {
			break
		}
	}
	if err != nil || !slices.Equal(argv, []string{"sleep", "4242.7"}) {
		t.Fatalf("Args = %q, %v", argv, err)
	}
}

// A process's start in Unix time is no later than now (btime has whole
// seconds, so it may read up to a second early, never late).
func TestStartUnixMs(t *testing.T) {
	self, err := Self()
	if err != nil {
		t.Fatal(err)
	}
	ms, err := self.StartUnixMs()
	if err != nil {
		t.Fatal(err)
	}
	if now := time.Now().UnixMilli(); ms <= 0 || ms > now+1000 {
		t.Fatalf("StartUnixMs = %d, now %d", ms, now)
	}
}
