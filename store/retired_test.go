package store

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/oklog/ulid/v2"
)

// A root written by a build that still kept the ownership view, or the
// sandboxes as a whole snapshot, opens as before, and those snapshots go
// with the next snapshot write instead of lingering as files nothing reads
// or accounts for.
func TestRetiredSnapshotsAreRemoved(t *testing.T) {
	root := t.TempDir()
	n, err := Open(context.Background(), root, Options{})
	if err != nil {
		t.Fatal(err)
	}
	sb := ulid.Make().String()
	if _, err := n.Append(context.Background(), created(sb)); err != nil {
		t.Fatal(err)
	}
	if err := n.Close(); err != nil {
		t.Fatal(err)
	}
	// As an older build left it: whole snapshots, no sandbox store.
	if err := os.Remove(filepath.Join(root, "projections", storeFile)); err != nil {
		t.Fatal(err)
	}
	for _, name := range retiredSnaps {
		if err := os.WriteFile(filepath.Join(root, "projections", name), []byte("an older build's snapshot"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	n, err = Open(context.Background(), root, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if err := n.Close(); err != nil {
		t.Fatal(err)
	}
	for _, name := range retiredSnaps {
		if _, err := os.Stat(filepath.Join(root, "projections", name)); !os.IsNotExist(err) {
			t.Fatalf("the retired %s is still there after a snapshot write: %v", name, err)
		}
	}
	for _, name := range []string{"sagas.snap", "volumes.snap", "imagecache.snap", storeFile} {
		if _, err := os.Stat(filepath.Join(root, "projections", name)); err != nil {
			t.Fatalf("%s not written: %v", name, err)
		}
	}
	n, err = Open(context.Background(), root, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	n.View(func(v Views) {
		if got, err := v.Sandbox(sb); err != nil || got == nil {
			t.Fatalf("sandbox %s lost across the reopen: %v", sb, err)
		}
	})
}
