package journal

import (
	"crypto/sha256"
	"fmt"
	"io/fs"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// Fingerprint is a digest of the journal's files as they stand on disk:
// every entry under the directory but the lock file, by name, type, size,
// device, inode, mtime and ctime. Whatever changes what the journal holds
// (an append grows a block; a repair truncates or replaces one; a server
// started on it rewrites its index at shutdown; a copy or restore makes new
// inodes) changes the fingerprint, and ctime cannot be set back from user
// space. Taken with the lock held and no server running (Locked, or
// Journal.CloseThen), it describes files nothing else is writing; it is
// what lets a reader of the journal's folds know, without starting the
// server, that the journal has not moved since they were last made current.
func (l *Locked) Fingerprint() ([]byte, error) { return fingerprint(l.dir, false) }

// Fingerprint is Locked.Fingerprint for CloseThen's callback, after the
// server stopped: each file is fsynced first, so the state it describes is
// the one a power loss leaves.
func (j *Journal) Fingerprint() ([]byte, error) { return fingerprint(j.dir, true) }

func fingerprint(dir string, sync bool) ([]byte, error) {
	h := sha256.New()
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(dir, path)
		if err != nil {
			return err
		}
		if rel == lockFile {
			return nil
		}
		if sync && (d.Type().IsRegular() || d.IsDir()) {
			if err := fsyncPath(path); err != nil {
				return err
			}
		}
		var st unix.Stat_t
		if err := unix.Lstat(path, &st); err != nil {
			return err
		}
		fmt.Fprintf(h, "%q %o %d %d %d %d.%09d %d.%09d\n", rel, st.Mode, st.Size, st.Dev, st.Ino,
			st.Mtim.Sec, st.Mtim.Nsec, st.Ctim.Sec, st.Ctim.Nsec)
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("journal %s: fingerprint: %w", dir, err)
	}
	return h.Sum(nil), nil
}
