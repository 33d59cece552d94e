package main

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/nexus-sandbox/nexus/internal/testutil"
)

// runBounded runs cmd and fails the test if it has not ended within a
// generous deadline (a command that waits forever never ends here). It
// returns the exit code.
func runBounded(t *testing.T, cmd *exec.Cmd, what string) int {
	t.Helper()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	limit := testutil.Scale(2 * time.Minute)
	select {
	case err := <-done:
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			return ee.ExitCode()
		}
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		return 0
	case <-time.After(limit):
		cmd.Process.Kill()
		<-done
		t.Fatalf("%s still running after %v", what, limit)
		return -1
	}
}

// TestStoppedSpawnLockHolder: a real command stopped (as by Ctrl-Z) just
// after taking the daemon spawn lock. Another command says once, on
// stderr, which pid holds it and that it is stopped, and with a short
// NEXUS_SPAWN_WAIT gives up with exit 1 naming `kill -CONT <pid>`; one
// with the default bound waits, and once the holder resumes both it and
// the holder complete through one daemon. Without the bound the second
// command waited forever, saying nothing.
func TestStoppedSpawnLockHolder(t *testing.T) {
	root := shortRoot(t)
	holder := pauseAt(t, root, "daemon.spawn-lock", "ls")
	pid := holder.cmd.Process.Pid

	bound := testutil.Scale(5 * time.Second)
	bounded := exec.Command(nexusBin, "--state-dir", root, "ls")
	bounded.Env = append(os.Environ(), "NEXUS_STATE_DIR=", "NEXUS_SPAWN_WAIT="+bound.String())
	var stderr strings.Builder
	bounded.Stderr = &stderr
	if code := runBounded(t, bounded, "ls with NEXUS_SPAWN_WAIT="+bound.String()); code != 1 {
		t.Fatalf("ls beside a stopped spawn lock holder: exit %d, want 1; stderr:\n%s", code, stderr.String())
	}
	lines := strings.Split(strings.TrimSpace(stderr.String()), "\n")
	if len(lines) != 2 {
		t.Fatalf("stderr has %d lines, want a notice and an error:\n%s", len(lines), stderr.String())
	}
	held := fmt.Sprintf("by pid %d (%s --state-dir %s --driver process ls), stopped (Ctrl-Z or SIGSTOP)", pid, nexusBin, root)
	if !strings.HasPrefix(lines[0], "nexus: waiting for the daemon spawn lock") || !strings.Contains(lines[0], held) {
		t.Errorf("notice %q does not name the holder as %q", lines[0], held)
	}
	if !strings.Contains(lines[1], "still held after "+bound.String()+" "+held) || !strings.Contains(lines[1], fmt.Sprintf("`kill -CONT %d`", pid)) {
		t.Errorf("error %q does not name the holder as %q and say `kill -CONT %d`", lines[1], held, pid)
	}

	waiting := exec.Command(nexusBin, "--state-dir", root, "ls")
	waiting.Env = append(os.Environ(), "NEXUS_STATE_DIR=", "NEXUS_SPAWN_WAIT=")
	pipe, err := waiting.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	testutil.StartChild(t, waiting)
	rd := bufio.NewReader(pipe)
	if line, err := rd.ReadString('\n'); !strings.Contains(line, held) {
		t.Fatalf("waiting ls said %q, %v", line, err)
	}
	if code := holder.resume(t, 0); code != 0 {
		t.Fatalf("resumed holder: exit %d: %s", code, holder.stderr)
	}
	rest := make(chan string, 1)
	go func() {
		var b strings.Builder
		rd.WriteTo(&b)
		rest <- b.String()
	}()
	select {
	case s := <-rest:
		if err := waiting.Wait(); err != nil {
			t.Fatalf("waiting ls after the holder resumed: %v; stderr: %s", err, s)
		}
		if s != "" {
			t.Errorf("waiting ls said more than one line: %q", s)
		}
	case <-time.After(testutil.Scale(2 * time.Minute)):
		t.Fatal("waiting ls still running after the holder resumed and finished")
	}
	if pids := daemonPids(root); len(pids) != 1 {
		t.Fatalf("daemons running: %v", pids)
	}
}

// A bad NEXUS_SPAWN_WAIT is a usage error (exit 2, one line), before any
// daemon is started.
func TestSpawnWaitUsage(t *testing.T) {
	root := shortRoot(t)
	for _, v := range []string{"soon", "0s", "-1s"} {
		c := exec.Command(nexusBin, "--state-dir", root, "ls")
		c.Env = append(os.Environ(), "NEXUS_STATE_DIR=", "NEXUS_SPAWN_WAIT="+v)
		var stderr strings.Builder
		c.Stderr = &stderr
		if code := runBounded(t, c, "ls with NEXUS_SPAWN_WAIT="+v); code != 2 || strings.Count(stderr.String(), "\n") != 1 || !strings.Contains(stderr.String(), "NEXUS_SPAWN_WAIT") {
			t.Errorf("NEXUS_SPAWN_WAIT=%s: exit %d, stderr %q; want 2 and one line naming it", v, code, stderr.String())
		}
	}
	if pids := daemonPids(root); len(pids) != 0 {
		t.Fatalf("a refused command started a daemon: %v", pids)
	}
}
