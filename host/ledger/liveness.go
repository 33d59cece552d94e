package ledger

import (
	"errors"
	"os"

	"golang.org/x/sys/unix"
)

// The liveness lock: the owner of a run holds a read lock on the first byte
// of its record for as long as it lives. The kernel drops the lock with the
// holder's last descriptor, however the process ends, so a sweeper that
// finds it held knows the run's owner is alive without reading the record
// or /proc, and pid reuse cannot fake it. A record without the lock (a
// client in another language that does not take it, or the moment between
// publishing the record and locking it) is judged by pid and start time as
// before: the lock can only ever turn a decision into "keep".
//
// It is an OFD lock (F_OFD_SETLK), not flock(2), so it never conflicts with
// the flock writers and sweepers take on the same file, and not a
// per-process POSIX lock, which closing any other descriptor of the record
// (as every Add and Drop does) would silently release.

// livenessRange is the locked range: byte 0, one byte.
func livenessRange(typ int16) unix.Flock_t {
	return unix.Flock_t{Type: typ, Whence: 0, Start: 0, Len: 1}
}

// holdLiveness opens path close-on-exec (so no child the owner spawns
// inherits the lock) and takes the liveness lock on it.
func holdLiveness(path string) (*os.File, error) {
	f, err := openIn(path, os.O_RDONLY, 0)
	if err != nil {
		return nil, err
	}
	lk := livenessRange(unix.F_RDLCK)
	if err := unix.FcntlFlock(f.Fd(), unix.F_OFD_SETLK, &lk); err != nil {
		f.Close()
		return nil, &os.PathError{Op: "lock", Path: path, Err: err}
	}
	return f, nil
}

// lockedByOther reports whether another open file description holds a
// lock (OFD or POSIX, read or write) on the first byte of fd's file.
func lockedByOther(fd int) (bool, error) {
	lk := livenessRange(unix.F_WRLCK) // conflicts with every lock
	for {
		err := unix.FcntlFlock(uintptr(fd), unix.F_OFD_GETLK, &lk)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return false, err
		}
		return lk.Type != unix.F_UNLCK, nil
	}
}
