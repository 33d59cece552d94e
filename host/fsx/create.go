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
	return EnsureFiles(root, []string{rel}, perm)
}

// EnsureFiles is EnsureFile for several paths, with one fsync of each
// directory that holds them, once every one of them is made.
func EnsureFiles(root string, rels []string, perm os.FileMode) error {
	parents := map[string]int{}
	defer func() {
		for _, pfd := range parents {
			unix.Close(pfd)
		}
	}()
	var order []string
	for _, rel := range rels {
		pfd, base, err := openParent(root, rel)
		if err != nil {
			return err
		}
		dir := filepath.Dir(filepath.Clean(rel))
		if _, ok := parents[dir]; ok {
			unix.Close(pfd)
			pfd = parents[dir]
		} else {
			parents[dir] = pfd
			order = append(order, dir)
		}
		if err := ensureFileAt(pfd, base, filepath.Join(root, rel), perm); err != nil {
			// What was made before the failure is as durable as if each
			// had been ensured alone: a caller may still journal it.
			for _, dir := range order {
				unix.Fsync(parents[dir])
			}
			return err
		}
	}
	// Their names outlive a power cut once this returns.
	for _, dir := range order {
		if err := unix.Fsync(parents[dir]); err != nil {
			return fmt.Errorf("fsync %s: %w", filepath.Join(root, dir), err)
		}
	}
	return nil
}

// ensureFileAt makes base in the directory pfd a regular file; path names
// it in errors.
func ensureFileAt(pfd int, base, path string, perm os.FileMode) error {
	fd, err := unix.Openat(pfd, base, unix.O_WRONLY|unix.O_CREAT|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_CLOEXEC, uint32(perm.Perm()))
	if errors.Is(err, unix.ELOOP) {
		return fmt.Errorf("%s: %w", path, ErrSymlink)
	}
	if err != nil {
		// A FIFO with no reader or a socket fails the open itself
		// (ENXIO), a directory too (EISDIR): say what is there, not
		// the errno.
		var st unix.Stat_t
		if serr := unix.Fstatat(pfd, base, &st, unix.AT_SYMLINK_NOFOLLOW); serr == nil && st.Mode&unix.S_IFMT != unix.S_IFREG {
			return fmt.Errorf("%s is a %s: %w", path, kind(st.Mode&unix.S_IFMT), ErrNotRegular)
		}
		return fmt.Errorf("open %s: %w", path, err)
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return err
	}
	if mode := st.Mode & unix.S_IFMT; mode != unix.S_IFREG {
		return fmt.Errorf("%s is a %s: %w", path, kind(mode), ErrNotRegular)
	}
	return nil
}
