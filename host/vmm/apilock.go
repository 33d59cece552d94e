package vmm

import (
	"io"
	"os"

	"golang.org/x/sys/unix"
)

// APISocketLockHeld reports whether a process holds the lock of a CH v53+
// API socket lock file (<socket>.lock): CH holds it for as long as it
// runs. A missing file is an error satisfying errors.Is(err,
// os.ErrNotExist); a symlink is refused, never followed.
func APISocketLockHeld(path string) (bool, error) {
	f, err := os.OpenFile(path, os.O_RDONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC|unix.O_NONBLOCK, 0)
	if err != nil {
		return false, err
	}
	defer f.Close()
	lk := unix.Flock_t{Type: unix.F_WRLCK, Whence: io.SeekStart}
	if err := unix.FcntlFlock(f.Fd(), unix.F_OFD_GETLK, &lk); err != nil {
		return false, err
	}
	return lk.Type != unix.F_UNLCK, nil
}
