package fsx

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
)

// Input judges a file nexus is handed from outside the state root (an
// image) and returns the path to use, and record, from then on. A link is
// resolved once, here; the file it names must be a regular file with
// data, not a kernel pseudo-file (/proc and /sys report a size of 0, and
// /proc/self/mem is not an image), and outside the state root, whose
// files are nexus's own (a running sandbox's disk would be copied live)
// and where nexus follows no link.
func Input(root, path string) (string, error) {
	abs, err := filepath.Abs(path)
	if err != nil {
		return "", err
	}
	if in, r := within(root, abs); in {
		return "", fmt.Errorf("%s is inside the state root %s: nexus reads no input from its own files", abs, r)
	}
	resolved, err := filepath.EvalSymlinks(abs)
	if err != nil {
		return "", err
	}
	if in, r := within(root, resolved); in {
		return "", fmt.Errorf("%s resolves to %s, inside the state root %s: nexus reads no input from its own files", abs, resolved, r)
	}
	name := resolved
	if resolved != abs {
		name = abs + " (a link to " + resolved + ")"
	}
	var fs unix.Statfs_t
	if err := unix.Statfs(resolved, &fs); err == nil && (fs.Type == unix.PROC_SUPER_MAGIC || fs.Type == unix.SYSFS_MAGIC) {
		return "", fmt.Errorf("%s is a kernel pseudo-file (/proc or /sys), not an image", name)
	}
	info, err := os.Lstat(resolved)
	if err != nil {
		return "", err
	}
	if !info.Mode().IsRegular() {
		return "", fmt.Errorf("%s is not a regular file (%s)", name, TypeOf(info.Mode()))
	}
	if info.Size() == 0 {
		return "", fmt.Errorf("%s is empty (0 bytes)", name)
	}
	return resolved, nil
}

// within reports whether path lies under root, as given or with root's own
// links resolved, and names the root it lies under.
func within(root, path string) (bool, string) {
	roots := []string{filepath.Clean(root)}
	if r, err := filepath.EvalSymlinks(root); err == nil && r != roots[0] {
		roots = append(roots, r)
	}
	for _, r := range roots {
		if path == r || strings.HasPrefix(path, r+string(filepath.Separator)) {
			return true, r
		}
	}
	return false, ""
}

// TypeOf names a file's type for a person: "a directory", "a fifo", ...
func TypeOf(m os.FileMode) string {
	switch {
	case m&os.ModeSymlink != 0:
		return "a symbolic link"
	case m.IsDir():
		return "a directory"
	case m&os.ModeNamedPipe != 0:
		return "a fifo"
	case m&os.ModeSocket != 0:
		return "a socket"
	case m&os.ModeCharDevice != 0:
		return "a character device"
	case m&os.ModeDevice != 0:
		return "a block device"
	case m.IsRegular():
		return "a regular file"
	}
	return "a special file"
}
