package standin

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// A killed VMM cannot remove its stand-in guest root; the next one to
// start does, and leaves alone the roots of VMMs that still run.
func TestSweepGuestRootsOfDeadVMMs(t *testing.T) {
	tmp := t.TempDir()
	t.Setenv("TMPDIR", tmp)
	dead := exec.Command("true")
	if err := dead.Run(); err != nil {
		t.Fatal(err)
	}
	gone := filepath.Join(tmp, fmt.Sprintf("%s%d-1", guestRootPrefix, dead.Process.Pid))
	live := filepath.Join(tmp, fmt.Sprintf("%s%d-2", guestRootPrefix, os.Getpid()))
	other := filepath.Join(tmp, guestRootPrefix+"notapid")
	for _, d := range []string{gone, live, other} {
		if err := os.MkdirAll(filepath.Join(d, "workspace"), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	sweepGuestRoots()
	if _, err := os.Stat(gone); !os.IsNotExist(err) {
		t.Errorf("the root of a dead VMM was kept: %v", err)
	}
	for _, d := range []string{live, other} {
		if _, err := os.Stat(d); err != nil {
			t.Errorf("%s was removed: %v", d, err)
		}
	}
}
