package fsx

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
)

func TestBatchNeverFollowsSymlinks(t *testing.T) {
	root, outside := t.TempDir(), t.TempDir()
	victim := filepath.Join(outside, "precious")
	os.WriteFile(victim, []byte("keep me"), 0o600)
	os.MkdirAll(filepath.Join(outside, "dir"), 0o700)
	os.WriteFile(filepath.Join(outside, "dir", "inner"), []byte("keep me too"), 0o600)
	os.MkdirAll(filepath.Join(root, "disks"), 0o700)
	os.Symlink(victim, filepath.Join(root, "disks", "x.raw"))
	os.Symlink(filepath.Join(outside, "dir"), filepath.Join(root, "snapshots"))
	os.MkdirAll(filepath.Join(root, "supervisors", "A"), 0o700)
	os.Symlink(victim, filepath.Join(root, "supervisors", "A", "link"))
	os.Symlink(filepath.Join(outside, "dir"), filepath.Join(root, "supervisors", "A", "dirlink"))
	os.WriteFile(filepath.Join(root, "disks", "y.raw"), []byte("orphan"), 0o600)

	b, err := NewBatch(root)
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Remove("disks/x.raw"); !errors.Is(err, ErrSymlink) {
		t.Fatalf("Remove(link) = %v, want ErrSymlink", err)
	}
	if err := b.Remove("snapshots/inner"); !errors.Is(err, ErrSymlink) {
		t.Fatalf("Remove through a linked parent = %v, want ErrSymlink", err)
	}
	if err := b.Remove("../escape"); !errors.Is(err, ErrEscapes) {
		t.Fatalf("Remove(../escape) = %v, want ErrEscapes", err)
	}
	for _, rel := range []string{"supervisors/A", "disks/y.raw"} {
		if err := b.Remove(rel); err != nil {
			t.Fatalf("Remove(%s) = %v", rel, err)
		}
		if still, err := b.Exists(rel); still || err != nil {
			t.Fatalf("%s still exists after Remove (%v)", rel, err)
		}
	}
	if err := b.Remove("disks/y.raw"); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("second Remove = %v, want ErrNotExist", err)
	}
	// A file that became a directory since the scan is removed as a tree;
	// one that became a link loses the link, never the target.
	os.MkdirAll(filepath.Join(root, "disks", "was-file"), 0o700)
	os.WriteFile(filepath.Join(root, "disks", "was-file", "x"), nil, 0o600)
	os.Symlink(victim, filepath.Join(root, "disks", "became-link"))
	for _, rel := range []string{"disks/was-file", "disks/became-link"} {
		if err := b.RemoveFile(rel); err != nil {
			t.Fatalf("RemoveFile(%s) = %v", rel, err)
		}
		if still, _ := b.Exists(rel); still {
			t.Fatalf("%s survived RemoveFile", rel)
		}
	}
	if err := b.RemoveFile("snapshots/inner"); !errors.Is(err, ErrSymlink) {
		t.Fatalf("RemoveFile through a linked parent = %v", err)
	}
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{victim, filepath.Join(outside, "dir", "inner")} {
		if data, err := os.ReadFile(p); err != nil || len(data) == 0 {
			t.Fatalf("%s outside the root was touched: %v", p, err)
		}
	}
	if _, err := os.Lstat(filepath.Join(root, "disks", "x.raw")); err != nil {
		t.Fatal("the refused link itself was removed")
	}
}
