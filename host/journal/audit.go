package journal

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/nexus-sandbox/nexus/host/fsx"
)

// ErrNoJournal means a directory given as a journal holds no store.
var ErrNoJournal = errors.New("not a nexus journal")

// copyAttempts bounds retries of a copy taken while a live owner appends:
// the last record may be mid-write when it is read, which the block check
// of the copy reports; a second copy a moment later has it whole.
const copyAttempts = 3

// OpenCopy opens a private copy of the journal in dir, made under scratch,
// for auditing. The original is only read: its lock is not taken (a live
// daemon may hold it), and nats-server, which writes index files into any
// store it opens, only ever sees the copy. Close the returned Journal, then
// remove scratch.
func OpenCopy(ctx context.Context, dir, scratch string) (*Journal, error) {
	if fi, err := fsx.Stat(dir, formatFile); err != nil || !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("%w: %s has no %s", ErrNoJournal, dir, formatFile)
	}
	var lastErr error
	for attempt := range copyAttempts {
		dst := filepath.Join(scratch, fmt.Sprintf("journal-%d", attempt))
		if err := copyTree(dir, dst); err != nil {
			return nil, fmt.Errorf("journal: copy %s for audit: %w", dir, err)
		}
		j, err := Open(ctx, Options{Dir: dst})
		if err == nil {
			return j, nil
		}
		lastErr = err
		os.RemoveAll(dst)
		var torn *CorruptError
		if !errors.As(err, &torn) {
			break
		}
	}
	return nil, fmt.Errorf("journal: audit copy of %s: %w", dir, lastErr)
}

// copyTree copies the regular files and directories below src to dst. A
// symlink in a journal is refused: nexus never makes one, and following it
// could read outside the store.
func copyTree(src, dst string) error {
	return filepath.WalkDir(src, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(src, p)
		if err != nil {
			return err
		}
		target := filepath.Join(dst, rel)
		switch {
		case d.IsDir():
			return os.MkdirAll(target, 0o700)
		case d.Type()&fs.ModeSymlink != 0:
			return fmt.Errorf("%s is a symbolic link", p)
		case !d.Type().IsRegular(), rel == lockFile:
			return nil
		}
		return copyFile(src, rel, target)
	})
}

// copyFile reads through fsx: a file swapped for a link or a FIFO after
// the walk listed it is refused, not followed or blocked on.
func copyFile(root, rel, dst string) error {
	in, err := fsx.Open(root, rel)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}
