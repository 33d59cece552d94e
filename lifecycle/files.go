package lifecycle

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/nexus-sandbox/nexus/host/fsx"
	"github.com/nexus-sandbox/nexus/host/lease"
	"github.com/nexus-sandbox/nexus/host/vmm"
)

// Every file nexus opens under its state root goes through fsx (openat2
// RESOLVE_BENEATH|RESOLVE_NO_SYMLINKS, O_NONBLOCK, fstat): a link planted
// anywhere on the path, or a FIFO where a file belongs, is a one-line error
// instead of a write outside the root or a hang. These are the lifecycle's
// uses that need more than fsx.ReadFile/WriteFile.

// ConfigFile is the name of nexus's config file in the state root.
const ConfigFile = "config.toml"

// ReadConfig reads <root>/config.toml through fsx, so a FIFO or a link
// planted there is a one-line error, not a hang or a read of something
// outside the root.
func ReadConfig(root string) ([]byte, error) { return fsx.ReadFile(root, ConfigFile) }

// volumeLock takes volumes/<name>/.lock, refusing a volume directory that
// is a link (the lock file would otherwise be created wherever it points).
func (m *Manager) volumeLock(name string) (*lease.Lease, error) {
	f, err := fsx.OpenFile(string(m.Root), filepath.Join(m.Root.VolumeDir(name), ".lock"), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, err
	}
	return lease.TryAcquireFile(f)
}

// checkDisks refuses to hand a VMM a disk path that is a link, crosses a
// link, or is not a regular file: the VMM opens paths, not descriptors,
// so this is the last point where nexus can keep it inside the root.
func (m *Manager) checkDisks(disks []vmm.Disk) error {
	for _, d := range disks {
		f, err := fsx.Open(string(m.Root), d.Path)
		if err != nil {
			return fmt.Errorf("disk: %w", err)
		}
		f.Close()
	}
	return nil
}

// readDir lists a directory of the root (os.ReadDir's order) without
// following a link at it or above it.
func (m *Manager) readDir(dir string) ([]os.DirEntry, error) {
	d, err := fsx.OpenDir(string(m.Root), dir)
	if err != nil {
		return nil, err
	}
	defer d.Close()
	entries, err := d.ReadDir(-1)
	slices.SortFunc(entries, func(a, b os.DirEntry) int { return strings.Compare(a.Name(), b.Name()) })
	return entries, err
}
