package supervisor

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"testing"

	"github.com/nexus-sandbox/nexus/host/lease"
)

func mode(t *testing.T, path string) fs.FileMode {
	t.Helper()
	fi, err := os.Lstat(path)
	if err != nil {
		t.Fatal(err)
	}
	return fi.Mode().Perm()
}

func TestEnsureStateDirCreates0700(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "supervisors", "S1")
	if err := EnsureStateDir(dir); err != nil {
		t.Fatal(err)
	}
	if m := mode(t, dir); m != 0o700 {
		t.Fatalf("mode %v, want 0700", m)
	}
	// Idempotent.
	if err := EnsureStateDir(dir); err != nil {
		t.Fatal(err)
	}
}

func TestEnsureStateDirTightensExistingAndLeavesParent(t *testing.T) {
	parent := filepath.Join(t.TempDir(), "supervisors")
	dir := filepath.Join(parent, "S1")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	// Chmod explicitly: the umask may have narrowed MkdirAll's mode.
	for _, p := range []string{parent, dir} {
		if err := os.Chmod(p, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := EnsureStateDir(dir); err != nil {
		t.Fatal(err)
	}
	if m := mode(t, dir); m != 0o700 {
		t.Fatalf("state dir mode %v, want 0700", m)
	}
	if m := mode(t, parent); m != 0o755 {
		t.Fatalf("parent mode %v, want untouched 0755", m)
	}
}

func TestEnsureStateDirRefusesSymlink(t *testing.T) {
	root := t.TempDir()
	target := filepath.Join(root, "elsewhere")
	if err := os.Mkdir(target, 0o755); err != nil {
		t.Fatal(err)
	}
	os.Chmod(target, 0o755)
	link := filepath.Join(root, "S1")
	if err := os.Symlink(target, link); err != nil {
		t.Fatal(err)
	}
	err := EnsureStateDir(link)
	if !errors.Is(err, ErrSymlink) {
		t.Fatalf("err = %v, want ErrSymlink", err)
	}
	if m := mode(t, target); m != 0o755 {
		t.Fatalf("symlink target mode changed to %v", m)
	}
	// A dangling link too: MkdirAll must not create its target.
	dangling := filepath.Join(root, "S2")
	os.Symlink(filepath.Join(root, "nowhere"), dangling)
	if err := EnsureStateDir(dangling); !errors.Is(err, ErrSymlink) {
		t.Fatalf("dangling: err = %v, want ErrSymlink", err)
	}
	if _, err := os.Lstat(filepath.Join(root, "nowhere")); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("dangling link target was created")
	}
}

func TestEnsureStateDirRefusesFile(t *testing.T) {
	p := filepath.Join(t.TempDir(), "S1")
	os.WriteFile(p, nil, 0o600)
	if err := EnsureStateDir(p); err == nil {
		t.Fatal("EnsureStateDir on a regular file succeeded")
	}
}

func TestRemoveStateDir(t *testing.T) {
	root := t.TempDir()
	dir := filepath.Join(root, "S1")
	if err := RemoveStateDir(dir); err != nil {
		t.Fatalf("missing dir: %v", err)
	}
	if err := EnsureStateDir(dir); err != nil {
		t.Fatal(err)
	}
	ca, err := MintCA("S1", timeNow())
	if err != nil {
		t.Fatal(err)
	}
	if err := SaveCA(dir, ca); err != nil {
		t.Fatal(err)
	}

	// While a supervisor holds the lease the CA must not vanish under it.
	l, err := lease.TryAcquire(filepath.Join(dir, lockName))
	if err != nil {
		t.Fatal(err)
	}
	if err := RemoveStateDir(dir); !errors.Is(err, ErrAlreadyRunning) {
		t.Fatalf("held lease: err = %v, want ErrAlreadyRunning", err)
	}
	if _, err := os.Stat(filepath.Join(dir, CAFileName)); err != nil {
		t.Fatalf("CA removed despite refusal: %v", err)
	}
	l.Release()

	if err := RemoveStateDir(dir); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(dir); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("dir still there: %v", err)
	}
	if err := RemoveStateDir(dir); err != nil {
		t.Fatalf("second remove: %v", err)
	}
}

func TestRemoveStateDirRefusesSymlink(t *testing.T) {
	root := t.TempDir()
	target := filepath.Join(root, "precious")
	os.Mkdir(target, 0o700)
	keep := filepath.Join(target, "keep")
	os.WriteFile(keep, []byte("x"), 0o600)
	link := filepath.Join(root, "S1")
	os.Symlink(target, link)
	if err := RemoveStateDir(link); !errors.Is(err, ErrSymlink) {
		t.Fatalf("err = %v, want ErrSymlink", err)
	}
	if _, err := os.Stat(keep); err != nil {
		t.Fatalf("symlink target damaged: %v", err)
	}
	if _, err := os.Lstat(link); err != nil {
		t.Fatalf("link removed: %v", err)
	}
}
