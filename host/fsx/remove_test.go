package fsx

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
)

func TestRemoveNeverFollowsSymlinks(t *testing.T) {
	root, outside := t.TempDir(), t.TempDir()
	victim := filepath.Join(outside, "precious")
	os.WriteFile(victim, []byte("keep me"), 0o600)
	os.MkdirAll(filepath.Join(outside, "dir"), 0o700)
	os.WriteFile(filepath.Join(outside, "dir", "inner"), []byte("keep me too"), 0o600)

	os.MkdirAll(filepath.Join(root, "disks"), 0o700)
	os.Symlink(victim, filepath.Join(root, "disks", "x.raw"))                   // the resource is a link
	os.Symlink(filepath.Join(outside, "dir"), filepath.Join(root, "snapshots")) // a parent is a link
	os.MkdirAll(filepath.Join(root, "supervisors", "A"), 0o700)
	os.Symlink(victim, filepath.Join(root, "supervisors", "A", "link")) // a link inside a tree
	os.Symlink(filepath.Join(outside, "dir"), filepath.Join(root, "supervisors", "A", "dirlink"))

	if err := Remove(root, "disks/x.raw"); !errors.Is(err, ErrSymlink) {
		t.Fatalf("Remove(link) = %v, want ErrSymlink", err)
	}
	if err := Remove(root, "snapshots/inner"); !errors.Is(err, ErrSymlink) {
		t.Fatalf("Remove through linked parent = %v, want ErrSymlink", err)
	}
	if err := Remove(root, "supervisors/A"); err != nil {
		t.Fatalf("Remove(tree with links) = %v", err)
	}
	if _, err := os.Lstat(filepath.Join(root, "supervisors", "A")); !os.IsNotExist(err) {
		t.Fatal("tree not removed")
	}
	for _, p := range []string{victim, filepath.Join(outside, "dir", "inner")} {
		if data, err := os.ReadFile(p); err != nil || len(data) == 0 {
			t.Fatalf("%s outside the root was touched: %v", p, err)
		}
	}
	for _, bad := range []string{"../x", "/etc/passwd", ".", ""} {
		if err := Remove(root, bad); err == nil {
			t.Errorf("Remove(%q) succeeded", bad)
		}
	}
}

func TestRemoveFilesAndMissing(t *testing.T) {
	root := t.TempDir()
	os.MkdirAll(filepath.Join(root, "disks"), 0o700)
	os.WriteFile(filepath.Join(root, "disks", "a.raw"), nil, 0o600)
	if ok, _ := Lexists(root, "disks/a.raw"); !ok {
		t.Fatal("Lexists false for a file")
	}
	if err := Remove(root, "disks/a.raw"); err != nil {
		t.Fatal(err)
	}
	if ok, _ := Lexists(root, "disks/a.raw"); ok {
		t.Fatal("file survived Remove")
	}
	if err := Remove(root, "disks/a.raw"); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("second Remove = %v, want ErrNotExist", err)
	}
	if err := Remove(root, "nodir/a.raw"); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("Remove under a missing dir = %v", err)
	}
}

func TestEnsureDirRefusesSymlinks(t *testing.T) {
	root := t.TempDir()
	if err := EnsureDir(root, "disks"); err != nil {
		t.Fatal(err)
	}
	os.Symlink(t.TempDir(), filepath.Join(root, "run"))
	if err := EnsureDir(root, "run"); !errors.Is(err, ErrSymlink) {
		t.Fatalf("EnsureDir(linked) = %v", err)
	}
}

func TestEnsureFileRefusesSymlinksAndKeepsContent(t *testing.T) {
	root := t.TempDir()
	os.Mkdir(filepath.Join(root, "logs"), 0o700)
	outside := filepath.Join(t.TempDir(), "target")
	os.WriteFile(outside, []byte("outside"), 0o600)
	os.Symlink(outside, filepath.Join(root, "logs", "link.log"))
	if err := EnsureFile(root, "logs/link.log", 0o600); !errors.Is(err, ErrSymlink) {
		t.Fatalf("symlink in place: %v", err)
	}
	os.Symlink(filepath.Dir(outside), filepath.Join(root, "dirlink"))
	if err := EnsureFile(root, "dirlink/new.log", 0o600); !errors.Is(err, ErrSymlink) {
		t.Fatalf("symlinked parent: %v", err)
	}
	if _, err := os.Stat(filepath.Join(filepath.Dir(outside), "new.log")); !os.IsNotExist(err) {
		t.Fatal("created a file through a symlinked parent")
	}
	if err := EnsureFile(root, "logs/a.log", 0o600); err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(root, "logs", "a.log"), []byte("kept"), 0o600)
	if err := EnsureFile(root, "logs/a.log", 0o600); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(filepath.Join(root, "logs", "a.log")); string(b) != "kept" {
		t.Fatalf("content %q", b)
	}
	if fi, _ := os.Stat(filepath.Join(root, "logs", "a.log")); fi.Mode().Perm() != 0o600 {
		t.Fatalf("mode %v", fi.Mode())
	}
	os.Mkdir(filepath.Join(root, "logs", "d.log"), 0o700)
	if err := EnsureFile(root, "logs/d.log", 0o600); err == nil {
		t.Fatal("a directory accepted")
	}
	if b, _ := os.ReadFile(outside); string(b) != "outside" {
		t.Fatal("outside file changed")
	}
}

// EnsureFiles makes every path it is given, in more than one directory,
// and refuses a link among them as EnsureFile does, keeping what it made
// before it.
func TestEnsureFilesMakesEachAndRefusesALink(t *testing.T) {
	root := t.TempDir()
	os.Mkdir(filepath.Join(root, "logs"), 0o700)
	os.Mkdir(filepath.Join(root, "run"), 0o700)
	if err := EnsureFiles(root, []string{"logs/a.log", "run/b", "logs/c.log"}, 0o600); err != nil {
		t.Fatal(err)
	}
	for _, rel := range []string{"logs/a.log", "run/b", "logs/c.log"} {
		if fi, err := os.Lstat(filepath.Join(root, rel)); err != nil || !fi.Mode().IsRegular() || fi.Mode().Perm() != 0o600 {
			t.Fatalf("%s: %v %v", rel, fi, err)
		}
	}
	os.Symlink(filepath.Join(t.TempDir(), "target"), filepath.Join(root, "logs", "link.log"))
	if err := EnsureFiles(root, []string{"logs/d.log", "logs/link.log"}, 0o600); !errors.Is(err, ErrSymlink) {
		t.Fatalf("a link among them: %v", err)
	}
	if _, err := os.Stat(filepath.Join(root, "logs", "d.log")); err != nil {
		t.Fatalf("the file made before the link: %v", err)
	}
}
