// Package scan lists the reapable resources under a state root in one pass:
// a readdir of each directory in layout.Dirs and an fstatat of each entry
// relative to the directory's descriptor (never a path a symlink could
// redirect). It never opens volumes/, images/ or caches/: named volumes are
// user-owned, and the boundary is structural, not a filter.
package scan

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"time"

	"golang.org/x/sys/unix"

	"github.com/nexus-sandbox/nexus/layout"
	"github.com/nexus-sandbox/nexus/reaper"
)

// Result is what one scan found.
type Result struct {
	Entries []reaper.Entry
	// Opened lists every directory the scan opened, relative to the root:
	// the scan boundary, which must never widen to volumes/.
	Opened []string
	// Errors are directories that exist but could not be read; nothing in
	// them is listed, so nothing in them can be reaped.
	Errors []string
}

// Root scans root, each directory's entries in name order. A directory entry's Allocated is its own blocks only;
// TreeAllocated sums a whole tree for the few entries that need it.
func Root(root string) (Result, error) {
	var res Result
	rootfd, err := unix.Open(root, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC|unix.O_NOFOLLOW, 0)
	if err != nil {
		return res, fmt.Errorf("scan %s: %w", root, err)
	}
	defer unix.Close(rootfd)
	for _, dir := range layout.Dirs {
		if err := scanDir(rootfd, dir, &res); err != nil {
			res.Errors = append(res.Errors, fmt.Sprintf("%s: %v", filepath.Join(root, dir), err))
		}
	}
	return res, nil
}

func scanDir(rootfd int, dir string, res *Result) error {
	fd, err := unix.Openat(rootfd, dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC|unix.O_NOFOLLOW, 0)
	if errors.Is(err, unix.ENOENT) {
		return nil
	}
	if err != nil {
		return err
	}
	res.Opened = append(res.Opened, dir)
	d := os.NewFile(uintptr(fd), dir)
	defer d.Close()
	names, err := d.Readdirnames(-1)
	if err != nil {
		return err
	}
	// In name order, not the directory's: the owner lookups then walk the
	// store's path index from one end to the other, batch after batch.
	slices.Sort(names)
	res.Entries = slices.Grow(res.Entries, len(names))
	for _, name := range names {
		if layout.NotResource(dir, name) {
			continue
		}
		var st unix.Stat_t
		serr := unix.Fstatat(fd, name, &st, unix.AT_SYMLINK_NOFOLLOW)
		if errors.Is(serr, unix.ENOENT) {
			continue // gone since the readdir: nothing to judge
		}
		isDir := serr == nil && st.Mode&unix.S_IFMT == unix.S_IFDIR
		e := reaper.Identify(dir, name, isDir)
		if serr != nil {
			e.StatErr = serr.Error()
		} else {
			e.ModTime = time.Unix(st.Mtim.Unix())
			e.Allocated = st.Blocks * 512
			if st.Mode&unix.S_IFMT == unix.S_IFLNK {
				// A link where a resource should be: report it, never follow it.
				e.Symlink = true
			}
		}
		res.Entries = append(res.Entries, e)
	}
	return nil
}

// TreeAllocated sums st_blocks*512 of rel and everything below it, by
// descriptor, without following links. Errors count what was summed so far.
func TreeAllocated(root, rel string) int64 {
	fd, err := unix.Openat2(unix.AT_FDCWD, filepath.Join(root, rel), &unix.OpenHow{
		Flags: unix.O_RDONLY | unix.O_DIRECTORY | unix.O_CLOEXEC | unix.O_NOFOLLOW,
	})
	if err != nil {
		return 0
	}
	return treeAllocated(fd)
}

func treeAllocated(fd int) int64 {
	d := os.NewFile(uintptr(fd), "")
	defer d.Close()
	var total int64
	var st unix.Stat_t
	if unix.Fstat(fd, &st) == nil {
		total += st.Blocks * 512
	}
	names, _ := d.Readdirnames(-1)
	for _, n := range names {
		if unix.Fstatat(fd, n, &st, unix.AT_SYMLINK_NOFOLLOW) != nil {
			continue
		}
		if st.Mode&unix.S_IFMT == unix.S_IFDIR {
			if sub, err := unix.Openat(fd, n, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC|unix.O_NOFOLLOW, 0); err == nil {
				total += treeAllocated(sub)
			}
			continue
		}
		total += st.Blocks * 512
	}
	return total
}
