package fsx

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// EnsureFile makes rel beneath root a regular file (created perm if
// missing, never truncated), refusing a symlink anywhere on the way or in
// its place and anything that is not a regular file. It is for a path
// nexus hands to another program that opens it by name (the VMM's serial
// log): once it is a regular file in a directory only nexus writes, that
// program's open lands on it.
func EnsureFile(root, rel string, perm os.FileMode) error {
	pfd, base, err := openParent(root, rel)
	if err != nil {
		return err
	}
	defer unix.Close(pfd)
	fd, err := unix.Openat(pfd, base, unix.O_WRONLY|unix.O_CREAT|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_CLOEXEC, uint32(perm.Perm()))
	if errors.Is(err, unix.ELOOP) {
		return fmt.Errorf("%s: %w", filepath.Join(root, rel), ErrSymlink)
	}
	if err != nil {
		// A FIFO with no reader or a socket fails the open itself
		// (ENXIO), a directory too (EISDIR): say what is there, not
		// the errno.
		var st unix.Stat_t
		if serr := unix.Fstatat(pfd, base, &st, unix.AT_SYMLINK_NOFOLLOW); serr == nil && st.Mode&unix.S_IFMT != unix.S_IFREG {
			return fmt.Errorf("%s is a %s: %w", filepath.Join(root, rel), kind(st.Mode&unix.S_IFMT), ErrNotRegular)
		}
		return fmt.Errorf("open %s: %w", filepath.Join(root, rel), err)
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return err
	}
	if mode := st.Mode & unix.S_IFMT; mode != unix.S_IFREG {
		return fmt.Errorf("%s is a %s: %w", filepath.Join(root, rel), kind(mode), ErrNotRegular)
	}
	// Its name outlives a power cut once this returns.
	if err := unix.Fsync(pfd); err != nil {
		return fmt.Errorf("fsync the directory of %s: %w", filepath.Join(root, rel), err)
	}
	return nil
}
