package fsx

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// ErrStateRoot means the state root cannot be used as given.
var ErrStateRoot = errors.New("unusable state root")

// PrepareRoot makes root absolute, creates it 0700 if missing, and refuses
// a root that is not a directory, is a symlink, is writable by group or
// others, belongs to another user, or cannot be written.
func PrepareRoot(root string) (string, error) {
	if root == "" {
		return "", fmt.Errorf("%w: empty path", ErrStateRoot)
	}
	abs, err := filepath.Abs(root)
	if err != nil {
		return "", fmt.Errorf("%w: %v", ErrStateRoot, err)
	}
	if err := os.MkdirAll(abs, 0o700); err != nil {
		return "", fmt.Errorf("%w: %s: %v", ErrStateRoot, abs, errors.Unwrap(err))
	}
	var st unix.Stat_t
	if err := unix.Lstat(abs, &st); err != nil {
		return "", fmt.Errorf("%w: %s: %v", ErrStateRoot, abs, err)
	}
	switch {
	case st.Mode&unix.S_IFMT == unix.S_IFLNK:
		to, _ := filepath.EvalSymlinks(abs)
		return "", fmt.Errorf("%w: %s is a symlink (to %s), and nexus follows none in its root: give the directory itself (--state-dir %s)", ErrStateRoot, abs, to, to)
	case st.Mode&unix.S_IFMT != unix.S_IFDIR:
		return "", fmt.Errorf("%w: %s is not a directory", ErrStateRoot, abs)
	case st.Uid != uint32(os.Geteuid()):
		return "", fmt.Errorf("%w: %s belongs to uid %d, not %d", ErrStateRoot, abs, st.Uid, os.Geteuid())
	case st.Mode&0o022 != 0:
		return "", fmt.Errorf("%w: %s is writable by group or others (mode %04o; chmod 700 %s)", ErrStateRoot, abs, st.Mode&0o7777, abs)
	}
	if err := unix.Access(abs, unix.W_OK); err != nil {
		return "", fmt.Errorf("%w: %s is not writable: %v", ErrStateRoot, abs, err)
	}
	return abs, nil
}
