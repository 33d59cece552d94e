// Package durable makes directory changes survive power loss: on Linux a
// file's fsync does not cover its directory entry, so whoever renames,
// creates or removes an entry fsyncs the directory (SyncDir after a
// create or rename, SyncUnlink after a removal). Publishing a file (temp,
// fsync, rename, dir fsync) is fsx.WriteFile, the one helper every caller
// uses; every delete beneath the root is fsx.Remove or fsx.Batch, which
// end in SyncUnlinkFd.
package durable

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"
)

// SyncDir fsyncs a directory so the entries renamed into it survive power
// loss; on Linux a file's fsync does not cover its directory entry.
func SyncDir(dir string) error {
	if testNoDirFsync {
		return nil
	}
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

// SyncUnlink fsyncs a directory after an entry was removed from it, so
// the removal survives power loss: a removal the journal records must not
// come back at a cut. Every delete under the state root ends here or in
// SyncUnlinkFd.
func SyncUnlink(dir string) error {
	if testNoUnlinkFsync {
		return nil
	}
	return SyncDir(dir)
}

// SyncUnlinkFd is SyncUnlink on an open directory (a delete made by
// descriptor, beneath the root).
func SyncUnlinkFd(fd int, dir string) error {
	if testNoDirFsync || testNoUnlinkFsync {
		return nil
	}
	if err := syscall.Fsync(fd); err != nil {
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

// SyncDirFiles makes a directory a VMM or a copy filled durable before it
// is recorded: every regular file directly in dir is fsynced, then dir,
// then its parent (which holds dir's own entry). The VMM that wrote some
// of them may not have synced them (Cloud Hypervisor writes a snapshot's
// files and never syncs them), so whoever journals the directory syncs
// it. Links and other non-regular entries are not followed or synced.
func SyncDirFiles(dir string) error {
	if testNoSnapshotFsync {
		return nil
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		return fmt.Errorf("fsync %s: %w", dir, err)
	}
	for _, e := range entries {
		if !e.Type().IsRegular() {
			continue
		}
		if err := syncFile(filepath.Join(dir, e.Name())); err != nil {
			return err
		}
	}
	if err := SyncDir(dir); err != nil {
		return err
	}
	return SyncDir(filepath.Dir(dir))
}

func syncFile(path string) error {
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NOFOLLOW|syscall.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("fsync %s: %w", path, err)
	}
	defer f.Close()
	if err := f.Sync(); err != nil {
		return fmt.Errorf("fsync %s: %w", path, err)
	}
	return nil
}
