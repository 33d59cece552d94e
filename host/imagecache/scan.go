package imagecache

import (
	"errors"
	"fmt"
	"os"

	"github.com/oklog/ulid/v2"
	"golang.org/x/sys/unix"

	"github.com/nexus-sandbox/nexus/host/durable"
	"github.com/nexus-sandbox/nexus/host/fsx"
	"github.com/nexus-sandbox/nexus/layout"
)

// Entry is one committed entry found on disk.
type Entry struct {
	CacheID   string
	Allocated int64 // st_blocks*512 of the root disk
	Apparent  int64 // st_size of the root disk
	ModMs     int64 // the root disk's mtime, Unix ms
}

// Skipped is a name under images/ that looks like an entry but is not a
// committed one, with the reason; it is never followed or deleted.
type Skipped struct {
	Name   string `json:"name"`
	Reason string `json:"reason"`
}

// Scan lists committed entries: directories under images/ with a cache-ID
// name holding a regular disk.raw. Bookkeeping (".lease", ".prepare-*",
// ".pruning-*") and overlay templates ("*.template") are not looked at.
// It costs one getdents pass and two fstatat per entry, no reads. A
// missing images/ is an empty cache.
func Scan(root layout.Root) ([]Entry, []Skipped, error) {
	dfd, err := unix.Open(root.Images(), unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	switch {
	case errors.Is(err, unix.ENOENT):
		return nil, nil, nil
	case errors.Is(err, unix.ELOOP), errors.Is(err, unix.ENOTDIR):
		return nil, nil, fmt.Errorf("%s: %w", root.Images(), fsx.ErrSymlink)
	case err != nil:
		return nil, nil, fmt.Errorf("open %s: %w", root.Images(), err)
	}
	d := os.NewFile(uintptr(dfd), root.Images())
	defer d.Close()
	names, err := d.Readdirnames(-1)
	if err != nil {
		return nil, nil, fmt.Errorf("read %s: %w", root.Images(), err)
	}
	entries := make([]Entry, 0, len(names))
	var skipped []Skipped
	for _, name := range names {
		if !layout.IsImageEntryName(name) {
			continue
		}
		var st unix.Stat_t
		if err := unix.Fstatat(dfd, name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			continue // gone since getdents
		}
		switch st.Mode & unix.S_IFMT {
		case unix.S_IFDIR:
		case unix.S_IFLNK:
			skipped = append(skipped, Skipped{name, "symbolic link: never followed"})
			continue
		default:
			skipped = append(skipped, Skipped{name, "not a directory"})
			continue
		}
		// name was a real directory a moment ago; the disk inside must be a
		// regular file itself, never a link to one.
		if err := unix.Fstatat(dfd, name+"/"+layout.ImageDiskName, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			skipped = append(skipped, Skipped{name, "no committed root disk"})
			continue
		}
		if st.Mode&unix.S_IFMT != unix.S_IFREG {
			skipped = append(skipped, Skipped{name, layout.ImageDiskName + " is not a regular file"})
			continue
		}
		entries = append(entries, Entry{CacheID: name, Allocated: st.Blocks * 512, Apparent: st.Size,
			ModMs: st.Mtim.Sec*1000 + st.Mtim.Nsec/1e6})
	}
	return entries, skipped, nil
}

// Remove deletes the committed entry cacheID: it is first renamed to a
// .pruning-* name (so no half-deleted tree ever sits under a cache ID, and
// a crash leaves a leftover prune recognises), then deleted by descriptor,
// symlinks inside unlinked, never followed. The entry itself must be a
// real directory: a symlink is refused.
func Remove(root layout.Root, cacheID string) error {
	if !layout.IsImageEntryName(cacheID) {
		return fmt.Errorf("%w: cache id %q", fsx.ErrEscapes, cacheID)
	}
	dfd, err := unix.Open(root.Images(), unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("open %s: %w", root.Images(), err)
	}
	defer unix.Close(dfd)
	var st unix.Stat_t
	if err := unix.Fstatat(dfd, cacheID, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return fmt.Errorf("stat %s: %w", root.ImageEntry(cacheID), err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFDIR {
		return fmt.Errorf("%s: %w", root.ImageEntry(cacheID), fsx.ErrSymlink)
	}
	doomed := root.ImagePruneDir(cacheID, ulid.Make().String())
	rel := root.Rel(doomed)
	if err := unix.Renameat2(dfd, cacheID, dfd, rel[len("images/"):], unix.RENAME_NOREPLACE); err != nil {
		return fmt.Errorf("prune %s: %w", root.ImageEntry(cacheID), err)
	}
	if err := unix.Fsync(dfd); err != nil {
		return fmt.Errorf("prune %s: %w", root.ImageEntry(cacheID), err)
	}
	return fsx.Remove(string(root), rel)
}

// RemoveLeftovers deletes .pruning-* dirs an interrupted prune left. Only
// a caller holding the cache lease exclusively may call it.
func RemoveLeftovers(root layout.Root) error {
	d, err := fsx.OpenDir(string(root), "images")
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	names, err := d.Readdirnames(-1)
	d.Close()
	if err != nil {
		return err
	}
	for _, name := range names {
		if layout.IsPruneLeftover(name) {
			if err := fsx.Remove(string(root), "images/"+name); err != nil && !errors.Is(err, os.ErrNotExist) {
				return err
			}
		}
	}
	return durable.SyncDir(root.Images())
}
