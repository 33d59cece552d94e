// Package fsx deletes and inspects paths beneath a state root without ever
// following a symlink, so no link planted inside the root can redirect a
// delete to something outside it.
package fsx

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/nexus-sandbox/nexus/host/durable"
)

// ErrSymlink means a path, or one of its parents, is a symbolic link.
var ErrSymlink = errors.New("refusing to follow a symbolic link")

// ErrEscapes means a relative path leaves the root.
var ErrEscapes = errors.New("path escapes the state root")

// openParent opens the directory holding rel, beneath root, refusing
// symlinks anywhere on the way (openat2 RESOLVE_BENEATH|RESOLVE_NO_SYMLINKS).
func openParent(root, rel string) (int, string, error) {
	rel = filepath.Clean(rel)
	if filepath.IsAbs(rel) || rel == "." || rel == ".." || strings.HasPrefix(rel, "../") {
		return -1, "", fmt.Errorf("%w: %q", ErrEscapes, rel)
	}
	rootfd, err := unix.Open(root, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC|unix.O_NOFOLLOW, 0)
	if err != nil {
		if errors.Is(err, unix.ELOOP) || errors.Is(err, unix.ENOTDIR) {
			return -1, "", fmt.Errorf("state root %s: %w", root, ErrSymlink)
		}
		return -1, "", fmt.Errorf("open %s: %w", root, err)
	}
	dir, base := filepath.Split(rel)
	if dir == "" {
		return rootfd, base, nil
	}
	defer unix.Close(rootfd)
	fd, err := unix.Openat2(rootfd, filepath.Clean(dir), &unix.OpenHow{
		Flags:   unix.O_RDONLY | unix.O_DIRECTORY | unix.O_CLOEXEC,
		Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS,
	})
	switch {
	case err == nil:
		return fd, base, nil
	case errors.Is(err, unix.ELOOP):
		return -1, "", fmt.Errorf("%s: %w", filepath.Join(root, dir), ErrSymlink)
	case errors.Is(err, unix.EXDEV):
		return -1, "", fmt.Errorf("%s: %w", filepath.Join(root, dir), ErrEscapes)
	case errors.Is(err, unix.ENOENT):
		return -1, "", os.ErrNotExist
	default:
		return -1, "", fmt.Errorf("open %s: %w", filepath.Join(root, dir), err)
	}
}

// Remove deletes rel beneath root: a file, socket or whole directory tree.
// A path that does not exist returns an error satisfying
// errors.Is(err, os.ErrNotExist); the caller decides whether that matters.
// If rel itself is a symlink it is refused, not removed: a link where a
// resource should be is something an operator must look at.
func Remove(root, rel string) error {
	pfd, base, err := openParent(root, rel)
	if err != nil {
		return err
	}
	defer unix.Close(pfd)
	var st unix.Stat_t
	if err := unix.Fstatat(pfd, base, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		if errors.Is(err, unix.ENOENT) {
			// An absence the caller will record is made durable too:
			// another process's unlink (a VMM removing its own socket)
			// may not have been, and a cut would bring the file back.
			if err := durable.SyncUnlinkFd(pfd, filepath.Dir(filepath.Join(root, rel))); err != nil {
				return err
			}
			return os.ErrNotExist
		}
		return fmt.Errorf("stat %s: %w", filepath.Join(root, rel), err)
	}
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFLNK:
		return fmt.Errorf("%s: %w", filepath.Join(root, rel), ErrSymlink)
	case unix.S_IFDIR:
		if err := removeTree(pfd, base); err != nil {
			return fmt.Errorf("remove %s: %w", filepath.Join(root, rel), err)
		}
	default:
		if err := unix.Unlinkat(pfd, base, 0); err != nil && !errors.Is(err, unix.ENOENT) {
			return fmt.Errorf("remove %s: %w", filepath.Join(root, rel), err)
		}
	}
	return durable.SyncUnlinkFd(pfd, filepath.Dir(filepath.Join(root, rel)))
}

// RemoveEmptyDir deletes the directory rel beneath root only if it is
// empty, atomically (rmdir): a directory that gained an entry meanwhile is
// left alone and reported with unix.ENOTEMPTY.
func RemoveEmptyDir(root, rel string) error {
	pfd, base, err := openParent(root, rel)
	if err != nil {
		return err
	}
	defer unix.Close(pfd)
	if err := unix.Unlinkat(pfd, base, unix.AT_REMOVEDIR); err != nil {
		if errors.Is(err, unix.ENOENT) {
			return os.ErrNotExist
		}
		return fmt.Errorf("rmdir %s: %w", filepath.Join(root, rel), err)
	}
	return durable.SyncUnlinkFd(pfd, filepath.Dir(filepath.Join(root, rel)))
}

// removeTree deletes directory name in dirfd and everything below it, by
// descriptor. Links inside are unlinked as links; their targets are never
// reached.
func removeTree(dirfd int, name string) error {
	fd, err := unix.Openat(dirfd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		if errors.Is(err, unix.ENOENT) {
			return nil
		}
		return err
	}
	d := os.NewFile(uintptr(fd), name)
	defer d.Close()
	for {
		names, err := d.Readdirnames(256)
		for _, n := range names {
			var st unix.Stat_t
			if err := unix.Fstatat(fd, n, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
				if errors.Is(err, unix.ENOENT) {
					continue
				}
				return err
			}
			if st.Mode&unix.S_IFMT == unix.S_IFDIR {
				err = removeTree(fd, n)
			} else {
				err = unix.Unlinkat(fd, n, 0)
			}
			if err != nil && !errors.Is(err, unix.ENOENT) {
				return err
			}
		}
		if err != nil || len(names) == 0 {
			break
		}
	}
	if err := unix.Unlinkat(dirfd, name, unix.AT_REMOVEDIR); err != nil && !errors.Is(err, unix.ENOENT) {
		return err
	}
	return nil
}

// Lexists reports whether rel exists beneath root (a symlink counts as
// existing; it is not followed). Errors other than "not there" are returned.
func Lexists(root, rel string) (bool, error) {
	pfd, base, err := openParent(root, rel)
	if errors.Is(err, os.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	defer unix.Close(pfd)
	var st unix.Stat_t
	err = unix.Fstatat(pfd, base, &st, unix.AT_SYMLINK_NOFOLLOW)
	if errors.Is(err, unix.ENOENT) {
		return false, nil
	}
	return err == nil, err
}

// EnsureDir creates rel beneath root (0700) if missing and refuses it, or
// any parent, being a symlink.
func EnsureDir(root, rel string) error { return MkdirAll(root, rel, 0o700) }
