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

// Root scans root, each directory's entries in name order. A directory
// entry's Allocated is its own blocks only; TreeAllocated sums a whole
// tree for the few entries that need it.
func Root(root string) (Result, error) {
	var res Result
	rootfd, err := unix.Open(root, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC|unix.O_NOFOLLOW, 0)
	if err != nil {
		return res, fmt.Errorf("scan %s: %w", root, err)
	}
	defer unix.Close(rootfd)
	// Every directory is listed first, so that the entries are allocated
	// once, at their number: a root's scan holds hundreds of thousands.
	var listed []listing
	total := 0
	for _, dir := range layout.Dirs {
		l, err := list(rootfd, dir)
		if l.d != nil {
			defer l.d.Close()
			res.Opened = append(res.Opened, dir)
		}
		if err != nil {
			res.Errors = append(res.Errors, fmt.Sprintf("%s: %v", filepath.Join(root, dir), err))
			continue
		}
		if l.d != nil {
			listed = append(listed, l)
			total += len(l.names)
		}
	}
	res.Entries = make([]reaper.Entry, 0, total)
	for _, l := range listed {
		stat(l, &res)
	}
	return res, nil
}

// listing is one directory opened and its names read, in name order.
type listing struct {
	dir   string
	d     *os.File
	names []string
}

// list opens dir and reads its names; a directory that is not there is
// no listing and no error.
func list(rootfd int, dir string) (listing, error) {
	fd, err := unix.Openat(rootfd, dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC|unix.O_NOFOLLOW, 0)
	if errors.Is(err, unix.ENOENT) {
		return listing{}, nil
	}
	if err != nil {
		return listing{}, err
	}
	l := listing{dir: dir, d: os.NewFile(uintptr(fd), dir)}
	if l.names, err = l.d.Readdirnames(-1); err != nil {
		return l, err
	}
	// In name order, not the directory's: the owner lookups then walk the
	// store's path index from one end to the other, batch after batch.
	slices.Sort(l.names)
	return l, nil
}

// stat adds the entries of l to res, each stat'ed relative to its
// directory's descriptor.
func stat(l listing, res *Result) {
	fd, dir := int(l.d.Fd()), l.dir
	for _, name := range l.names {
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
