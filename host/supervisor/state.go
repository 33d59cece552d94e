// Package supervisor is the per-sandbox perimeter supervisor: a detached
// process whose durable state (the sandbox's MITM CA) lives in
// <state-root>/supervisors/<ULID>/, and which answers on two unix sockets,
// one for the host (supervisor.sock) and one for instance identity.
//
// The state directory outlives the process on purpose: after a crash or a
// SIGKILL a replacement supervisor re-seeds from it, so the CA that
// the guest already trusts stays the same.
package supervisor

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"

	"github.com/nexus-sandbox/nexus/host/lease"
)

const (
	// SocketName is the host-facing control socket inside the state dir.
	SocketName = "supervisor.sock"
	// CAFileName holds certificate and key as two PEM blocks in one file, so
	// a single atomic rename publishes both and they can never diverge.
	CAFileName = "mitm-ca.pem"
	// lockName is flocked for the supervisor's lifetime. The kernel drops it
	// on any death, so it tells a live supervisor from leftovers exactly,
	// which probing a socket alone cannot do without a race.
	lockName = "supervisor.lock"

	dirMode  fs.FileMode = 0o700
	fileMode fs.FileMode = 0o600
)

// ErrSymlink is returned when a state dir path is a symbolic link. A link
// would let whoever controls its target redirect where the CA key is written
// or what gets deleted.
var ErrSymlink = errors.New("state dir is a symbolic link")

// ErrAlreadyRunning means a live supervisor holds the state dir's lease.
var ErrAlreadyRunning = errors.New("a live supervisor holds this state dir")

// EnsureStateDir creates dir (and missing parents) with mode 0700 and
// tightens an existing dir to 0700: MkdirAll does nothing to a path that
// already exists, and a 0755 dir would expose the CA key's name and let
// other users reach supervisor.sock. Existing parents are left alone; they
// belong to whoever laid out the state root.
func EnsureStateDir(dir string) error {
	if dir == "" {
		return errors.New("supervisor: empty state dir path")
	}
	if fi, err := os.Lstat(dir); err == nil && fi.Mode()&fs.ModeSymlink != 0 {
		return fmt.Errorf("supervisor: %s: %w", dir, ErrSymlink)
	}
	if err := os.MkdirAll(dir, dirMode); err != nil {
		return fmt.Errorf("supervisor: create state dir: %w", err)
	}
	// Check and chmod through one O_NOFOLLOW descriptor so the path cannot be
	// swapped for a link between the Lstat above and the chmod.
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		if fi, lerr := os.Lstat(dir); lerr == nil && fi.Mode()&fs.ModeSymlink != 0 {
			return fmt.Errorf("supervisor: %s: %w", dir, ErrSymlink)
		}
		return fmt.Errorf("supervisor: open state dir %s: %w", dir, err)
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return fmt.Errorf("supervisor: stat state dir %s: %w", dir, err)
	}
	// Another user's dir would stay readable by them whatever its mode.
	if euid := os.Geteuid(); euid != 0 && int(st.Uid) != euid {
		return fmt.Errorf("supervisor: state dir %s is owned by uid %d, not %d", dir, st.Uid, euid)
	}
	if fs.FileMode(st.Mode&0o7777) != dirMode {
		if err := unix.Fchmod(fd, uint32(dirMode)); err != nil {
			return fmt.Errorf("supervisor: chmod state dir %s: %w", dir, err)
		}
	}
	return nil
}

// RemoveStateDir deletes a sandbox's supervisor state. A missing dir is
// success so teardown can be retried. It refuses a symlink (deleting through
// one could remove something that is not ours) and refuses while a live
// supervisor holds the dir, since deleting its CA under it would make the next
// restart mint a different CA than the guest trusts.
func RemoveStateDir(dir string) error {
	if dir == "" {
		return errors.New("supervisor: empty state dir path")
	}
	fi, err := os.Lstat(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("supervisor: remove state dir: %w", err)
	}
	if fi.Mode()&fs.ModeSymlink != 0 {
		return fmt.Errorf("supervisor: refusing to remove %s: %w", dir, ErrSymlink)
	}
	if !fi.IsDir() {
		return fmt.Errorf("supervisor: refusing to remove %s: not a directory", dir)
	}
	l, err := lease.TryAcquire(filepath.Join(dir, lockName))
	if err != nil {
		if errors.Is(err, lease.ErrHeld) {
			return fmt.Errorf("supervisor: refusing to remove %s: %w: %v", dir, ErrAlreadyRunning, err)
		}
		return fmt.Errorf("supervisor: remove state dir: %w", err)
	}
	// Holding the lease while deleting keeps a supervisor from starting on
	// the half-deleted dir.
	defer l.Release()
	if err := os.RemoveAll(dir); err != nil {
		return fmt.Errorf("supervisor: remove state dir: %w", err)
	}
	return nil
}
