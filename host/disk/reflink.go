package disk

import (
	"sync"

	"golang.org/x/sys/unix"
)

// reflinkByDev remembers each filesystem's answer: whether a filesystem
// shares extents does not change while it is mounted, and the probe costs
// two files and a write.
var reflinkByDev sync.Map // uint64 st_dev → bool

// Reflinks reports whether FICLONE shares extents on the filesystem
// holding dir, probed once per filesystem (by st_dev) by cloning a one
// block anonymous file (O_TMPFILE: nothing is left behind, even by a
// crash) into another. Any failure answers false, so a caller charging
// space for a copy charges the full copy.
func Reflinks(dir string) bool {
	var st unix.Stat_t
	if err := unix.Stat(dir, &st); err != nil {
		return false
	}
	if v, ok := reflinkByDev.Load(st.Dev); ok {
		return v.(bool)
	}
	ok := probeReflink(dir)
	reflinkByDev.Store(st.Dev, ok)
	return ok
}

func probeReflink(dir string) bool {
	src, err := unix.Open(dir, unix.O_TMPFILE|unix.O_RDWR|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return false
	}
	defer unix.Close(src)
	if n, err := unix.Pwrite(src, make([]byte, holeBlock), 0); err != nil || n != holeBlock {
		return false
	}
	dst, err := unix.Open(dir, unix.O_TMPFILE|unix.O_RDWR|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return false
	}
	defer unix.Close(dst)
	return unix.IoctlFileClone(dst, src) == nil
}

// SameFilesystem reports whether a and b are on one filesystem (st_dev),
// the condition for a FICLONE from one to the other.
func SameFilesystem(a, b string) bool {
	var sa, sb unix.Stat_t
	return unix.Stat(a, &sa) == nil && unix.Stat(b, &sb) == nil && sa.Dev == sb.Dev
}
