package proc

import (
	"bufio"
	"context"
	"errors"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nexus-sandbox/nexus/internal/testutil"
)

type waited struct {
	x   Exit
	err error
}

// waitAsync runs WaitExit in the background.
func waitAsync(ctx context.Context, id Identity) <-chan waited {
	ch := make(chan waited, 1)
	go func() {
		x, err := WaitExit(ctx, id)
		ch <- waited{x, err}
	}()
	return ch
}

// result fails the test if WaitExit has not returned after a minute: a
// guard against hanging, not a timing assertion.
func result(t *testing.T, ch <-chan waited) waited {
	t.Helper()
	select {
	case w := <-ch:
		return w
	case <-time.After(testutil.Scale(time.Minute)):
		t.Fatal("WaitExit did not return within a minute of the exit")
		return waited{}
	}
}

func identityOf(t *testing.T, pid int) Identity {
	t.Helper()
	id, err := Of(pid)
	if err != nil {
		t.Fatal(err)
	}
	return id
}

// A child's exit status is known to its parent: SIGKILL reads as such.
func TestWaitExitChildKilled(t *testing.T) {
	cmd := startChild(t, "sleep", "1000")
	id := identityOf(t, cmd.Process.Pid)
	ch := waitAsync(context.Background(), id)
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	w := result(t, ch)
	if w.err != nil || !w.x.Known || w.x.Signal != syscall.SIGKILL {
		t.Fatalf("WaitExit = %+v, %v; want known, killed by SIGKILL", w.x, w.err)
	}
	if s := w.x.String(); s != "killed by SIGKILL" {
		t.Fatalf("String() = %q", s)
	}
	// WNOWAIT: the status is still there for the parent's own wait.
	if err := cmd.Wait(); err == nil || !strings.Contains(err.Error(), "killed") {
		t.Fatalf("cmd.Wait after WaitExit = %v, want the kill reported", err)
	}
}

// A child that exits on its own before the wait starts is a zombie until
// reaped: its pidfd is readable at once and its code is known.
func TestWaitExitChildExitCode(t *testing.T) {
	cmd := startChild(t, "sh", "-c", "exit 3")
	id := identityOf(t, cmd.Process.Pid)
	w := result(t, waitAsync(context.Background(), id))
	if w.err != nil || !w.x.Known || w.x.Signal != 0 || w.x.Code != 3 {
		t.Fatalf("WaitExit = %+v, %v; want known exit status 3", w.x, w.err)
	}
}

// A process that is not our child (reparented when its shell exited) ends
// with an unknown status, but its end is still seen.
func TestWaitExitNonChildUnknown(t *testing.T) {
	sh := exec.Command("sh", "-c", "sleep 1000 >/dev/null 2>&1 & echo $!")
	out, err := sh.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := sh.Start(); err != nil {
		t.Fatal(err)
	}
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil {
		t.Fatal(err)
	}
	sh.Wait()
	pid, err := strconv.Atoi(strings.TrimSpace(line))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { syscall.Kill(pid, syscall.SIGKILL) })
	id := identityOf(t, pid)
	ch := waitAsync(context.Background(), id)
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	w := result(t, ch)
	if w.err != nil || w.x.Known {
		t.Fatalf("WaitExit of a non-child = %+v, %v; want an unknown status", w.x, w.err)
	}
	if alive, _ := Alive(id); alive {
		t.Fatal("WaitExit returned while the process still runs")
	}
}

// A pid whose start time does not match names another process: the one
// recorded is gone, whatever now runs under that pid.
func TestWaitExitStartTimeMismatchIsGone(t *testing.T) {
	self := identityOf(t, os.Getpid())
	w := result(t, waitAsync(context.Background(), Identity{Pid: self.Pid, StartTicks: self.StartTicks + 1}))
	if w.err != nil || w.x.Known {
		t.Fatalf("WaitExit of a reused pid = %+v, %v; want gone, status unknown", w.x, w.err)
	}
}

// A live process is waited for until the context ends.
func TestWaitExitCancel(t *testing.T) {
	self := identityOf(t, os.Getpid())
	ctx, cancel := context.WithCancel(context.Background())
	ch := waitAsync(ctx, self)
	cancel()
	w := result(t, ch)
	if !errors.Is(w.err, context.Canceled) {
		t.Fatalf("WaitExit of a live process after cancel = %+v, %v; want context.Canceled", w.x, w.err)
	}
}
