package ledger

import (
	"errors"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/nexus-sandbox/nexus/host/fsx"
)

// A FIFO or link planted under a run file's name is refused at once: the
// append, the read of a list and the close never block and never write
// through the link.
func TestRunFilesRefusePlantedFIFOAndLink(t *testing.T) {
	dir, outside := t.TempDir(), t.TempDir()
	r := openRun(t, dir, "RUNP", "process", deadPid(t), 1)
	list := listPath(dir, "RUNP", Sandboxes)
	if err := os.Remove(list); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mkfifo(list, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := r.Add(Sandboxes, "01JABCDEFGHJKMNPQRSTVWXYZ0"); !errors.Is(err, fsx.ErrNotRegular) {
		t.Fatalf("Add to a FIFO list = %v, want ErrNotRegular", err)
	}
	if _, err := r.Names(Sandboxes); !errors.Is(err, fsx.ErrNotRegular) {
		t.Fatalf("Names of a FIFO list = %v, want ErrNotRegular", err)
	}
	victim := filepath.Join(outside, "victim")
	if err := os.WriteFile(victim, []byte("keep"), 0o600); err != nil {
		t.Fatal(err)
	}
	os.Remove(list)
	if err := os.Symlink(victim, list); err != nil {
		t.Fatal(err)
	}
	if err := r.Add(Sandboxes, "01JABCDEFGHJKMNPQRSTVWXYZ0"); !errors.Is(err, fsx.ErrSymlink) {
		t.Fatalf("Add through a linked list = %v, want ErrSymlink", err)
	}
	if data, _ := os.ReadFile(victim); string(data) != "keep" {
		t.Fatalf("the link's target was written: %q", data)
	}
}
