package imagecache

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/oklog/ulid/v2"
	"golang.org/x/sys/unix"

	"github.com/nexus-sandbox/nexus/host/disk"
	"github.com/nexus-sandbox/nexus/host/durable"
	"github.com/nexus-sandbox/nexus/host/fsx"
	"github.com/nexus-sandbox/nexus/layout"
)

// Template returns images/ext4-<sizeBytes>.template/disk.raw, an empty
// ext4 image of sizeBytes that new empty workspace disks are cloned from
// (a FICLONE, or a sparse copy of its few MiB of metadata) instead of
// running mkfs.ext4 for every create. It is made once, like a cache entry:
// mkfs into a private .prepare-* dir, fsynced, renamed into place with
// RENAME_NOREPLACE, images/ fsynced, so a template under its name is
// always complete; of two concurrent makers the first rename wins. The
// caller holds the cache lease shared, as for preparing an entry. Every
// clone shares the template's filesystem UUID, which only matters to a
// guest that mounts two of them at once, and no sandbox has two.
func Template(root layout.Root, sizeBytes int64) (path string, made bool, err error) {
	path = root.OverlayTemplateDisk(sizeBytes)
	if err := fsx.EnsureDir(string(root), "images"); err != nil {
		return "", false, err
	}
	if err := checkTemplate(root, sizeBytes); err == nil {
		return path, false, nil
	} else if !errors.Is(err, os.ErrNotExist) {
		return "", false, err
	}
	name := filepath.Base(root.OverlayTemplate(sizeBytes))
	prep := root.ImagePrepareDir(name, ulid.Make().String())
	if err := fsx.Mkdir(string(root), prep, 0o700); err != nil {
		return "", false, fmt.Errorf("overlay template: %w", err)
	}
	defer func() {
		if !made {
			fsx.Remove(string(root), root.Rel(prep))
		}
	}()
	if err := disk.MakeExt4(filepath.Join(prep, layout.ImageDiskName), sizeBytes, ""); err != nil {
		return "", false, fmt.Errorf("overlay template: %w", err)
	}
	err = unix.Renameat2(unix.AT_FDCWD, prep, unix.AT_FDCWD, root.OverlayTemplate(sizeBytes), unix.RENAME_NOREPLACE)
	if errors.Is(err, unix.EEXIST) || errors.Is(err, unix.ENOTEMPTY) {
		return path, false, checkTemplate(root, sizeBytes)
	}
	if err != nil {
		return "", false, fmt.Errorf("overlay template: %w", err)
	}
	made = true
	if err := durable.SyncDir(root.Images()); err != nil {
		return "", true, fmt.Errorf("overlay template: %w", err)
	}
	return path, true, nil
}

// checkTemplate verifies the template of sizeBytes is a real directory
// (never a symlink) holding a regular disk.raw of that size; a missing
// one satisfies errors.Is(err, os.ErrNotExist).
func checkTemplate(root layout.Root, sizeBytes int64) error {
	dir := root.OverlayTemplate(sizeBytes)
	info, err := os.Lstat(dir)
	if err != nil {
		return err
	}
	if !info.IsDir() {
		return fmt.Errorf("%w: %s is not a directory (a symlink is never followed); remove it", ErrDamaged, dir)
	}
	size, err := disk.Stat(root.OverlayTemplateDisk(sizeBytes))
	if err != nil {
		return fmt.Errorf("%w: %v; remove %s", ErrDamaged, err, dir)
	}
	if size.Apparent != sizeBytes {
		return fmt.Errorf("%w: %s is %d bytes, want %d; remove %s", ErrDamaged, root.OverlayTemplateDisk(sizeBytes), size.Apparent, sizeBytes, dir)
	}
	return nil
}
