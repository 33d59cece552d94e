package disk_test

import (
	"bytes"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/nexus-sandbox/nexus/host/disk"
	"github.com/nexus-sandbox/nexus/host/smallfs"
)

// readBytes is rchar of this process: every byte read(2)/pread(2) returned.
func readBytes(t *testing.T) int64 {
	t.Helper()
	data, err := os.ReadFile("/proc/self/io")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(data), "\n") {
		if v, ok := strings.CutPrefix(line, "rchar: "); ok {
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil {
				t.Fatal(err)
			}
			return n
		}
	}
	t.Fatal("no rchar in /proc/self/io")
	return 0
}

// TestCloneEachReadsOnce: two copies from one pass over the source, each
// equal to it and as sparse as cp's; the source's data is read once, not
// once per copy (a cache miss makes the entry and the sandbox disk so).
func TestCloneEachReadsOnce(t *testing.T) {
	dir := t.TempDir()
	// More data than one writeback window, spread over holes; each copy
	// is hashed whole, holes too, so the image is kept small.
	const data = 14 * MiB // written zeros are data to SEEK_DATA, and are read
	src := makeImage(t, filepath.Join(dir, "src.raw"), 96*MiB, []span{
		{off: 0, len: 4 * MiB}, {off: 40 * MiB, len: 4 * MiB}, {off: 80 * MiB, len: 4 * MiB},
		{off: 50 * MiB, len: 2 * MiB, zeros: true},
	}, 11)
	a, b := filepath.Join(dir, "a.raw"), filepath.Join(dir, "b.raw")
	before := readBytes(t)
	methods, err := disk.CloneEach(src, []string{a, b}, nil)
	if err != nil {
		t.Fatal(err)
	}
	read := readBytes(t) - before
	if len(methods) != 2 || methods[0] != methods[1] {
		t.Fatalf("methods %v", methods)
	}
	if methods[0] == disk.MethodSparseCopy && (read < data || read > data+data/2) {
		t.Fatalf("read %d bytes of the source for two copies of %d bytes of data: want it read once", read, data)
	}
	cp := filepath.Join(dir, "cp.raw")
	cpSparse(t, src, cp)
	want := sha(t, src)
	for _, dst := range []string{a, b} {
		if sha(t, dst) != want {
			t.Fatalf("%s differs from the source", dst)
		}
		if allocated(t, dst) > allocated(t, cp) {
			t.Fatalf("%s allocates %d bytes, cp --sparse=always %d", dst, allocated(t, dst), allocated(t, cp))
		}
		if st := rawStat(t, dst); st.Mode&0o777 != 0o600 {
			t.Fatalf("%s mode %o", dst, st.Mode&0o777)
		}
	}
	t.Logf("method %s, read %d bytes for %d of data", methods[0], read, data)
}

// TestCloneEachFailureRemovesEveryCopy: one destination that cannot be
// made (already there; out of space) fails the clone and leaves none of
// the copies it made, and never touches a file that was there before.
func TestCloneEachFailureRemovesEveryCopy(t *testing.T) {
	dir := t.TempDir()
	src := makeImage(t, filepath.Join(dir, "src.raw"), 8*MiB, []span{{off: 0, len: 8 * MiB}}, 5)

	a, taken := filepath.Join(dir, "a.raw"), filepath.Join(dir, "taken.raw")
	if err := os.WriteFile(taken, []byte("someone else's"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := disk.CloneEach(src, []string{a, taken}, nil); !errors.Is(err, fs.ErrExist) {
		t.Fatalf("err = %v, want ErrExist", err)
	}
	if _, err := os.Lstat(a); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("first copy left behind: %v", err)
	}
	if got, _ := os.ReadFile(taken); !bytes.Equal(got, []byte("someone else's")) {
		t.Fatalf("existing file changed: %q", got)
	}

	mnt := filepath.Join(dir, "small")
	if err := os.Mkdir(mnt, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount("tmpfs", mnt, "tmpfs", 0, "size=2m"); err != nil {
		t.Fatalf("mount -t tmpfs -o size=2m tmpfs %s: %v (this test needs root / CAP_SYS_ADMIN)", mnt, err)
	}
	t.Cleanup(func() { unix.Unmount(mnt, 0) })
	full := filepath.Join(mnt, "b.raw")
	if _, err := disk.CloneEach(src, []string{a, full}, nil); !errors.Is(err, unix.ENOSPC) {
		t.Fatalf("err = %v, want ENOSPC", err)
	}
	for _, p := range []string{a, full} {
		if _, err := os.Lstat(p); !errors.Is(err, fs.ErrNotExist) {
			t.Fatalf("%s left behind: %v", p, err)
		}
	}
}

// TestCloneEachReflinksOnXFS: on XFS with reflink=1 every copy shares the
// source's extents, so two copies of 64 MiB of data use no data blocks.
func TestCloneEachReflinksOnXFS(t *testing.T) {
	mnt := smallfs.MountXFS(t, 512*MiB)
	src := makeImage(t, filepath.Join(mnt, "src.raw"), 256*MiB, []span{{off: 0, len: 64 * MiB}}, 9)
	free := smallfs.Free(t, mnt)
	a, b := filepath.Join(mnt, "a.raw"), filepath.Join(mnt, "b.raw")
	methods, err := disk.CloneEach(src, []string{a, b}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if methods[0] != disk.MethodReflink || methods[1] != disk.MethodReflink {
		t.Fatalf("methods %v, want reflink for both", methods)
	}
	if used := free - smallfs.Free(t, mnt); used > 8*MiB {
		t.Fatalf("two reflinked copies used %d bytes", used)
	}
	if want := sha(t, src); sha(t, a) != want || sha(t, b) != want {
		t.Fatal("copies differ from the source")
	}
}

// TestReflinks: the probe answers yes on XFS with reflink=1, no on ext4
// and tmpfs, and leaves no file behind either way.
func TestReflinks(t *testing.T) {
	xfs := smallfs.MountXFS(t, 300*MiB)
	ext4 := smallfs.Mount(t, 64*MiB)
	tmp := t.TempDir()
	for dir, want := range map[string]bool{xfs: true, ext4: false, "/dev/shm": false} {
		before, _ := os.ReadDir(dir)
		if got := disk.Reflinks(dir); got != want {
			t.Errorf("Reflinks(%s) = %v, want %v", dir, got, want)
		}
		if got := disk.Reflinks(dir); got != want { // the remembered answer
			t.Errorf("Reflinks(%s) again = %v, want %v", dir, got, want)
		}
		if after, _ := os.ReadDir(dir); len(after) != len(before) {
			t.Errorf("the probe left files in %s: %d entries before, %d after", dir, len(before), len(after))
		}
	}
	if !disk.SameFilesystem(xfs, filepath.Join(xfs, ".")) || disk.SameFilesystem(xfs, tmp) {
		t.Error("SameFilesystem")
	}
}
