// Package smallfs mounts small, real filesystems for tests that need a
// disk to run out of space: a loop-mounted ext4 image, filled to a chosen
// number of free bytes with fallocate.
package smallfs

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// Mount makes an ext4 image of size bytes (no blocks reserved for root, so
// root sees ENOSPC where everyone else does), loop-mounts it on a fresh
// directory and returns that directory; the test's cleanup unmounts it.
// Without root, or where loop mounts are unavailable, it skips the test
// and says so in capitals.
func Mount(t testing.TB, size int64) string {
	t.Helper()
	return mount(t, size, "mkfs.ext4", "-q", "-F", "-m", "0")
}

// MountXFS is Mount with an XFS filesystem made with reflink=1, so FICLONE
// shares extents there (XFS needs at least 300 MiB). Without mkfs.xfs
// (xfsprogs) it skips the test and says so in capitals.
func MountXFS(t testing.TB, size int64) string {
	t.Helper()
	return mount(t, max(size, 300<<20), "mkfs.xfs", "-q", "-f", "-m", "reflink=1")
}

// installedBy names the make target that installs each mkfs this package runs.
var installedBy = map[string]string{
	"mkfs.ext4": "make setup installs e2fsprogs",
	"mkfs.xfs":  "make setup-test installs xfsprogs",
}

func mount(t testing.TB, size int64, mkfs ...string) string {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("SKIPPED: a real full filesystem needs root to loop-mount one; this test did not run")
	}
	dir := t.TempDir()
	img := filepath.Join(dir, "fs.img")
	mnt := filepath.Join(dir, "mnt")
	if err := os.Mkdir(mnt, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(img, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(img, size); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(mkfs[0], append(mkfs[1:], img)...).CombinedOutput(); err != nil {
		t.Skipf("SKIPPED: %s is unavailable (%v: %s; %s); this test did not run", mkfs[0], err, strings.TrimSpace(string(out)), installedBy[mkfs[0]])
	}
	if out, err := exec.Command("mount", "-o", "loop", img, mnt).CombinedOutput(); err != nil {
		t.Skipf("SKIPPED: loop mounts are unavailable here (%v: %s); this test did not run", err, strings.TrimSpace(string(out)))
	}
	t.Cleanup(func() {
		if out, err := exec.Command("umount", mnt).CombinedOutput(); err != nil {
			// A process the test left behind may still hold a file open.
			exec.Command("umount", "-l", mnt).Run()
			t.Logf("umount %s: %v %s (lazily unmounted)", mnt, err, out)
		}
	})
	if err := os.Chmod(mnt, 0o700); err != nil {
		t.Fatal(err)
	}
	return mnt
}

// Free is the space available to unprivileged writers under dir.
func Free(t testing.TB, dir string) int64 {
	t.Helper()
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		t.Fatal(err)
	}
	unit := st.Frsize
	if unit == 0 {
		unit = st.Bsize
	}
	return int64(st.Bavail) * unit
}

// Fill allocates a file under dir so that about leave bytes stay free
// (never more; a few blocks fewer, for the file's own metadata), and
// returns its path: remove it to free the space again. leave 0 fills the
// filesystem completely.
func Fill(t testing.TB, dir string, leave int64) string {
	t.Helper()
	f, err := os.CreateTemp(dir, "filler-*")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	const chunk = 1 << 20
	var off int64
	// Allocate in chunks until the target is reached, then block by block:
	// one fallocate of the whole free space fails, as the extent tree needs
	// blocks of its own.
	for step := int64(chunk); step >= 4096; step /= 2 {
		for Free(t, dir)-step >= leave {
			if err := unix.Fallocate(int(f.Fd()), 0, off, step); err != nil {
				break
			}
			off += step
		}
	}
	if leave == 0 {
		buf := make([]byte, 4096)
		for {
			if _, err := f.WriteAt(buf, off); err != nil {
				break
			}
			off += int64(len(buf))
		}
	}
	if err := f.Sync(); err != nil && leave > 0 {
		t.Fatal(err)
	}
	return f.Name()
}
