package lease

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/nexus-sandbox/nexus/host/fsx"
)

// A link or FIFO planted under a lease's name (journal/LOCK, images/.lease,
// volumes/<v>/.lock) is refused at once: never followed out of its
// directory, never a blocking open.
func TestLeaseRefusesPlantedFiles(t *testing.T) {
	dir, outside := t.TempDir(), t.TempDir()
	target := filepath.Join(outside, "victim")
	if err := os.Symlink(target, filepath.Join(dir, "link")); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mkfifo(filepath.Join(dir, "fifo"), 0o600); err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string]error{"link": fsx.ErrSymlink, "fifo": fsx.ErrNotRegular} {
		if _, err := TryAcquire(filepath.Join(dir, name)); !errors.Is(err, want) {
			t.Errorf("TryAcquire(%s) = %v, want %v", name, err, want)
		}
		ctx := t.Context()
		if _, err := AcquireShared(ctx, filepath.Join(dir, name)); !errors.Is(err, want) {
			t.Errorf("AcquireShared(%s) = %v, want %v", name, err, want)
		}
		if pid := Holder(filepath.Join(dir, name)); pid != 0 {
			t.Errorf("Holder(%s) = %d", name, pid)
		}
	}
	if _, err := os.Lstat(target); !os.IsNotExist(err) {
		t.Fatalf("a lease created the link's target outside its directory: %v", err)
	}
	l, err := TryAcquire(filepath.Join(dir, "ok"))
	if err != nil {
		t.Fatal(err)
	}
	if Holder(filepath.Join(dir, "ok")) != os.Getpid() {
		t.Fatal("holder pid not recorded")
	}
	l.Release()
}

// A lease is free the moment it is released, even while a process this one
// started still holds a copy of its descriptor: the window between a
// fork and its exec, here held open for as long as a real child lives
// (the copy passed to it, sharing the open file description as a forked
// child's does). Closing alone would leave the flock held until the child
// ends, and the next command would see the lease busy.
func TestReleaseWhileAChildHoldsTheDescriptor(t *testing.T) {
	path := filepath.Join(t.TempDir(), "x.lease")
	l, err := TryAcquire(path)
	if err != nil {
		t.Fatal(err)
	}
	child := exec.Command("sleep", "60")
	child.ExtraFiles = []*os.File{l.f}
	if err := child.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { child.Process.Kill(); child.Wait() }()
	if err := l.Release(); err != nil {
		t.Fatal(err)
	}
	next, err := TryAcquire(path)
	if err != nil {
		t.Fatalf("lease still held after Release while a child holds a copy of its descriptor: %v", err)
	}
	next.Release()
}
