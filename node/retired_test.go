package node

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/oklog/ulid/v2"
)

// A root written by a build that still kept the ownership view opens as
// before, and its ownership snapshot goes with the next snapshot write
// instead of lingering as a file nothing reads or accounts for.
func TestRetiredOwnershipSnapshotIsRemoved(t *testing.T) {
	root := t.TempDir()
	n, err := Open(context.Background(), root, Options{})
	if err != nil {
		t.Fatal(err)
	}
	sb := ulid.Make().String()
	if _, err := n.Append(context.Background(), created(sb)); err != nil {
		t.Fatal(err)
	}
	stale := filepath.Join(root, "projections", retiredOwnershipSnap)
	if err := os.MkdirAll(filepath.Dir(stale), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(stale, []byte("an older build's ownership view"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := n.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(stale); !os.IsNotExist(err) {
		t.Fatalf("the retired ownership snapshot is still there after a snapshot write: %v", err)
	}
	for _, v := range []string{"sandboxes", "sagas", "volumes", "imagecache"} {
		if _, err := os.Stat(filepath.Join(root, "projections", v+".snap")); err != nil {
			t.Fatalf("snapshot of %s not written: %v", v, err)
		}
	}
	n, err = Open(context.Background(), root, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	n.View(func(v Views) {
		if v.Sandboxes.Get(sb) == nil {
			t.Fatalf("sandbox %s lost across the reopen", sb)
		}
	})
}
