package fsx

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
)

// ErrNotRegular means a FIFO, socket, device or directory sits where nexus
// expects one of its own regular files. It is refused at once: a FIFO read
// would block forever and a device read could be anything.
var ErrNotRegular = errors.New("not a regular file")

// ErrNotDir means something other than a directory sits where nexus expects
// one of its own directories.
var ErrNotDir = errors.New("not a directory")

// beneath is how every open of nexus's own files resolves: inside the root,
// no symlink at any component (the last included), no /proc magic links.
const beneath = unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS

// relTo turns name (relative to root, or absolute beneath it) into a clean
// relative path; anything leaving root is ErrEscapes.
func relTo(root, name string) (string, error) {
	rel := name
	if filepath.IsAbs(name) {
		r, err := filepath.Rel(filepath.Clean(root), filepath.Clean(name))
		if err != nil {
			return "", fmt.Errorf("%w: %q", ErrEscapes, name)
		}
		rel = r
	}
	rel = filepath.Clean(rel)
	if filepath.IsAbs(rel) || rel == ".." || strings.HasPrefix(rel, "../") {
		return "", fmt.Errorf("%w: %q", ErrEscapes, name)
	}
	return rel, nil
}

// openRoot opens the state root itself; a symlinked root is refused like
// any other link nexus did not make.
func openRoot(root string) (int, error) {
	fd, err := unix.Open(root, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC|unix.O_NOFOLLOW, 0)
	if err != nil {
		if errors.Is(err, unix.ELOOP) || errors.Is(err, unix.ENOTDIR) {
			return -1, fmt.Errorf("state root %s: %w", root, ErrSymlink)
		}
		return -1, fmt.Errorf("open %s: %w", root, err)
	}
	return fd, nil
}

// openBeneath is the one open of everything nexus reads or writes under a
// root: openat2 with RESOLVE_BENEATH|RESOLVE_NO_SYMLINKS and O_NONBLOCK (so
// a planted FIFO cannot block the open), then fstat to check the type. A
// regular file gets O_NONBLOCK cleared again.
func openBeneath(root, name string, flag int, perm os.FileMode, wantDir bool) (*os.File, error) {
	how := &unix.OpenHow{Flags: uint64(flag) | unix.O_NONBLOCK | unix.O_CLOEXEC | unix.O_NOCTTY}
	if flag&unix.O_CREAT != 0 {
		how.Mode = uint64(perm.Perm()) // openat2 refuses a mode without O_CREAT
	}
	fd, full, err := openat2Beneath(root, name, how)
	if err != nil {
		return nil, err
	}
	want, notIt := uint32(unix.S_IFREG), ErrNotRegular
	if wantDir {
		want, notIt = unix.S_IFDIR, ErrNotDir
	}
	if err := wantType(fd, full, want, notIt); err != nil {
		return nil, err
	}
	if !wantDir {
		if err := unix.SetNonblock(fd, false); err != nil {
			unix.Close(fd)
			return nil, fmt.Errorf("open %s: %w", full, err)
		}
	}
	return os.NewFile(uintptr(fd), full), nil
}

// openat2Beneath opens name beneath root by how, with every component
// resolved beneath root and no link followed (how.Resolve is set here),
// and returns the descriptor and the full path it names.
func openat2Beneath(root, name string, how *unix.OpenHow) (int, string, error) {
	rel, err := relTo(root, name)
	if err != nil {
		return -1, "", err
	}
	full := filepath.Join(root, rel)
	rootfd, err := openRoot(root)
	if err != nil {
		return -1, "", err
	}
	defer unix.Close(rootfd)
	how.Resolve = beneath
	fd, err := unix.Openat2(rootfd, rel, how)
	if err != nil {
		return -1, "", openErr(full, err)
	}
	return fd, full, nil
}

// wantType checks that fd, opened at full, is of type want (an S_IFMT
// value); otherwise it closes fd and returns notIt naming what is there.
func wantType(fd int, full string, want uint32, notIt error) error {
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		unix.Close(fd)
		return fmt.Errorf("stat %s: %w", full, err)
	}
	if mode := st.Mode & unix.S_IFMT; mode != want {
		unix.Close(fd)
		return fmt.Errorf("%s is a %s: %w", full, kind(mode), notIt)
	}
	return nil
}

// openErr maps openat2's resolution errors to fsx's sentinels, keeping
// errors.Is(err, os.ErrNotExist) and os.ErrExist working for callers.
func openErr(full string, err error) error {
	switch {
	case errors.Is(err, unix.ELOOP):
		return fmt.Errorf("%s: %w", full, ErrSymlink)
	case errors.Is(err, unix.EXDEV):
		return fmt.Errorf("%s: %w", full, ErrEscapes)
	case errors.Is(err, unix.ENXIO):
		// A socket, or O_WRONLY|O_NONBLOCK on a FIFO with no reader.
		return fmt.Errorf("%s is a fifo or socket: %w", full, ErrNotRegular)
	case errors.Is(err, unix.ENOTDIR):
		return fmt.Errorf("%s: a parent is %w", full, ErrNotDir)
	}
	return &os.PathError{Op: "open", Path: full, Err: err}
}

func kind(mode uint32) string {
	switch mode {
	case unix.S_IFIFO:
		return "fifo"
	case unix.S_IFSOCK:
		return "socket"
	case unix.S_IFCHR:
		return "character device"
	case unix.S_IFBLK:
		return "block device"
	case unix.S_IFDIR:
		return "directory"
	case unix.S_IFREG:
		return "regular file"
	}
	return "special file"
}

// Open opens the regular file name (relative to root, or absolute beneath
// it) for reading.
func Open(root, name string) (*os.File, error) {
	return openBeneath(root, name, unix.O_RDONLY, 0, false)
}

// OpenFile opens the regular file name beneath root with flag (os.O_*),
// creating it with perm if asked. Whatever exists there must be a regular
// file; a symlink anywhere on the path is refused.
func OpenFile(root, name string, flag int, perm os.FileMode) (*os.File, error) {
	return openBeneath(root, name, flag, perm, false)
}

// OpenDir opens the directory name beneath root (for readdir, fsync, or as
// a dirfd for *at calls).
func OpenDir(root, name string) (*os.File, error) {
	return openBeneath(root, name, unix.O_RDONLY|unix.O_DIRECTORY, 0, true)
}

// ReadFile reads the regular file name beneath root.
func ReadFile(root, name string) ([]byte, error) {
	f, err := Open(root, name)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return io.ReadAll(f)
}

// Stat is fstat of name beneath root, no link followed anywhere.
func Stat(root, name string) (os.FileInfo, error) {
	fd, full, err := openat2Beneath(root, name, &unix.OpenHow{Flags: unix.O_PATH | unix.O_CLOEXEC})
	if err != nil {
		return nil, err
	}
	f := os.NewFile(uintptr(fd), full)
	defer f.Close()
	return f.Stat()
}

// WriteFile publishes data at name beneath root the way databases do: a
// temporary name in the same directory (O_EXCL), write, fsync, rename over
// name, fsync the directory. All of it by descriptor on a directory opened
// without following links, so a crash leaves the old file or the whole new
// one and a planted link never redirects the write.
func WriteFile(root, name string, data []byte, perm os.FileMode) error {
	return publish(root, name, data, perm, false, true)
}

// Replace publishes like WriteFile but without its fsyncs: the rename
// still swaps whole files for a reader that races it, but a crash may
// leave the old file, the new one, or a torn one. It is only for a cache
// whose content carries its own checksum, so that a torn copy is noticed
// and costs work, never a wrong answer.
func Replace(root, name string, data []byte, perm os.FileMode) error {
	return publish(root, name, data, perm, false, false)
}

// WriteNew publishes like WriteFile but never replaces: if name exists
// (however it came to be, even published a moment ago by another process)
// it returns an error satisfying errors.Is(err, os.ErrExist) and leaves it
// alone. It is for a value minted once, where the first writer wins.
func WriteNew(root, name string, data []byte, perm os.FileMode) error {
	return publish(root, name, data, perm, true, true)
}

func publish(root, name string, data []byte, perm os.FileMode, noReplace, durable bool) error {
	rel, err := relTo(root, name)
	if err != nil {
		return err
	}
	full := filepath.Join(root, rel)
	d, err := OpenDir(root, filepath.Dir(rel))
	if err != nil {
		return fmt.Errorf("publish %s: %w", full, err)
	}
	defer d.Close()
	dfd := int(d.Fd())
	base := filepath.Base(rel)
	var tmp string
	var fd int
	for i := 0; ; i++ {
		tmp = fmt.Sprintf(".%s.tmp-%d-%d", base, os.Getpid(), i)
		fd, err = unix.Openat(dfd, tmp, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, uint32(perm.Perm()))
		if !errors.Is(err, unix.EEXIST) || i > 100 {
			break
		}
	}
	if err != nil {
		return fmt.Errorf("publish %s: %w", full, err)
	}
	f := os.NewFile(uintptr(fd), filepath.Join(filepath.Dir(full), tmp))
	published := false
	defer func() {
		if !published {
			unix.Unlinkat(dfd, tmp, 0)
		}
	}()
	// fchmod: the umask must not narrow or widen what the caller asked for.
	if err := f.Chmod(perm); err != nil {
		f.Close()
		return fmt.Errorf("publish %s: %w", full, err)
	}
	if _, err := f.Write(data); err != nil {
		f.Close()
		return fmt.Errorf("publish %s: write: %w", full, err)
	}
	if durable {
		if err := f.Sync(); err != nil {
			f.Close()
			return fmt.Errorf("publish %s: fsync: %w", full, err)
		}
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("publish %s: %w", full, err)
	}
	if noReplace {
		err = unix.Renameat2(dfd, tmp, dfd, base, unix.RENAME_NOREPLACE)
		if errors.Is(err, unix.EEXIST) {
			return fmt.Errorf("publish %s: %w", full, os.ErrExist)
		}
	} else {
		err = unix.Renameat(dfd, tmp, dfd, base)
	}
	if err != nil {
		return fmt.Errorf("publish %s: rename: %w", full, err)
	}
	published = true
	if !durable {
		return nil
	}
	if err := d.Sync(); err != nil {
		return fmt.Errorf("publish %s: fsync dir: %w", full, err)
	}
	return nil
}

// MkdirAll creates the directory name beneath root and any missing parents
// (mkdirat by descriptor, perm for the new ones), refusing a symlink or a
// non-directory at any level. It returns nil if the directory exists. Each
// directory it makes is durable when it returns: its parent is fsynced.
func MkdirAll(root, name string, perm os.FileMode) error {
	rel, err := relTo(root, name)
	if err != nil {
		return err
	}
	fd, err := openRoot(root)
	if err != nil {
		return err
	}
	if rel == "." {
		unix.Close(fd)
		return nil
	}
	cur := root
	for _, part := range strings.Split(rel, "/") {
		cur = filepath.Join(cur, part)
		err := unix.Mkdirat(fd, part, uint32(perm.Perm()))
		if err == nil {
			err = unix.Fsync(fd)
		}
		if err != nil && !errors.Is(err, unix.EEXIST) {
			unix.Close(fd)
			return &os.PathError{Op: "mkdir", Path: cur, Err: err}
		}
		next, err := unix.Openat2(fd, part, &unix.OpenHow{Flags: unix.O_RDONLY | unix.O_DIRECTORY | unix.O_CLOEXEC, Resolve: beneath})
		unix.Close(fd)
		if err != nil {
			if errors.Is(err, unix.ENOTDIR) {
				return fmt.Errorf("%s: %w", cur, ErrNotDir)
			}
			return openErr(cur, err)
		}
		fd = next
	}
	unix.Close(fd)
	return nil
}

// Mkdir creates the single directory name beneath root (its parent must
// exist and be reached without links). os.ErrExist is returned as is, so a
// caller that must make the directory itself (O_EXCL for directories) can
// tell. The new directory is durable when it returns: its parent is
// fsynced.
func Mkdir(root, name string, perm os.FileMode) error {
	rel, err := relTo(root, name)
	if err != nil {
		return err
	}
	d, err := OpenDir(root, filepath.Dir(rel))
	if err != nil {
		return err
	}
	defer d.Close()
	if err := unix.Mkdirat(int(d.Fd()), filepath.Base(rel), uint32(perm.Perm())); err != nil {
		return &os.PathError{Op: "mkdir", Path: filepath.Join(root, rel), Err: err}
	}
	if err := d.Sync(); err != nil {
		return &os.PathError{Op: "fsync", Path: filepath.Join(root, filepath.Dir(rel)), Err: err}
	}
	return nil
}

// RegularFile refuses an input nexus is handed from outside the root (an
// image, a kernel, an initramfs) unless path itself, not followed if it is
// a link, is a regular file.
func RegularFile(path string) error {
	info, err := os.Lstat(path)
	if err != nil {
		return err
	}
	if !info.Mode().IsRegular() {
		return fmt.Errorf("%s is not a regular file", path)
	}
	return nil
}
