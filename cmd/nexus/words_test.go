package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/nexus-sandbox/nexus/internal/testutil"
)

// A stopped daemon is named as what it is, at once: its pid, that it is
// stopped, and the way to resume it.
func TestStoppedDaemonIsNamed(t *testing.T) {
	t.Parallel()
	root := shortRoot(t)
	d := startDaemon(t, root)
	pid := d.Cmd.Process.Pid
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { syscall.Kill(pid, syscall.SIGCONT) })
	waitStopped(t, pid)
	r := nexus(t, root, "ls")
	wantFailure(t, r, 1, fmt.Sprintf("kill -CONT %d", pid))
	if !strings.Contains(r.stderr, fmt.Sprintf("(pid %d) is stopped", pid)) {
		t.Fatalf("the error does not say the daemon is stopped: %q", r.stderr)
	}
	syscall.Kill(pid, syscall.SIGCONT)
	mustOK(t, nexus(t, root, "ls"), "ls after SIGCONT")
}

// What sits where nexus expects its own file is named as what it is: a
// FIFO at a sandbox's VMM log is "not a regular file", and a symlink at a
// shadow intent is a link, not another create in flight.
func TestPlantedFilesAreNamedAsWhatTheyAre(t *testing.T) {
	testutil.StartsSandboxes(t)
	t.Parallel()
	root := shortRoot(t)
	image := makeImage(t)
	sb := createJSON(t, root, "--image", image)
	mustOK(t, proc(t, root, "stop", sb.ID), "stop")
	log := filepath.Join(root, "logs", sb.ID+".vmm.log")
	if err := os.Remove(log); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mkfifo(log, 0o600); err != nil {
		t.Fatal(err)
	}
	wantFailure(t, proc(t, root, "start", sb.ID), 1, "is a fifo: not a regular file")

	intent := filepath.Join(root, "disks", "si.shadow-intent.json")
	if err := os.Symlink(filepath.Join(t.TempDir(), "elsewhere"), intent); err != nil {
		t.Fatal(err)
	}
	r := proc(t, root, "create", "--image", image, "--handle", "si")
	wantFailure(t, r, 1, "symbolic link")
	if strings.Contains(r.stderr, "in flight") {
		t.Fatalf("a planted link reads as a create in flight: %q", r.stderr)
	}
}
