package sagalease

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/nexus-sandbox/nexus/host/fsx"
)

// A FIFO or link planted as an entity's lease file is an error at once:
// Acquire (run by every command and by recover for every open saga) never
// blocks on it and never creates or locks a file outside leases/.
func TestPlantedLeaseFileIsRefused(t *testing.T) {
	root, outside := t.TempDir(), t.TempDir()
	if err := os.MkdirAll(filepath.Join(root, Dir), 0o700); err != nil {
		t.Fatal(err)
	}
	fifo, link := "sandbox/FIFO", "sandbox/LINK"
	if err := syscall.Mkfifo(Path(root, fifo), 0o600); err != nil {
		t.Fatal(err)
	}
	target := filepath.Join(outside, "victim")
	if err := os.Symlink(target, Path(root, link)); err != nil {
		t.Fatal(err)
	}
	for entity, want := range map[string]error{fifo: fsx.ErrNotRegular, link: fsx.ErrSymlink} {
		if _, err := Acquire(context.Background(), root, entity, Holder{Kind: "start"}, false); !errors.Is(err, want) {
			t.Errorf("Acquire(%s) = %v, want %v", entity, err, want)
		}
	}
	if _, err := os.Lstat(target); !os.IsNotExist(err) {
		t.Fatalf("a lease was created outside leases/: %v", err)
	}
}
