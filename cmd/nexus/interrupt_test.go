package main

import (
	"strings"
	"syscall"
	"testing"
)

// Ctrl-C during a fork: the children already made are committed, kept and
// printed; the one in flight is undone; the message says so, and no
// transport error reaches the user.
func TestInterruptedForkReportsChildrenKept(t *testing.T) {
	t.Parallel()
	root := shortRoot(t)
	parent := createJSON(t, root, "--image", makeImage(t))
	p := pauseAt(t, root, "fork.os-disk#2", "fork", parent.ID, "--count", "3")
	if code := p.resume(t, syscall.SIGINT); code != 130 {
		t.Fatalf("interrupted fork exited %d: %s", code, p.stderr.String())
	}
	printed := strings.Fields(p.out.String())
	if len(printed) < 1 {
		t.Fatalf("the child made before the interruption was not printed: %q", p.out.String())
	}
	msg := p.stderr.String()
	if !strings.Contains(msg, "1 of 3 children made and kept") || strings.Contains(msg, "http://") {
		t.Fatalf("interruption message: %q", msg)
	}
	ids := map[string]bool{}
	for _, sb := range sandboxes(t, root) {
		ids[sb.ID] = true
	}
	if len(ids) != 2 || !ids[parent.ID] || !ids[printed[0]] {
		t.Fatalf("after the interruption: sandboxes %v, printed child %s", ids, printed[0])
	}
	if left := untracked(t, root); len(left) > 0 {
		t.Fatalf("the undone child left %v", left)
	}
}
