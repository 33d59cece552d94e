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

// Ctrl-C before a command has reached the state root (here while it
// holds the spawn lock, starting the daemon) says that nothing was done,
// not a bare "context canceled".
func TestInterruptWhileConnectingSaysNothingWasDone(t *testing.T) {
	t.Parallel()
	root := shortRoot(t)
	stopDaemonsAtEnd(t, root)
	p := pauseAt(t, root, "daemon.spawn-lock", "stop", "nosuch")
	if code := p.resume(t, syscall.SIGINT); code != 130 {
		t.Fatalf("interrupted stop exited %d: %s", code, p.stderr.String())
	}
	if msg := p.stderr.String(); !strings.Contains(msg, "interrupted by interrupt while reaching the state root") ||
		!strings.Contains(msg, "nothing was done") || strings.Contains(msg, "context canceled") {
		t.Fatalf("interrupted while connecting, stop said %q", msg)
	}
}

// Ctrl-C of reap while it reads the journal is an interruption with
// nothing deleted, not a journal that "cannot be fully read"; no report
// is printed, since nothing was judged.
func TestInterruptedReapSaysInterrupted(t *testing.T) {
	testutil.StartsSandboxes(t)
	t.Parallel()
	root := shortRoot(t)
	createJSON(t, root, "--image", makeImage(t))
	for _, args := range [][]string{{"reap"}, {"reap", "--apply"}} {
		p := pauseAt(t, root, "reap.observe-leases", args...)
		if code := p.resume(t, syscall.SIGINT); code != 130 {
			t.Fatalf("interrupted %v exited %d: %s", args, code, p.stderr.String())
		}
		msg := p.stderr.String()
		if !strings.Contains(msg, "reap: saga not started: interrupted") || strings.Contains(msg, "cannot be fully read") {
			t.Fatalf("interrupted %v said %q", args, msg)
		}
		if p.out.String() != "" {
			t.Fatalf("interrupted %v printed a report: %q", args, p.out.String())
		}
	}
}

// Ctrl-C of a recover that is finishing an interrupted rm: the rm only
// goes forward, so it runs to its end (the sandbox is gone) and is never
// closed as "compensated" with nothing undone; recover says what it
// finished.
func TestInterruptedRecoverFinishesAForwardSaga(t *testing.T) {
	testutil.StartsSandboxes(t)
	t.Parallel()
	root := shortRoot(t)
	sb := createJSON(t, root, "--image", makeImage(t))
	crashAt(t, root, "rm.vmm-stop", "rm", "-f", sb.ID)
	p := pauseAt(t, root, "rm.reclaim", "recover")
	code := p.resume(t, syscall.SIGINT)
	msg := p.stderr.String()
	if strings.Contains(msg, "saga compensated") {
		t.Fatalf("interrupted recover closed the forward rm as compensated: %q", msg)
	}
	if code != 0 && !strings.Contains(msg, "recover: interrupted by interrupt after 1 saga(s) resumed") {
		t.Fatalf("interrupted recover exited %d: %q", code, msg)
	}
	if list := sandboxes(t, root); len(list) != 0 {
		t.Fatalf("the resumed rm did not finish: %+v (recover said %q)", list, msg)
	}
	recoverClean(t, root)
}
