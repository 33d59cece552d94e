// Package durable makes renames survive power loss: on Linux a file's fsync
// does not cover its directory entry, so whoever renames or creates an
// entry fsyncs the directory. Publishing a file (temp, fsync, rename, dir
// fsync) is fsx.WriteFile, the one helper every caller uses.
package durable

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
)

// SyncDir fsyncs a directory so the entries renamed into it survive power
// loss; on Linux a file's fsync does not cover its directory entry.
func SyncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("fsync dir %s: %w", dir, err)
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("fsync dir %s: %w", dir, err)
	}
	return nil
}

// Publish writes a file outside the state root (the operator's own, e.g.
// `nexus cp`'s destination) as nexus writes its own: fill writes a
// temporary file beside path, which is fsynced, renamed over path, and its
// directory fsynced. A failure leaves path as it was.
func Publish(path string, perm os.FileMode, fill func(*os.File) error) error {
	dir, base := filepath.Split(path)
	if dir == "" {
		dir = "."
	}
	f, err := os.CreateTemp(dir, "."+base+".nexus-*")
	if errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("%s: no such directory %s", path, filepath.Clean(dir))
	}
	if err != nil {
		var pe *fs.PathError
		if errors.As(err, &pe) {
			err = pe.Err // the temporary file's name says nothing to the caller
		}
		return fmt.Errorf("%s: %w", path, err)
	}
	defer os.Remove(f.Name()) // a no-op once renamed
	err = fill(f)
	if err == nil {
		err = f.Chmod(perm)
	}
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(f.Name(), path)
	}
	if err != nil {
		return err
	}
	return SyncDir(dir)
}
