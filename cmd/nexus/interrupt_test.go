package main

import (
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nexus-sandbox/nexus/internal/testutil"
)

// Ctrl-C during a fork: the children already made are committed, kept and
// printed; the one in flight is undone; the message says so, and no
// transport error reaches the user.
func TestInterruptedForkReportsChildrenKept(t *testing.T) {
	testutil.StartsSandboxes(t)
	t.Parallel()
	root := shortRoot(t)
	parent := createJSON(t, root, "--image", makeImage(t))
	// Children are made concurrently: interrupted once the first commit is
	// journaled, that child (and any other that committed before the
	// interruption reached it) is kept and printed; the rest are undone.
	p := pauseAt(t, root, "fork.commit#1", "fork", parent.ID, "--count", "3")
	if code := p.resume(t, syscall.SIGINT); code != 130 {
		t.Fatalf("interrupted fork exited %d: %s", code, p.stderr.String())
	}
	var printed []string
	for _, line := range strings.Split(strings.TrimSpace(p.out.String()), "\n") {
		if f := strings.Fields(line); len(f) > 0 {
			printed = append(printed, f[0])
		}
	}
	if len(printed) < 1 || len(printed) > 3 {
		t.Fatalf("want the child made before the interruption printed, got %q", p.out.String())
	}
	msg := p.stderr.String()
	if !strings.Contains(msg, fmt.Sprintf("%d of 3 children made and kept", len(printed))) || strings.Contains(msg, "http://") {
		t.Fatalf("interruption message: %q", msg)
	}
	ids := map[string]bool{}
	for _, sb := range sandboxes(t, root) {
		ids[sb.ID] = true
	}
	if len(ids) != 1+len(printed) || !ids[parent.ID] {
		t.Fatalf("after the interruption: sandboxes %v, printed children %v", ids, printed)
	}
	for _, id := range printed {
		if !ids[id] {
			t.Fatalf("printed child %s is not a sandbox: %v", id, ids)
		}
	}
	if left := untracked(t, root); len(left) > 0 {
		t.Fatalf("the undone child left %v", left)
	}
}

// Ctrl-C of a command still waiting for another command's saga (--wait)
// ends it before its own saga starts: it says what it waited for, then
// that nothing was started, and exits 130.
func TestInterruptBeforeTheSagaStartsSaysSo(t *testing.T) {
	testutil.StartsSandboxes(t)
	t.Parallel()
	root := shortRoot(t)
	sb := createJSON(t, root, "--image", makeImage(t))
	mustOK(t, proc(t, root, "stop", sb.ID), "stop")
	p := pauseAt(t, root, "start.supervisor", "start", sb.ID)
	w := exec.Command(nexusBin, "--state-dir", root, "--driver", "process", "--wait", "stop", sb.ID)
	w.Env = append(os.Environ(), "NEXUS_STATE_DIR=")
	waiter := testutil.Start(t, w)
	waiter.WaitLog(t, time.Minute, "waiting for it to end (--wait)")
	w.Process.Signal(syscall.SIGINT)
	if code := waiter.Wait(t, testutil.Scale(time.Minute)); code != 130 {
		t.Fatalf("interrupted stop --wait exited %d: %s", code, waiter.Stderr.String())
	}
	lines := strings.Split(strings.TrimSpace(waiter.Stderr.String()), "\n")
	if last := lines[len(lines)-1]; !strings.HasPrefix(last, "nexus: stop: saga not started: interrupted") {
		t.Fatalf("interrupted stop --wait said %q, want that its saga never started", last)
	}
	if code := p.resume(t, 0); code != 0 {
		t.Fatalf("start exit %d: %s", code, p.stderr)
	}
}
