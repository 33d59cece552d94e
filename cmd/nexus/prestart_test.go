package main

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/nexus-sandbox/nexus/internal/testutil"
)

// intentsOnDisk lists the create and shadow intents under disks/.
func intentsOnDisk(t *testing.T, root string) []string {
	t.Helper()
	entries, _ := os.ReadDir(filepath.Join(root, "disks"))
	var out []string
	for _, e := range entries {
		if strings.Contains(e.Name(), "-intent.json") {
			out = append(out, e.Name())
		}
	}
	return out
}

// handleFree asserts that the journal and the disk agree and that a new
// create of the handle succeeds, then removes it again.
func handleFree(t *testing.T, root, image, handle string) {
	t.Helper()
	if left := intentsOnDisk(t, root); len(left) > 0 {
		t.Fatalf("intents left: %v", left)
	}
	journalMatchesDisk(t, root)
	createJSON(t, root, "--image", image, "--handle", handle)
	mustOK(t, proc(t, root, "rm", "-f", handle), "rm")
}

// A create interrupted before its saga starts, or before the saga's
// first step journals its intents, leaves no intent behind: `replay diff`
// is empty and the handle is free at once.
func TestInterruptedCreateBeforeItsSagaLeavesNothing(t *testing.T) {
	testutil.StartsSandboxes(t)
	t.Parallel()
	image := makeImage(t)
	root := shortRoot(t)
	for _, at := range []string{"create.decided", "create.intents-published", "create.saga.started", "create.intents:before", "create.intents"} {
		p := pauseAt(t, root, at, "create", "--handle", "si", "--image", image)
		if code := p.resume(t, syscall.SIGINT); code != 130 {
			t.Fatalf("%s: interrupted create exited %d: %s", at, code, p.stderr.String())
		}
		t.Logf("%s: %s", at, strings.TrimSpace(p.stderr.String()))
		handleFree(t, root, image, "si")
	}
}

// A create killed between publishing its intents and journaling its
// saga's start leaves them leased by nobody; the next daemon removes them
// as it starts, and the handle is free.
func TestDaemonStartRemovesIntentsOfACreateThatNeverStarted(t *testing.T) {
	testutil.StartsSandboxes(t)
	t.Parallel()
	image := makeImage(t)
	root := shortRoot(t)
	r := nexusEnv(t, root, []string{"NEXUS_NO_AUTO_DAEMON=1", "NEXUS_CRASH_AT=create.intents-published"}, "--driver", "process", "create", "--image", image, "--handle", "si")
	if r.code != -1 {
		t.Fatalf("create was not killed at its step: exit %d %s", r.code, r.stderr)
	}
	if left := intentsOnDisk(t, root); len(left) != 2 {
		t.Fatalf("want the create and shadow intents the killed create left, got %v", left)
	}
	startDaemon(t, root)
	handleFree(t, root, image, "si")
}
