package proc

import (
	"os"
	"os/exec"
	"slices"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
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
