// Package durable makes renames survive power loss: on Linux a file's fsync
// does not cover its directory entry, so whoever renames or creates an
// entry fsyncs the directory. Publishing a file (temp, fsync, rename, dir
// fsync) is fsx.WriteFile, the one helper every caller uses.
package durable

import (
	"fmt"
	"os"
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
