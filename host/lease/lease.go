// Package lease provides flock(2) leases: exclusive locks the kernel drops
// when their holder dies for any reason, SIGKILL and reboot included.
package lease

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/nexus-sandbox/nexus/host/fsx"
)

// ErrHeld means another open file description holds the lease.
var ErrHeld = errors.New("lease is held")

// Lease is a held exclusive flock on one file.
type Lease struct {
	f *os.File
}

// TryAcquire takes an exclusive lease on path without waiting, creating the
// file (mode 0600) if needed. It records the holder's pid in the file so a
// refusal can name who holds it.
func TryAcquire(path string) (*Lease, error) {
	f, err := openLeaseFile(path)
	if err != nil {
		return nil, err
	}
	return TryAcquireFile(f)
}

// TryAcquireFile is TryAcquire on a file the caller opened read-write (for
// nexus's own files, through fsx). It takes ownership of f: on failure f is
// closed, on success Release closes it.
func TryAcquireFile(f *os.File) (*Lease, error) {
	path := f.Name()
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		f.Close()
		if errors.Is(err, unix.EWOULDBLOCK) {
			return nil, fmt.Errorf("%s: %w%s", path, ErrHeld, holderSuffix(path))
		}
		return nil, fmt.Errorf("flock %s: %w", path, err)
	}
	// The pid is advisory text for error messages; the flock is the truth.
	if err := f.Truncate(0); err == nil {
		f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0)
	}
	return &Lease{f: f}, nil
}

// Held says whether some process holds a flock on the file at path, by
// trying a shared one without waiting and dropping it at once (so it
// never blocks a holder). The file is opened beneath its directory (fsx):
// a link or a FIFO planted under its name is an error, never followed and
// never a blocking open.
func Held(path string) (bool, error) {
	f, err := fsx.Open(filepath.Dir(path), filepath.Base(path))
	if err != nil {
		return false, err
	}
	defer f.Close()
	err = unix.Flock(int(f.Fd()), unix.LOCK_SH|unix.LOCK_NB)
	if errors.Is(err, unix.EWOULDBLOCK) {
		return true, nil
	}
	if err != nil {
		return false, fmt.Errorf("probe lease %s: %w", path, err)
	}
	return false, nil
}

// openLeaseFile opens (creating 0600) a lease file through fsx, beneath its
// directory: a link or a FIFO planted under a lease's name is refused, not
// followed out of the state root or blocked on.
func openLeaseFile(path string) (*os.File, error) {
	return fsx.OpenFile(filepath.Dir(path), filepath.Base(path), os.O_RDWR|os.O_CREATE, 0o600)
}

// Release drops the lease. Process death drops it too: the kernel closes
// the descriptor.
func (l *Lease) Release() error {
	if l == nil || l.f == nil {
		return nil
	}
	err := Drop(l.f)
	l.f = nil
	return err
}

// Drop unlocks f's flock, then closes f. Closing alone is not enough while
// this process starts another: a child forked before its exec holds a copy
// of every descriptor, O_CLOEXEC ones included, and a flock belongs to the
// open file description, so the lock would outlive the close until the
// child execs. LOCK_UN through any copy releases it at once.
func Drop(f *os.File) error {
	unix.Flock(int(f.Fd()), unix.LOCK_UN)
	return f.Close()
}

// Holder returns the pid recorded by the current or last holder of path, or 0.
func Holder(path string) int {
	data, err := fsx.ReadFile(filepath.Dir(path), filepath.Base(path))
	if err != nil {
		return 0
	}
	pid, _ := strconv.Atoi(strings.TrimSpace(string(data)))
	return pid
}

func holderSuffix(path string) string {
	if pid := Holder(path); pid > 0 {
		return fmt.Sprintf(" (by pid %d)", pid)
	}
	return ""
}
