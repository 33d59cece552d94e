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
		return fmt.Errorf("open %s: %w", filepath.Join(root, rel), err)
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return err
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG {
		return fmt.Errorf("%s is not a regular file", filepath.Join(root, rel))
	}
	return nil
}
