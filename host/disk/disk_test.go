package disk_test

import (
	"bytes"
	"crypto/sha256"
	"errors"
	"io"
	"io/fs"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/nexus-sandbox/nexus/host/disk"
)

const (
	KiB = int64(1) << 10
	MiB = int64(1) << 20
	GiB = int64(1) << 30
)

// span is a region of a test image: random bytes, or explicit zeros written
// so that the source allocates them.
type span struct {
	off, len int64
	zeros    bool
}

// makeImage writes a sparse file of size bytes with spans filled in, fsyncs
// it, and returns its path.
func makeImage(t testing.TB, path string, size int64, spans []span, seed uint64) string {
	t.Helper()
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := f.Truncate(size); err != nil {
		t.Fatal(err)
	}
	rng := rand.NewChaCha8([32]byte{byte(seed), byte(seed >> 8)})
	for _, s := range spans {
		b := make([]byte, s.len)
		if !s.zeros {
			rng.Read(b)
		}
		if _, err := f.WriteAt(b, s.off); err != nil {
			t.Fatal(err)
		}
	}
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
	return path
}

func sha(t testing.TB, path string) [32]byte {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		t.Fatal(err)
	}
	return [32]byte(h.Sum(nil))
}

// rawStat is the test's own view of a file, independent of disk.Stat.
func rawStat(t testing.TB, path string) unix.Stat_t {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		t.Fatal(err)
	}
	return st
}

// allocated is the bytes of path's data extents, found with SEEK_DATA and
// SEEK_HOLE. st_blocks would also count the filesystem's extent-tree
// blocks, whose number depends on how fragmented the file came out (more
// so on a busy disk), not on what was copied.
func allocated(t testing.TB, path string) int64 {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var total int64
	for off := int64(0); ; {
		data, err := unix.Seek(int(f.Fd()), off, unix.SEEK_DATA)
		if errors.Is(err, unix.ENXIO) {
			return total
		}
		if err != nil {
			t.Fatal(err)
		}
		hole, err := unix.Seek(int(f.Fd()), data, unix.SEEK_HOLE)
		if err != nil {
			t.Fatal(err)
		}
		total += hole - data
		off = hole
	}
}

// cpSparse runs the real cp and fsyncs its output, so its allocation is
// final and comparable with Clone's.
func cpSparse(t testing.TB, src, dst string) {
	t.Helper()
	if out, err := exec.Command("cp", "--sparse=always", src, dst).CombinedOutput(); err != nil {
		t.Fatalf("cp --sparse=always: %v: %s", err, out)
	}
	f, err := os.OpenFile(dst, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
}

// nextData is SEEK_DATA from off, or size when only a hole remains.
func nextData(t *testing.T, path string, off int64) int64 {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	d, err := unix.Seek(int(f.Fd()), off, unix.SEEK_DATA)
	if errors.Is(err, unix.ENXIO) {
		return rawStat(t, path).Size
	}
	if err != nil {
		t.Fatal(err)
	}
	return d
}

func TestCloneSparse(t *testing.T) {
	cases := []struct {
		name  string
		size  int64
		spans []span
		holes []span // explicitly written zeros that the copy must leave as holes
	}{
		{
			name: "scattered 64MiB",
			size: 64 * MiB,
			spans: []span{
				{off: 0, len: 1 * MiB},
				{off: 5*MiB + 1234, len: 512 * KiB}, // unaligned both ends
				{off: 20 * MiB, len: 3 * MiB},
				// data, an aligned zero gap inside one extent, data
				{off: 30 * MiB, len: 4 * KiB},
				{off: 30*MiB + 4*KiB, len: 8 * KiB, zeros: true},
				{off: 30*MiB + 12*KiB, len: 4 * KiB},
				{off: 40 * MiB, len: 4 * MiB, zeros: true},
				{off: 64*MiB - 100*KiB, len: 100 * KiB}, // runs to EOF
			},
			holes: []span{{off: 30*MiB + 4*KiB, len: 8 * KiB}, {off: 40 * MiB, len: 4 * MiB}},
		},
		{
			name: "odd size with unaligned tail",
			size: 10*MiB + 777,
			spans: []span{
				{off: 2 * MiB, len: 1 * MiB, zeros: true},
				{off: 10*MiB + 777 - 5000, len: 5000},
			},
			holes: []span{{off: 2 * MiB, len: 1 * MiB}},
		},
		{
			name: "dense with zero middle",
			size: 2 * MiB,
			spans: []span{
				{off: 0, len: 2 * MiB},
				{off: 1 * MiB, len: 64 * KiB, zeros: true},
			},
			holes: []span{{off: 1 * MiB, len: 64 * KiB}},
		},
		{name: "all hole", size: 16 * MiB},
		{name: "empty", size: 0},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			dir := t.TempDir()
			src := makeImage(t, filepath.Join(dir, "src.raw"), tc.size, tc.spans, 1)
			dst := filepath.Join(dir, "dst.raw")
			ref := filepath.Join(dir, "cp.raw")
			for _, z := range tc.holes {
				if nextData(t, src, z.off) != z.off {
					t.Fatalf("test setup: zero region at %d is not allocated in the source", z.off)
				}
			}

			m, err := disk.Clone(src, dst)
			if err != nil {
				t.Fatalf("Clone: %v", err)
			}
			if m != disk.MethodSparseCopy && m != disk.MethodReflink {
				t.Fatalf("method = %q", m)
			}
			t.Logf("method %s", m)
			cpSparse(t, src, ref)

			if sha(t, dst) != sha(t, src) {
				t.Fatal("content differs from source")
			}
			sst, dst2 := rawStat(t, src), rawStat(t, dst)
			if dst2.Size != sst.Size {
				t.Fatalf("apparent size %d, source %d", dst2.Size, sst.Size)
			}
			if perm := dst2.Mode & 0o777; perm != 0o600 {
				t.Fatalf("mode %#o, want 0600", perm)
			}
			got, srcAlloc, cpAlloc := allocated(t, dst), allocated(t, src), allocated(t, ref)
			t.Logf("allocated: clone %d, source %d, cp --sparse=always %d", got, srcAlloc, cpAlloc)
			if m == disk.MethodSparseCopy {
				if got > srcAlloc {
					t.Errorf("clone allocates %d > source %d", got, srcAlloc)
				}
				if got > cpAlloc {
					t.Errorf("clone allocates %d > cp --sparse=always %d", got, cpAlloc)
				}
				for _, z := range tc.holes {
					if d := nextData(t, dst, z.off); d < z.off+z.len {
						t.Errorf("zero region [%d,%d) has data at %d in the copy", z.off, z.off+z.len, d)
					}
				}
			}
		})
	}
}

func TestCloneRefuses(t *testing.T) {
	cases := []struct {
		name    string
		setup   func(t *testing.T, dir string) (src, dst string)
		wantErr error
	}{
		{
			name: "existing dst",
			setup: func(t *testing.T, dir string) (string, string) {
				src := makeImage(t, filepath.Join(dir, "src"), MiB, []span{{off: 0, len: MiB}}, 2)
				dst := filepath.Join(dir, "dst")
				if err := os.WriteFile(dst, []byte("keep me"), 0o644); err != nil {
					t.Fatal(err)
				}
				return src, dst
			},
			wantErr: fs.ErrExist,
		},
		{
			name: "dangling symlink dst",
			setup: func(t *testing.T, dir string) (string, string) {
				src := makeImage(t, filepath.Join(dir, "src"), MiB, []span{{off: 0, len: MiB}}, 2)
				dst := filepath.Join(dir, "dst")
				if err := os.Symlink(filepath.Join(dir, "elsewhere"), dst); err != nil {
					t.Fatal(err)
				}
				return src, dst
			},
			wantErr: fs.ErrExist,
		},
		{
			name: "symlink src",
			setup: func(t *testing.T, dir string) (string, string) {
				real := makeImage(t, filepath.Join(dir, "real"), MiB, []span{{off: 0, len: MiB}}, 2)
				src := filepath.Join(dir, "link")
				if err := os.Symlink(real, src); err != nil {
					t.Fatal(err)
				}
				return src, filepath.Join(dir, "dst")
			},
			wantErr: disk.ErrNotRegular,
		},
		{
			name: "directory src",
			setup: func(t *testing.T, dir string) (string, string) {
				src := filepath.Join(dir, "d")
				if err := os.Mkdir(src, 0o755); err != nil {
					t.Fatal(err)
				}
				return src, filepath.Join(dir, "dst")
			},
			wantErr: disk.ErrNotRegular,
		},
		{
			// Opening a fifo for reading would block forever without O_NONBLOCK.
			name: "fifo src",
			setup: func(t *testing.T, dir string) (string, string) {
				src := filepath.Join(dir, "fifo")
				if err := unix.Mkfifo(src, 0o600); err != nil {
					t.Fatal(err)
				}
				return src, filepath.Join(dir, "dst")
			},
			wantErr: disk.ErrNotRegular,
		},
		{
			name: "missing src",
			setup: func(t *testing.T, dir string) (string, string) {
				return filepath.Join(dir, "nope"), filepath.Join(dir, "dst")
			},
			wantErr: fs.ErrNotExist,
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			dir := t.TempDir()
			src, dst := tc.setup(t, dir)
			before, beforeErr := os.Readlink(dst)
			beforeData, _ := os.ReadFile(dst)

			_, err := disk.Clone(src, dst)
			if err == nil {
				t.Fatal("Clone succeeded")
			}
			if !errors.Is(err, tc.wantErr) {
				t.Fatalf("err = %v, want errors.Is %v", err, tc.wantErr)
			}
			if strings.Contains(err.Error(), "\n") {
				t.Fatalf("multi-line error %q", err)
			}
			t.Logf("error: %v", err)

			switch tc.wantErr {
			case fs.ErrExist: // dst must be exactly as it was
				after, afterErr := os.Readlink(dst)
				afterData, _ := os.ReadFile(dst)
				if after != before || (afterErr == nil) != (beforeErr == nil) || !bytes.Equal(afterData, beforeData) {
					t.Fatal("existing dst was modified")
				}
				if _, err := os.Lstat(filepath.Join(dir, "elsewhere")); !errors.Is(err, fs.ErrNotExist) {
					t.Fatal("symlink dst was followed")
				}
			default:
				if _, err := os.Lstat(dst); !errors.Is(err, fs.ErrNotExist) {
					t.Fatalf("dst exists after refusal: %v", err)
				}
			}
		})
	}
}

func TestCloneENOSPCRemovesDst(t *testing.T) {
	dir := t.TempDir()
	mnt := filepath.Join(dir, "small")
	if err := os.Mkdir(mnt, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount("tmpfs", mnt, "tmpfs", 0, "size=2m"); err != nil {
		t.Fatalf("mount -t tmpfs -o size=2m tmpfs %s: %v (this test needs root / CAP_SYS_ADMIN)", mnt, err)
	}
	t.Cleanup(func() {
		if err := unix.Unmount(mnt, 0); err != nil {
			t.Errorf("umount %s: %v", mnt, err)
		}
	})
	freeBefore, err := disk.FreeBytes(mnt)
	if err != nil {
		t.Fatal(err)
	}
	src := makeImage(t, filepath.Join(dir, "src.raw"), 8*MiB, []span{{off: 0, len: 8 * MiB}}, 3)
	dst := filepath.Join(mnt, "dst.raw")

	_, err = disk.Clone(src, dst)
	if !errors.Is(err, unix.ENOSPC) {
		t.Fatalf("err = %v, want ENOSPC", err)
	}
	t.Logf("error: %v", err)
	if _, err := os.Lstat(dst); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("dst left behind: %v", err)
	}
	if freeAfter, err := disk.FreeBytes(mnt); err != nil || freeAfter != freeBefore {
		t.Fatalf("free space %d before, %d after (%v): partial copy not released", freeBefore, freeAfter, err)
	}
}

func TestMakeExt4(t *testing.T) {
	cases := []struct {
		name  string
		files map[string]string // nil: no fromDir
	}{
		{name: "empty"},
		{name: "from dir", files: map[string]string{
			"hello.txt":   "hello, sandbox\n",
			"config.json": `{"vcpus":2}`,
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			dir := t.TempDir()
			from := ""
			if tc.files != nil {
				from = filepath.Join(dir, "root")
				if err := os.Mkdir(from, 0o755); err != nil {
					t.Fatal(err)
				}
				for name, body := range tc.files {
					if err := os.WriteFile(filepath.Join(from, name), []byte(body), 0o644); err != nil {
						t.Fatal(err)
					}
				}
			}
			img := filepath.Join(dir, "rootfs.ext4")
			if err := disk.MakeExt4(img, 32*MiB, from); err != nil {
				t.Fatalf("MakeExt4: %v", err)
			}
			if out, err := exec.Command("e2fsck", "-fn", img).CombinedOutput(); err != nil {
				t.Fatalf("e2fsck -fn: %v\n%s", err, out)
			}
			ls, err := exec.Command("debugfs", "-R", "ls -l /", img).Output()
			if err != nil {
				t.Fatalf("debugfs: %v", err)
			}
			for name := range tc.files {
				if !bytes.Contains(ls, []byte(name)) {
					t.Errorf("%s missing from image root:\n%s", name, ls)
				}
			}
			sz, err := disk.Stat(img)
			if err != nil {
				t.Fatal(err)
			}
			if sz.Apparent != 32*MiB || sz.Allocated >= sz.Apparent {
				t.Errorf("size %+v: want apparent 32 MiB, sparse", sz)
			}
			if perm := rawStat(t, img).Mode & 0o777; perm != 0o600 {
				t.Errorf("mode %#o, want 0600", perm)
			}
		})
	}
}

func TestMakeExt4Fails(t *testing.T) {
	cases := []struct {
		name    string
		size    int64
		from    func(t *testing.T, dir string) string
		exists  bool   // image path exists beforehand and must survive
		wantMsg string // substring of the error
	}{
		{
			name:    "missing fromDir",
			size:    32 * MiB,
			from:    func(t *testing.T, dir string) string { return filepath.Join(dir, "nope") },
			wantMsg: "No such file or directory",
		},
		{
			name: "fromDir is a file",
			size: 32 * MiB,
			from: func(t *testing.T, dir string) string {
				p := filepath.Join(dir, "file")
				if err := os.WriteFile(p, []byte("x"), 0o644); err != nil {
					t.Fatal(err)
				}
				return p
			},
			wantMsg: "Not a directory",
		},
		{name: "too small for ext4", size: 4 * KiB, wantMsg: "mkfs.ext4"},
		{name: "zero size", size: 0, wantMsg: "not positive"},
		{name: "existing image", size: 32 * MiB, exists: true, wantMsg: "exists"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			dir := t.TempDir()
			img := filepath.Join(dir, "img.ext4")
			if tc.exists {
				if err := os.WriteFile(img, []byte("precious"), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			from := ""
			if tc.from != nil {
				from = tc.from(t, dir)
			}
			err := disk.MakeExt4(img, tc.size, from)
			if err == nil {
				t.Fatal("MakeExt4 succeeded")
			}
			t.Logf("error: %v", err)
			if strings.Contains(err.Error(), "\n") {
				t.Errorf("multi-line error %q", err)
			}
			if !strings.Contains(err.Error(), tc.wantMsg) {
				t.Errorf("error %q does not mention %q", err, tc.wantMsg)
			}
			if tc.exists {
				if b, _ := os.ReadFile(img); string(b) != "precious" {
					t.Fatal("existing image was modified")
				}
			} else if _, err := os.Lstat(img); !errors.Is(err, fs.ErrNotExist) {
				t.Fatalf("image left behind: %v", err)
			}
		})
	}
}

func TestStat(t *testing.T) {
	dir := t.TempDir()
	img := makeImage(t, filepath.Join(dir, "img"), 8*MiB, []span{{off: MiB, len: MiB}}, 4)
	got, err := disk.Stat(img)
	if err != nil {
		t.Fatal(err)
	}
	st := rawStat(t, img)
	if got.Allocated != st.Blocks*512 || got.Apparent != st.Size {
		t.Fatalf("Stat = %+v, unix.Stat blocks*512=%d size=%d", got, st.Blocks*512, st.Size)
	}
	if got.Apparent != 8*MiB || got.Allocated < MiB || got.Allocated >= 8*MiB {
		t.Fatalf("Stat = %+v, want 8 MiB apparent, about 1 MiB allocated", got)
	}

	link := filepath.Join(dir, "link")
	if err := os.Symlink(img, link); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{link, dir} {
		if _, err := disk.Stat(p); !errors.Is(err, disk.ErrNotRegular) {
			t.Errorf("Stat(%s) err = %v, want ErrNotRegular", p, err)
		}
	}
	if _, err := disk.Stat(filepath.Join(dir, "missing")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("Stat(missing) err = %v, want ErrNotExist", err)
	}
}

func TestFreeBytesAndPreflight(t *testing.T) {
	dir := t.TempDir()
	free, err := disk.FreeBytes(dir)
	if err != nil {
		t.Fatal(err)
	}
	if free <= 0 {
		t.Fatalf("FreeBytes = %d", free)
	}
	var sfs unix.Statfs_t
	if err := unix.Statfs(dir, &sfs); err != nil {
		t.Fatal(err)
	}
	// Others share this filesystem, so allow for their writes in between.
	if want := int64(sfs.Bavail) * sfs.Bsize; free < want-256*MiB || free > want+256*MiB {
		t.Fatalf("FreeBytes = %d, statfs Bavail*Bsize = %d", free, want)
	}

	cases := []struct {
		name string
		need int64
		want error
	}{
		{"one byte", 1, nil},
		{"zero", 0, nil},
		{"free plus 1GiB", free + GiB, disk.ErrInsufficientSpace},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			err := disk.Preflight(dir, tc.need)
			if !errors.Is(err, tc.want) || (tc.want == nil) != (err == nil) {
				t.Fatalf("Preflight(%d) = %v, want %v", tc.need, err, tc.want)
			}
			if err != nil {
				msg := err.Error()
				t.Logf("error: %s", msg)
				if strings.Contains(msg, "\n") || strings.Count(msg, "iB") < 2 {
					t.Errorf("want one line naming both figures in IEC units, got %q", msg)
				}
			}
		})
	}
	if err := disk.Preflight(dir, -1); err == nil || errors.Is(err, disk.ErrInsufficientSpace) {
		t.Errorf("Preflight(-1) = %v, want an argument error", err)
	}
}

// CloneProgress reports increasing positions ending at the source's
// length, and a copy still matches its source.
func TestCloneProgressReportsPosition(t *testing.T) {
	dir := t.TempDir()
	src := filepath.Join(dir, "src.raw")
	f, err := os.Create(src)
	if err != nil {
		t.Fatal(err)
	}
	chunk := bytes.Repeat([]byte{0xA5}, 3<<20)
	for _, off := range []int64{0, 20 << 20, 50 << 20} {
		if _, err := f.WriteAt(chunk, off); err != nil {
			t.Fatal(err)
		}
	}
	f.Truncate(64 << 20)
	f.Close()
	var seen []int64
	var total int64
	if _, err := disk.CloneProgress(src, filepath.Join(dir, "dst.raw"), func(done, t int64) {
		seen = append(seen, done)
		total = t
	}); err != nil {
		t.Fatal(err)
	}
	if total != 64<<20 || len(seen) == 0 || seen[len(seen)-1] != total {
		t.Fatalf("progress ended at %v of %d", seen, total)
	}
	for i := 1; i < len(seen); i++ {
		if seen[i] < seen[i-1] {
			t.Fatalf("progress went backwards: %v", seen)
		}
	}
	a, _ := os.ReadFile(src)
	b, _ := os.ReadFile(filepath.Join(dir, "dst.raw"))
	if !bytes.Equal(a, b) {
		t.Fatal("the copy differs from its source")
	}
}
