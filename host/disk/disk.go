// Package disk materialises sandbox disks: copy-on-write clones, sparse
// copies, ext4 images, and the sizes preflight needs.
package disk

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"

	"golang.org/x/sys/unix"

	"github.com/nexus-sandbox/nexus/host/durable"
	"github.com/nexus-sandbox/nexus/oneline"
)

// Method says how a disk was materialised.
type Method string

const (
	// MethodReflink shares src's extents copy-on-write (FICLONE).
	MethodReflink Method = "reflink"
	// MethodSparseCopy copied src's data extents, leaving zero runs as holes.
	MethodSparseCopy Method = "sparse-copy"
	// MethodMkfs built a fresh ext4 image.
	MethodMkfs Method = "mkfs"
)

// ErrNotRegular is wrapped by every refusal of a path that is not a regular
// file, so callers can tell "wrong kind of thing" from I/O failures.
var ErrNotRegular = errors.New("not a regular file")

// ErrInsufficientSpace is wrapped by Preflight's refusal.
var ErrInsufficientSpace = errors.New("insufficient disk space")

// Size is what a disk occupies: Allocated = st_blocks*512 (what preflight
// charges), Apparent = st_size.
type Size struct{ Allocated, Apparent int64 }

const (
	// holeBlock is the granularity at which zero runs are left unwritten. It
	// matches the block size of ext4/xfs and the page size, so a skipped run
	// is a whole block the filesystem would otherwise have allocated.
	holeBlock = 4 << 10
	// copyChunk is large so the per-syscall cost vanishes against the
	// per-byte cost of copying.
	copyChunk = 1 << 20
	// maxWrite caps one pwrite, whatever the read chunk: the size GNU cp
	// writes with (coreutils' io_blksize, 128 KiB). On a VM whose balloon
	// reports free pages to the host, a 1 MiB write faults in large
	// page-cache folios the host took back, and those stalls gave Clone a
	// worse tail than cp; docs/benchmarks-disk.md has the runs.
	maxWrite = 128 << 10
	// copyBuffers chunks are in flight between the reader and the writer.
	copyBuffers = 4
	// writebackEvery is how much is written between writeback kicks. Starting
	// writeback while the copy runs, instead of leaving it all to the final
	// fsync, overlaps device time with copy time: 200 MiB on virtio ext4 went
	// from ~295 ms to ~180 ms with kicks every 2-8 MiB, while 64 MiB windows,
	// or waiting for each window, gave back much of that (docs/benchmarks-disk.md).
	writebackEvery = 8 << 20
)

// Stat reports the sizes of the regular file at path. It uses Lstat so a
// symlink is refused rather than charged for its target.
func Stat(path string) (Size, error) {
	var st unix.Stat_t
	if err := unix.Lstat(path, &st); err != nil {
		return Size{}, fmt.Errorf("disk: stat %s: %w", path, err)
	}
	if err := regular(st.Mode); err != nil {
		return Size{}, fmt.Errorf("disk: %s %w", path, err)
	}
	return Size{Allocated: st.Blocks * 512, Apparent: st.Size}, nil
}

// regular's error reads as the rest of a sentence that starts with the path.
func regular(mode uint32) error {
	var kind string
	switch mode & unix.S_IFMT {
	case unix.S_IFREG:
		return nil
	case unix.S_IFDIR:
		kind = "directory"
	case unix.S_IFLNK:
		kind = "symbolic link"
	case unix.S_IFBLK:
		kind = "block device"
	case unix.S_IFCHR:
		kind = "character device"
	case unix.S_IFIFO:
		kind = "fifo"
	case unix.S_IFSOCK:
		kind = "socket"
	default:
		kind = fmt.Sprintf("file of mode %#o", mode&unix.S_IFMT)
	}
	return fmt.Errorf("is a %s: %w", kind, ErrNotRegular)
}

// Clone materialises dst as a copy of src: FICLONE where the filesystem
// supports it, else a sparse copy of src's data extents that leaves every
// all-zero aligned 4 KiB block unwritten. dst is created O_EXCL 0600, is
// fsynced (with its directory) before Clone returns, and is removed if Clone
// fails for any reason; errors wrap the underlying errno (ENOSPC included).
func Clone(src, dst string) (method Method, err error) {
	return CloneProgress(src, dst, nil)
}

// Progress hears how far a copy is: done of total bytes of the source's
// length (holes count as done once passed). A reflink reports once, done.
type Progress func(done, total int64)

// CloneProgress is Clone reporting its position to progress (nil: none)
// from the goroutine that writes, after each chunk is written.
func CloneProgress(src, dst string, progress Progress) (method Method, err error) {
	methods, err := CloneEach(src, []string{dst}, progress)
	if err != nil {
		return "", err
	}
	return methods[0], nil
}

// CloneEach materialises every dst as a copy of src, as Clone does, but
// reads src once: each dst is a FICLONE where the filesystem pair allows
// it, and all the others are written from the same pass over src's data
// (a cache miss makes the cache entry and the sandbox's disk this way, so
// the image is read once). It returns the method of each dst; on any
// failure every dst it created is removed.
func CloneEach(src string, dsts []string, progress Progress) (methods []Method, err error) {
	if progress == nil {
		progress = func(int64, int64) {}
	}
	in, size, err := openSource(src)
	if err != nil {
		return nil, err
	}
	defer in.Close()

	outs := make([]*os.File, 0, len(dsts))
	defer func() {
		if err != nil {
			for _, out := range outs {
				out.Close()
				os.Remove(out.Name())
			}
		}
	}()
	for _, dst := range dsts {
		out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
		if err != nil {
			return nil, fmt.Errorf("disk: clone %s: create %s: %w", src, dst, err)
		}
		outs = append(outs, out)
	}
	what := strings.Join(dsts, ", ")

	methods, err = cloneInto(in, outs, size, progress)
	if err != nil {
		return nil, fmt.Errorf("disk: clone %s to %s: %w", src, what, err)
	}
	// Sync reports writeback errors, ENOSPC included on filesystems that
	// allocate at writeback, so a clone is not done until it succeeds. The
	// copies are synced at once, so their writeback shares the device's queue.
	syncErrs := make([]error, len(outs))
	var wg sync.WaitGroup
	for i, out := range outs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			syncErrs[i] = out.Sync()
		}()
	}
	wg.Wait()
	if err = errors.Join(syncErrs...); err != nil {
		return nil, fmt.Errorf("disk: clone %s to %s: %w", src, what, err)
	}
	synced := map[string]bool{}
	for _, out := range outs {
		if err = out.Close(); err != nil {
			return nil, fmt.Errorf("disk: clone %s to %s: %w", src, out.Name(), err)
		}
	}
	for _, dst := range dsts {
		if dir := filepath.Dir(dst); !synced[dir] {
			synced[dir] = true
			if err = durable.SyncDir(dir); err != nil {
				return nil, fmt.Errorf("disk: clone %s to %s: %w", src, dst, err)
			}
		}
	}
	return methods, nil
}

// openSource opens src without following a final symlink and without
// blocking on a fifo, and refuses anything but a regular file.
func openSource(src string) (*os.File, int64, error) {
	fd, err := unix.Open(src, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	if err != nil {
		if errors.Is(err, unix.ELOOP) {
			return nil, 0, fmt.Errorf("disk: clone source %s is a symbolic link: %w", src, ErrNotRegular)
		}
		return nil, 0, fmt.Errorf("disk: clone source %s: %w", src, err)
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		unix.Close(fd)
		return nil, 0, fmt.Errorf("disk: clone source %s: %w", src, err)
	}
	if err := regular(st.Mode); err != nil {
		unix.Close(fd)
		return nil, 0, fmt.Errorf("disk: clone source %s %w", src, err)
	}
	// O_NONBLOCK was only for the open; reads of a regular file ignore it,
	// but clearing it keeps the fd ordinary for FICLONE and the runtime.
	if err := unix.SetNonblock(fd, false); err != nil {
		unix.Close(fd)
		return nil, 0, fmt.Errorf("disk: clone source %s: %w", src, err)
	}
	return os.NewFile(uintptr(fd), src), st.Size, nil
}

// cloneInto reflinks in into each out that allows it and sparse-copies
// the rest in one pass.
func cloneInto(in *os.File, outs []*os.File, size int64, progress Progress) ([]Method, error) {
	methods := make([]Method, len(outs))
	var copies []*os.File
	for i, out := range outs {
		err := unix.IoctlFileClone(int(out.Fd()), int(in.Fd()))
		switch {
		case err == nil:
			methods[i] = MethodReflink
		case reflinkUnsupported(err):
			methods[i] = MethodSparseCopy
			copies = append(copies, out)
		default:
			return nil, fmt.Errorf("FICLONE %s: %w", out.Name(), err)
		}
	}
	if len(copies) > 0 {
		if err := sparseCopy(in, copies, size, progress); err != nil {
			return nil, err
		}
	}
	progress(size, size)
	return methods, nil
}

// reflinkUnsupported separates "this filesystem pair cannot share extents"
// (fall back to copying) from real failures such as ENOSPC or EIO, which a
// copy would only hit again, later and slower.
func reflinkUnsupported(err error) bool {
	switch {
	case errors.Is(err, unix.EOPNOTSUPP), // ext4, tmpfs
		errors.Is(err, unix.EXDEV),  // different filesystems
		errors.Is(err, unix.EINVAL), // e.g. filesystem refuses this file
		errors.Is(err, unix.ENOTTY), // filesystem without the ioctl
		errors.Is(err, unix.ENOSYS):
		return true
	}
	return false
}

// sparseCopy copies only what SEEK_DATA reports as data and, within it, only
// blocks that are not all zero. dst starts as one hole of src's size, so
// whatever is skipped reads back as zeros. It reads and writes through a
// user buffer rather than copy_file_range: the zero scan has to read every
// data byte anyway, and on a filesystem without reflink copy_file_range is a
// splice of the same pages, so it would add a second pass over the data and
// allocate whatever zero runs it is handed (measured ~13% slower, see
// docs/benchmarks-disk.md).
func sparseCopy(in *os.File, outs []*os.File, size int64, progress Progress) error {
	for _, out := range outs {
		if err := out.Truncate(size); err != nil {
			return err
		}
	}
	if size == 0 {
		return nil
	}
	// A cold source is read front to back; a wider readahead window keeps
	// the disk busy while the zero scan runs. Advisory, so errors don't matter.
	_ = unix.Fadvise(int(in.Fd()), 0, 0, unix.FADV_SEQUENTIAL)

	// Reading (and scanning for zeros) overlaps writing: one goroutine per
	// output writes chunks in offset order while this one reads ahead, so
	// the copy takes about as long as the slowest of them instead of their
	// sum. A buffer is reused once every writer is done with it.
	type chunk struct {
		buf  []byte
		off  int64
		left *atomic.Int32 // writers still to write it
	}
	free := make(chan []byte, copyBuffers)
	for range copyBuffers {
		free <- make([]byte, copyChunk)
	}
	fulls := make([]chan chunk, len(outs))
	var writeFailed atomic.Bool
	writeErrs := make(chan error, len(outs))
	for i, out := range outs {
		fulls[i] = make(chan chunk, copyBuffers)
		w := &zeroSkipWriter{out: out}
		go func() {
			var err error
			for c := range fulls[i] {
				if err == nil {
					if err = w.write(c.buf, c.off); err != nil {
						writeFailed.Store(true)
					} else if i == 0 {
						progress(c.off+int64(len(c.buf)), size)
					}
				}
				if c.left.Add(-1) == 0 {
					free <- c.buf[:cap(c.buf)]
				}
			}
			writeErrs <- err
		}()
	}
	readErr := readData(in, size, func(pos int64, n int) ([]byte, bool) {
		if writeFailed.Load() {
			return nil, false
		}
		return (<-free)[:n], true
	}, func(b []byte, pos int64) {
		left := new(atomic.Int32)
		left.Store(int32(len(fulls)))
		for _, full := range fulls {
			full <- chunk{b, pos, left}
		}
	})
	for _, full := range fulls {
		close(full)
	}
	var errs []error
	for range outs {
		errs = append(errs, <-writeErrs)
	}
	if err := errors.Join(errs...); err != nil {
		return err
	}
	return readErr
}

// readData reads every data extent of in (below size) in chunks of at most
// copyChunk bytes, in increasing offset order: next supplies the buffer for
// a chunk (or false to stop early), done hands the filled chunk on.
func readData(in *os.File, size int64, next func(pos int64, n int) ([]byte, bool), done func(b []byte, pos int64)) error {
	for off := int64(0); off < size; {
		data, err := unix.Seek(int(in.Fd()), off, unix.SEEK_DATA)
		if errors.Is(err, unix.ENXIO) {
			return nil // only a hole remains, and dst already is one
		}
		if err != nil {
			return fmt.Errorf("seek data at %d: %w", off, err)
		}
		if data >= size {
			return nil
		}
		hole, err := unix.Seek(int(in.Fd()), data, unix.SEEK_HOLE)
		if err != nil {
			return fmt.Errorf("seek hole at %d: %w", data, err)
		}
		hole = min(hole, size)
		for pos := data; pos < hole; {
			n := int(min(int64(copyChunk), hole-pos))
			buf, ok := next(pos, n)
			if !ok {
				return nil
			}
			if _, err := in.ReadAt(buf, pos); err != nil {
				if errors.Is(err, io.EOF) {
					return fmt.Errorf("source shrank below %d bytes during copy", size)
				}
				return err
			}
			done(buf, pos)
			pos += int64(n)
		}
		off = hole
	}
	return nil
}

// zeroSkipWriter writes b at off to out, leaving every all-zero block
// (aligned to holeBlock in file offsets) unwritten and coalescing the rest
// into one pwrite per run. Offsets must increase from call to call.
type zeroSkipWriter struct {
	out      *os.File
	pending  int64 // written since the last writeback kick
	kickFrom int64 // start of the range not yet kicked
}

// kick starts asynchronous writeback of what was written since the last
// kick. Errors are ignored: it is only a head start, and the fsync that
// ends every clone reports whatever writeback went wrong.
func (w *zeroSkipWriter) kick(end int64) {
	_ = unix.SyncFileRange(int(w.out.Fd()), w.kickFrom, end-w.kickFrom, unix.SYNC_FILE_RANGE_WRITE)
	w.kickFrom, w.pending = end, 0
}

func (w *zeroSkipWriter) write(b []byte, off int64) error {
	run := -1
	flush := func(end int) error {
		if run < 0 {
			return nil
		}
		for from := run; from < end; from += maxWrite {
			if _, err := w.out.WriteAt(b[from:min(from+maxWrite, end)], off+int64(from)); err != nil {
				return err
			}
		}
		if w.pending += int64(end - run); w.pending >= writebackEvery {
			w.kick(off + int64(end))
		}
		run = -1
		return nil
	}
	for i := 0; i < len(b); {
		j := min(i+holeBlock-int((off+int64(i))%holeBlock), len(b))
		if isZero(b[i:j]) {
			if err := flush(i); err != nil {
				return err
			}
		} else if run < 0 {
			run = i
		}
		i = j
	}
	return flush(len(b))
}

var zeroBlock [holeBlock]byte

// isZero decides a data block in O(1) when its first word is non-zero,
// which is nearly always the case for real data; only blocks that start
// with zeros pay for a full (vectorised) comparison.
func isZero(b []byte) bool {
	if len(b) >= 8 && binary.LittleEndian.Uint64(b) != 0 {
		return false
	}
	return bytes.Equal(b, zeroBlock[:len(b)])
}

// MakeExt4 creates an ext4 image of sizeBytes at path (O_EXCL 0600, sparse)
// with mkfs.ext4 -q -F, populated from fromDir when it is not empty. On
// failure path is removed and the error carries mkfs's output on one line.
// The image is fsynced with its directory before MakeExt4 returns.
func MakeExt4(path string, sizeBytes int64, fromDir string) (err error) {
	if sizeBytes <= 0 {
		return fmt.Errorf("disk: mkfs %s: size %d is not positive", path, sizeBytes)
	}
	mkfs, err := mkfsPath()
	if err != nil {
		return fmt.Errorf("disk: mkfs %s: %w", path, err)
	}
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return fmt.Errorf("disk: mkfs %s: %w", path, err)
	}
	defer func() {
		if err != nil {
			f.Close()
			os.Remove(path)
		}
	}()
	if err = f.Truncate(sizeBytes); err != nil {
		return fmt.Errorf("disk: mkfs %s: %w", path, err)
	}

	// Absolute paths keep a name beginning with "-" from being read as an
	// option by mke2fs.
	target, err := filepath.Abs(path)
	if err != nil {
		return fmt.Errorf("disk: mkfs %s: %w", path, err)
	}
	args := []string{"-q", "-F"}
	if fromDir != "" {
		src, aerr := filepath.Abs(fromDir)
		if aerr != nil {
			err = aerr
			return fmt.Errorf("disk: mkfs %s: %w", path, err)
		}
		args = append(args, "-d", src)
	}
	args = append(args, target)
	cmd := exec.Command(mkfs, args...)
	cmd.Env = append(os.Environ(), "LC_ALL=C") // stable, greppable messages
	var output bytes.Buffer
	cmd.Stdout = &output
	cmd.Stderr = &output
	if err = cmd.Run(); err != nil {
		return fmt.Errorf("disk: mkfs.ext4 %s: %v: %s", path, err, toolOutput(output.String()))
	}

	// mke2fs writes through its own descriptor; fsync on ours flushes the
	// same inode, and the image is not usable until that succeeds.
	if err = f.Sync(); err != nil {
		return fmt.Errorf("disk: mkfs %s: %w", path, err)
	}
	if err = f.Close(); err != nil {
		return fmt.Errorf("disk: mkfs %s: %w", path, err)
	}
	if err = durable.SyncDir(filepath.Dir(path)); err != nil {
		return fmt.Errorf("disk: mkfs %s: %w", path, err)
	}
	return nil
}

// mkfsPath finds mkfs.ext4 even when sbin is not on PATH, as for a daemon
// started with a minimal environment.
func mkfsPath() (string, error) {
	if p, err := exec.LookPath("mkfs.ext4"); err == nil {
		return p, nil
	}
	for _, p := range []string{"/usr/sbin/mkfs.ext4", "/sbin/mkfs.ext4"} {
		if _, err := os.Stat(p); err == nil {
			return p, nil
		}
	}
	return "", errors.New("mkfs.ext4 not found (install e2fsprogs)")
}

// toolOutput is a tool's output as one line, saying so when there was none.
func toolOutput(s string) string {
	if s = oneline.Of(s); s == "" {
		return "(no output)"
	}
	return s
}

// FreeBytes is the space available to unprivileged writers on the
// filesystem holding dir.
func FreeBytes(dir string) (int64, error) {
	st, unit, err := statfs(dir)
	return int64(st.Bavail) * unit, err
}

// FilesystemBytes is the whole size of the filesystem holding dir.
func FilesystemBytes(dir string) (int64, error) {
	st, unit, err := statfs(dir)
	return int64(st.Blocks) * unit, err
}

// statfs returns dir's filesystem figures and the unit they count in.
func statfs(dir string) (unix.Statfs_t, int64, error) {
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		return st, 0, fmt.Errorf("disk: statfs %s: %w", dir, err)
	}
	// The kernel counts f_blocks and f_bavail in f_frsize units; f_bsize
	// only equals it on most local filesystems, so prefer f_frsize as
	// statvfs(3) does.
	unit := st.Frsize
	if unit == 0 {
		unit = st.Bsize
	}
	return st, unit, nil
}

// Preflight refuses, wrapping ErrInsufficientSpace, when need bytes exceed
// FreeBytes(dir).
func Preflight(dir string, need int64) error {
	if need < 0 {
		return fmt.Errorf("disk: preflight %s: negative need %d", dir, need)
	}
	free, err := FreeBytes(dir)
	if err != nil {
		return err
	}
	if need > free {
		n, f := Human(need), Human(free)
		if n == f { // rounding hid the difference; show it
			n, f = fmt.Sprintf("%d B", need), fmt.Sprintf("%d B", free)
		}
		return fmt.Errorf("disk: %w on %s: need %s, %s free", ErrInsufficientSpace, dir, n, f)
	}
	return nil
}

// Human formats n in IEC units with one decimal.
func Human(n int64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	div, exp := int64(unit), 0
	for m := n / unit; m >= unit; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", float64(n)/float64(div), "KMGTPE"[exp])
}
