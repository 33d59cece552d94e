package main

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/nexus-sandbox/nexus/control"
	"github.com/nexus-sandbox/nexus/control/wire"
	"github.com/nexus-sandbox/nexus/internal/testutil"
)

// socketsOf counts the sockets process pid holds open: a command's are
// its connections to the daemon.
func socketsOf(pid int) int {
	dir := filepath.Join("/proc", strconv.Itoa(pid), "fd")
	entries, _ := os.ReadDir(dir)
	n := 0
	for _, e := range entries {
		if l, err := os.Readlink(filepath.Join(dir, e.Name())); err == nil && strings.HasPrefix(l, "socket:") {
			n++
		}
	}
	return n
}

var heldAt = regexp.MustCompile(`holding the journal's open at daemon\.early-open \(pid (\d+)\)`)

// TestEarlyDaemonWhoseOpenFailsAnswersEveryCommand: a daemon started on
// demand answers `ls` from the sandbox store while its journal's open is
// held (NEXUS_PAUSE_AT=daemon.early-open); a FIFO is then planted where the
// open reads a snapshot, a command that needs the journal waits for it,
// and a client stays connected. Let go, the open fails: the waiting
// command fails with one line naming the FIFO, the connected client's
// next request is answered with the same error, the daemon removes its
// socket and exits with that error, and the next command, which finds no
// mark, fails at once naming the FIFO.
func TestEarlyDaemonWhoseOpenFailsAnswersEveryCommand(t *testing.T) {
	t.Parallel()
	root := shortRoot(t)
	mustOK(t, bounded(t, root, "testfill", "--sandboxes", "3"), "testfill")
	stopDaemons(root) // a clean stop: the store is marked current
	held := nexusEnv(t, root, []string{"NEXUS_PAUSE_AT=daemon.early-open"}, "ls", "--format", "json")
	mustOK(t, held, "ls answered early")
	if n := strings.Count(held.stdout, `"id"`); n != 3 {
		t.Fatalf("ls answered early lists %d sandboxes, want 3:\n%s", n, held.stdout)
	}
	logPath := filepath.Join(root, control.DaemonLog)
	readLog := func() string { b, _ := os.ReadFile(logPath); return string(b) }
	var m []string
	waitUntil(t, "the daemon holding its journal's open behind the early reads", func() bool {
		m = heldAt.FindStringSubmatch(readLog())
		return m != nil
	})
	pid, _ := strconv.Atoi(m[1])

	snap := filepath.Join(root, "projections", "sagas.snap")
	if err := os.Remove(snap); err != nil && !errors.Is(err, os.ErrNotExist) {
		t.Fatal(err)
	}
	if err := unix.Mkfifo(snap, 0o600); err != nil {
		t.Fatal(err)
	}

	// A command that needs the journal: connected, it waits for the open.
	ctx, cancel := context.WithTimeout(context.Background(), testutil.Scale(2*time.Minute))
	defer cancel()
	waiting := exec.CommandContext(ctx, nexusBin, "--state-dir", root, "events", "-n", "1")
	waiting.Env = append(os.Environ(), "NEXUS_STATE_DIR=")
	var wout, werr bytes.Buffer
	waiting.Stdout, waiting.Stderr = &wout, &werr
	if err := waiting.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- waiting.Wait() }()
	waitUntil(t, "the waiting command connected", func() bool { return socketsOf(waiting.Process.Pid) > 0 })

	// A client connected before the failure, asking again after it.
	c, err := control.Dial(ctx, filepath.Join(root, wire.SocketName))
	if err != nil {
		t.Fatalf("dial the early daemon: %v\n%s", err, readLog())
	}
	defer c.Close()

	if err := syscall.Kill(pid, syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	var werrExit error
	select {
	case werrExit = <-done:
	case <-ctx.Done():
		t.Fatalf("the waiting command got no answer; daemon log:\n%s", readLog())
	}
	if code := exitCodeOf(werrExit); ctx.Err() != nil || code != 1 {
		t.Fatalf("the waiting command: exit %d (%v), stderr %q; daemon log:\n%s", code, werrExit, werr.String(), readLog())
	}
	refusedOneLine(t, result{1, wout.String(), werr.String()}, snap+" is a fifo")

	_, err = c.Status(ctx)
	var of *control.OpenFailedError
	if !errors.As(err, &of) || !strings.Contains(of.Text, snap+" is a fifo") {
		t.Fatalf("a request on a connection made before the failure: %v, want the open's error naming %s; daemon log:\n%s", err, snap, readLog())
	}
	c.Close()

	waitUntil(t, "the daemon whose open failed exited", func() bool { return len(daemonPids(root)) == 0 })
	if _, err := os.Lstat(filepath.Join(root, wire.SocketName)); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the socket is left behind: %v", err)
	}
	// The daemon's last line is the error it exited with (non-zero).
	lines := strings.Split(strings.TrimRight(readLog(), "\n"), "\n")
	if last := lines[len(lines)-1]; !strings.HasPrefix(last, "nexus: ") || !strings.Contains(last, snap+" is a fifo") {
		t.Fatalf("the daemon's log does not end with the error it exited with:\n%s", readLog())
	}

	refusedOneLine(t, bounded(t, root, "ls"), snap+" is a fifo")
	os.Remove(snap)
	mustOK(t, bounded(t, root, "ls"), "ls once the FIFO is gone")
}
