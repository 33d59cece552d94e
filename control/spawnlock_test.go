package control

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nexus-sandbox/nexus/host/lease"
	"github.com/nexus-sandbox/nexus/internal/testutil"
)

// holdEnv makes this test binary a process that holds the lease at the
// path it names, the way a command holds the spawn lock, until its stdin
// closes.
const holdEnv = "NEXUS_CONTROL_TEST_HOLD_LOCK"

func TestMain(m *testing.M) {
	if path := os.Getenv(holdEnv); path != "" {
		l, err := lease.TryAcquire(path)
		if err != nil {
			fmt.Println(err)
			os.Exit(2)
		}
		fmt.Println("held")
		io.Copy(io.Discard, os.Stdin)
		l.Release()
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// holder is a real process holding the lease at path; closing release
// lets it go (once it runs).
type holder struct {
	cmd     *exec.Cmd
	release io.Closer
}

func startHolder(t *testing.T, path string) holder {
	t.Helper()
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), holdEnv+"="+path)
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	testutil.StartChild(t, cmd)
	if line, err := bufio.NewReader(stdout).ReadString('\n'); line != "held\n" {
		t.Fatalf("holder said %q, %v", line, err)
	}
	return holder{cmd: cmd, release: stdin}
}

// stop stops the holder as Ctrl-Z would and waits until the kernel says so.
func (h holder) stop(t *testing.T) {
	t.Helper()
	h.cmd.Process.Signal(syscall.SIGSTOP)
	testutil.WaitUntil(t, time.Minute, "the holder stopped", func() bool {
		data, _ := os.ReadFile(fmt.Sprintf("/proc/%d/stat", h.cmd.Process.Pid))
		i := strings.LastIndexByte(string(data), ')')
		return i > 0 && i+2 < len(data) && data[i+2] == 'T'
	})
}

// notices collects the lines a wait says.
type notices struct {
	mu    sync.Mutex
	lines []string
}

func (n *notices) add(line string) { n.mu.Lock(); n.lines = append(n.lines, line); n.mu.Unlock() }

func (n *notices) get() []string {
	n.mu.Lock()
	defer n.mu.Unlock()
	return append([]string(nil), n.lines...)
}

// acquireAsync runs acquireSpawnLock in the background.
func acquireAsync(ctx context.Context, path string, a *AutoStart) <-chan error {
	done := make(chan error, 1)
	go func() {
		l, err := acquireSpawnLock(ctx, path, a)
		l.Release()
		done <- err
	}()
	return done
}

// waitDone fails the test if the wait has not ended within a generous
// bound: a wait with no bound of its own never ends here.
func waitDone(t *testing.T, done <-chan error, what string) error {
	t.Helper()
	select {
	case err := <-done:
		return err
	case <-time.After(testutil.Scale(time.Minute)):
		t.Fatalf("%s: still waiting for the spawn lock after %v", what, testutil.Scale(time.Minute))
		return nil
	}
}

// A command stopped (Ctrl-Z) while it holds the spawn lock: a second
// waits, says once who holds it and how to free it, and fails ErrBusy
// after its bound naming the holder; a wait begun meanwhile takes the lock
// once the holder is resumed and lets go.
func TestSpawnLockWaitNamesStoppedHolder(t *testing.T) {
	path := filepath.Join(t.TempDir(), SpawnLockName)
	h := startHolder(t, path)
	h.stop(t)
	pid := h.cmd.Process.Pid
	var said notices
	a := &AutoStart{LockGrace: 50 * time.Millisecond, LockWait: time.Second, Ready: time.Hour, Notice: said.add}
	err := waitDone(t, acquireAsync(t.Context(), path, a), "a bounded wait")
	if !errors.Is(err, ErrBusy) {
		t.Fatalf("wait on a stopped holder = %v, want ErrBusy", err)
	}
	for _, want := range []string{fmt.Sprintf("held after 1s by pid %d (%s", pid, os.Args[0]), "stopped (Ctrl-Z or SIGSTOP)", fmt.Sprintf("`kill -CONT %d`", pid)} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not say %q", err, want)
		}
	}
	lines := said.get()
	if len(lines) != 1 || !strings.Contains(lines[0], fmt.Sprintf("held by pid %d (", pid)) || !strings.Contains(lines[0], "stopped (Ctrl-Z or SIGSTOP)") {
		t.Fatalf("notices = %q, want one naming stopped pid %d", lines, pid)
	}

	var said2 notices
	a2 := &AutoStart{LockGrace: 50 * time.Millisecond, LockWait: time.Hour, Notice: said2.add}
	done := acquireAsync(t.Context(), path, a2)
	testutil.WaitUntil(t, time.Minute, "the second wait's notice", func() bool { return len(said2.get()) == 1 })
	h.release.Close()
	h.cmd.Process.Signal(syscall.SIGCONT)
	if err := waitDone(t, done, "a wait on a resumed holder"); err != nil {
		t.Fatalf("wait after the holder resumed and let go: %v", err)
	}
	if err := h.cmd.Wait(); err != nil {
		t.Fatalf("holder: %v", err)
	}
	if n := len(said2.get()); n != 1 {
		t.Fatalf("%d notices, want one", n)
	}
}

// A holder that runs is starting a daemon: the wait outlasts its own
// bound for it, and takes the lock when the holder lets go.
func TestSpawnLockWaitsForRunningHolder(t *testing.T) {
	path := filepath.Join(t.TempDir(), SpawnLockName)
	h := startHolder(t, path)
	var said notices
	bound := 200 * time.Millisecond
	a := &AutoStart{LockGrace: 50 * time.Millisecond, LockWait: bound, Ready: time.Hour, Notice: said.add}
	start := time.Now()
	done := acquireAsync(t.Context(), path, a)
	testutil.WaitUntil(t, time.Minute, "the notice", func() bool { return len(said.get()) == 1 })
	if l := said.get()[0]; !strings.Contains(l, fmt.Sprintf("held by pid %d (", h.cmd.Process.Pid)) || !strings.Contains(l, "running") {
		t.Fatalf("notice %q does not name running pid %d", l, h.cmd.Process.Pid)
	}
	// Well past the bound, the wait goes on.
	time.Sleep(5 * bound)
	select {
	case err := <-done:
		t.Fatalf("the wait ended after %v with the holder running: %v", time.Since(start), err)
	default:
	}
	h.release.Close()
	if err := waitDone(t, done, "a wait on a holder that let go"); err != nil {
		t.Fatal(err)
	}
}

// The pid in the lock file is only a claim: when it is not the process
// the kernel says holds the lock, the message says so and names the
// kernel's holder. Once the holder's own bound is over too, a running
// holder is given up on.
func TestSpawnLockWaitNamesStaleRecord(t *testing.T) {
	path := filepath.Join(t.TempDir(), SpawnLockName)
	h := startHolder(t, path)
	gone := exec.Command("true")
	if err := gone.Run(); err != nil {
		t.Fatal(err)
	}
	stale := gone.Process.Pid
	if err := os.WriteFile(path, fmt.Appendf(nil, "%d\n", stale), 0o600); err != nil {
		t.Fatal(err)
	}
	a := &AutoStart{LockGrace: time.Nanosecond, LockWait: 100 * time.Millisecond, Ready: time.Nanosecond}
	err := waitDone(t, acquireAsync(t.Context(), path, a), "a bounded wait")
	if !errors.Is(err, ErrBusy) {
		t.Fatalf("wait = %v, want ErrBusy", err)
	}
	for _, want := range []string{fmt.Sprintf("by pid %d (", h.cmd.Process.Pid), fmt.Sprintf("the lock file records pid %d, which is not the holder", stale), fmt.Sprintf("`kill %d`", h.cmd.Process.Pid)} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not say %q", err, want)
		}
	}
}

// Ctrl-C of the waiter ends the wait at once, whatever its bound.
func TestSpawnLockWaitEndsOnCancel(t *testing.T) {
	path := filepath.Join(t.TempDir(), SpawnLockName)
	h := startHolder(t, path)
	h.stop(t)
	var said notices
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	done := acquireAsync(ctx, path, &AutoStart{LockGrace: 50 * time.Millisecond, LockWait: time.Hour, Notice: said.add})
	testutil.WaitUntil(t, time.Minute, "the notice", func() bool { return len(said.get()) == 1 })
	cancel()
	if err := waitDone(t, done, "a cancelled wait"); !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled wait = %v, want context.Canceled", err)
	}
}

// The kernel names the process that took a flock even after it exited,
// while a process it started holds the descriptor: the message says that
// pid no longer runs rather than name it as a process to resume or end.
// flock(1) hands its descriptor to its command, here a shell that leaves
// a sleep holding it and exits.
func TestSpawnLockWaitNamesGoneTaker(t *testing.T) {
	path := filepath.Join(t.TempDir(), SpawnLockName)
	taker := exec.Command("flock", "-x", path, "sh", "-c", "sleep 600 >/dev/null 2>&1 & echo $!")
	out, err := taker.Output()
	if err != nil {
		t.Fatalf("flock: %v", err)
	}
	var sleeper int
	if _, err := fmt.Sscan(string(out), &sleeper); err != nil {
		t.Fatalf("flock said %q", out)
	}
	t.Cleanup(func() { syscall.Kill(sleeper, syscall.SIGKILL) })
	a := &AutoStart{LockGrace: time.Nanosecond, LockWait: 100 * time.Millisecond, Ready: time.Hour}
	err = waitDone(t, acquireAsync(t.Context(), path, a), "a bounded wait")
	want := fmt.Sprintf("by a process that inherited it from pid %d, which no longer runs: end the process that holds it", taker.Process.Pid)
	if !errors.Is(err, ErrBusy) || !strings.Contains(err.Error(), want) {
		t.Fatalf("wait = %v, want ErrBusy saying %q", err, want)
	}
	syscall.Kill(sleeper, syscall.SIGKILL)
	a.LockWait = time.Hour
	if err := waitDone(t, acquireAsync(t.Context(), path, a), "a wait once the descriptor's last holder died"); err != nil {
		t.Fatal(err)
	}
}
