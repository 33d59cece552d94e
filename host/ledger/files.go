// Package ledger keeps the client-process ledger under <state-root>/runs/ on
// disk: a run's record and its append-before-create / drop-after-teardown
// name lists (fsynced, under the record's flock), the directory scan, and
// the liveness read from /proc that the pure sweep rule in
// github.com/nexus-sandbox/nexus/ledger decides on.
package ledger

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/nexus-sandbox/nexus/host/durable"
	"github.com/nexus-sandbox/nexus/host/fsx"
	"github.com/nexus-sandbox/nexus/host/proc"
	"github.com/nexus-sandbox/nexus/layout"
	format "github.com/nexus-sandbox/nexus/ledger"
)

// Kind is one of a run's two name lists.
type Kind string

const (
	Sandboxes Kind = format.SandboxesSuffix
	Networks  Kind = format.NetworksSuffix
)

// Dir is the ledger directory of a state root.
func Dir(stateRoot string) string { return filepath.Join(stateRoot, "runs") }

func recordPath(dir, run string) string { return filepath.Join(dir, run+format.RecordSuffix) }
func listPath(dir, run string, k Kind) string {
	return filepath.Join(dir, run+string(k))
}

// Run is a run open for appends: this process's own (then it holds the
// run's liveness lock) or, through Attach, its parent's.
type Run struct {
	dir, id string
	live    *os.File // the liveness lock; nil for an attached run
}

// ID is the run id.
func (r *Run) ID() string { return r.id }

// Dir is the ledger directory the run lives in.
func (r *Run) Dir() string { return r.dir }

// Attach returns a handle on an existing run's files for appends and drops
// (a `nexus create` inside `nexus run` uses its parent's run this way).
func Attach(dir, id string) (*Run, error) {
	if !layout.ValidRunID(id) {
		return nil, fmt.Errorf("run id %q: %w", id, format.ErrMalformed)
	}
	if _, err := os.Stat(recordPath(dir, id)); err != nil {
		return nil, fmt.Errorf("run %s: %w", id, err)
	}
	return &Run{dir: dir, id: id}, nil
}

// Open publishes rec as a new run: the record first (durably), then the two
// empty lists, so a list never exists without its record unless a sweep is
// deleting them.
func Open(dir string, rec format.Record) (*Run, error) {
	data, err := rec.Marshal()
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("ledger: %w", err)
	}
	if _, err := os.Lstat(recordPath(dir, rec.Run)); err == nil {
		return nil, fmt.Errorf("ledger: run %s already exists", rec.Run)
	}
	if err := writeIn(recordPath(dir, rec.Run), data, 0o600); err != nil {
		return nil, fmt.Errorf("ledger: %w", err)
	}
	r := &Run{dir: dir, id: rec.Run}
	// Only the owner may claim the run's liveness: a record written for
	// another process (a test's, a tool's) is judged by its pid and start
	// time alone. Without the lock (a filesystem that refuses OFD locks)
	// our own run is judged the same way, still correctly.
	if isSelf(rec) {
		r.live, _ = holdLiveness(recordPath(dir, rec.Run))
	}
	for _, k := range []Kind{Sandboxes, Networks} {
		if err := writeIn(listPath(dir, rec.Run, k), nil, 0o600); err != nil {
			r.release()
			return nil, fmt.Errorf("ledger: %w", err)
		}
	}
	return r, nil
}

// lockRecord takes the run's flock on its record file: writers of a run's
// lists and sweepers of it exclude each other with it. nb means do not wait.
func lockRecord(path string, nb bool) (*os.File, error) {
	f, err := openIn(path, os.O_RDONLY, 0)
	if err != nil {
		return nil, err
	}
	how := unix.LOCK_EX
	if nb {
		how |= unix.LOCK_NB
	}
	for {
		err = unix.Flock(int(f.Fd()), how)
		if !errors.Is(err, unix.EINTR) {
			break
		}
	}
	if err != nil {
		f.Close()
		return nil, err
	}
	return f, nil
}

// Add appends name to the run's list of kind and fsyncs it. Call it the
// instant before creating the thing: the list must be a superset of what
// exists.
func (r *Run) Add(k Kind, name string) error {
	if !layout.ValidSandboxRef(name) {
		return fmt.Errorf("ledger: %q is not a valid name", name)
	}
	lk, err := lockRecord(recordPath(r.dir, r.id), false)
	if err != nil {
		return fmt.Errorf("ledger %s: lock: %w", r.id, err)
	}
	defer lk.Close()
	path := listPath(r.dir, r.id, k)
	_, statErr := os.Lstat(path)
	f, err := openIn(path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600)
	if err != nil {
		return fmt.Errorf("ledger %s: %w", r.id, err)
	}
	// A torn earlier append (no final newline) must not glue onto this name.
	if err := terminateLastLine(path, f); err != nil {
		f.Close()
		return err
	}
	if _, err := f.WriteString(name + "\n"); err != nil {
		f.Close()
		return fmt.Errorf("ledger %s: append: %w", r.id, err)
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return fmt.Errorf("ledger %s: fsync: %w", r.id, err)
	}
	if err := f.Close(); err != nil {
		return err
	}
	if statErr != nil {
		return durable.SyncDir(r.dir)
	}
	return nil
}

func terminateLastLine(path string, f *os.File) error {
	st, err := f.Stat()
	if err != nil || st.Size() == 0 {
		return err
	}
	rf, err := openIn(path, os.O_RDONLY, 0)
	if err != nil {
		return err
	}
	defer rf.Close()
	last := make([]byte, 1)
	if _, err := rf.ReadAt(last, st.Size()-1); err != nil {
		return err
	}
	if last[0] != '\n' {
		_, err = f.WriteString("\n")
	}
	return err
}

// Drop removes name from the run's list of kind (durably). Call it the
// instant after the thing is gone.
func (r *Run) Drop(k Kind, name string) error {
	lk, err := lockRecord(recordPath(r.dir, r.id), false)
	if err != nil {
		return fmt.Errorf("ledger %s: lock: %w", r.id, err)
	}
	defer lk.Close()
	return dropLocked(r.dir, r.id, k, name)
}

func dropLocked(dir, id string, k Kind, name string) error {
	path := listPath(dir, id, k)
	data, err := readIn(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("ledger %s: %w", id, err)
	}
	names, _ := format.ParseNames(data)
	kept := names[:0]
	for _, n := range names {
		if n != name {
			kept = append(kept, n)
		}
	}
	if err := writeIn(path, format.RenderNames(kept), 0o600); err != nil {
		return fmt.Errorf("ledger %s: %w", id, err)
	}
	return nil
}

// Names reads the run's list of kind.
func (r *Run) Names(k Kind) ([]string, error) {
	data, err := readIn(listPath(r.dir, r.id, k))
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	return format.ParseNames(data)
}

// ErrNotEmpty means a clean close found names still listed.
var ErrNotEmpty = errors.New("run still lists sandboxes or networks")

// Close deletes the run's three files once both lists are empty (clean
// shutdown). The record goes last: it carries the lock and marks the run.
func (r *Run) Close() error {
	lk, err := lockRecord(recordPath(r.dir, r.id), false)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("ledger %s: lock: %w", r.id, err)
	}
	defer lk.Close()
	for _, k := range []Kind{Sandboxes, Networks} {
		data, err := readIn(listPath(r.dir, r.id, k))
		if err != nil && !errors.Is(err, os.ErrNotExist) {
			return err
		}
		if names, _ := format.ParseNames(data); len(names) > 0 {
			return fmt.Errorf("ledger %s: %w: %s", r.id, ErrNotEmpty, strings.Join(names, ", "))
		}
	}
	if err := deleteFiles(r.dir, r.id); err != nil {
		return err
	}
	r.release()
	return nil
}

// isSelf reports whether rec names this very process (pid and start time).
func isSelf(rec format.Record) bool {
	me, err := SelfRecord(rec.Run, rec.Driver, rec.Nexus)
	return err == nil && me.Pid == rec.Pid && me.StartTimeMs == rec.StartTimeMs
}

// release drops the liveness lock (the files are gone, or never were).
func (r *Run) release() {
	if r.live != nil {
		r.live.Close()
		r.live = nil
	}
}

// deleteFiles removes a run's files, its watchdog's log first and the
// record last (so a sweep interrupted before the record is done again),
// then fsyncs the dir. The log is beneath the state root runs/ is in, and
// removed through fsx, so a link planted at logs/ is refused, not followed.
func deleteFiles(dir, id string) error {
	root := filepath.Dir(dir)
	if err := fsx.Remove(root, filepath.Join("logs", layout.WatchdogLogName(id))); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("ledger %s: watchdog log: %w", id, err)
	}
	for _, p := range []string{listPath(dir, id, Networks), listPath(dir, id, Sandboxes), recordPath(dir, id)} {
		if err := os.Remove(p); err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("ledger %s: %w", id, err)
		}
	}
	return durable.SyncUnlink(dir)
}

// OwnerOf reads what runs under pid now: whether a process (not a zombie)
// has it, and when that process started.
func OwnerOf(pid int) (format.Owner, error) {
	id, alive, err := proc.Running(pid)
	if err != nil || !alive {
		return format.Owner{}, err
	}
	ms, err := id.StartUnixMs()
	if err != nil {
		return format.Owner{}, err
	}
	return format.Owner{Running: true, StartTimeMs: ms}, nil
}

// SelfRecord is the record of a new run owned by this process.
func SelfRecord(run, driver, nexus string) (format.Record, error) {
	id, err := proc.Self()
	if err != nil {
		return format.Record{}, err
	}
	ms, err := id.StartUnixMs()
	if err != nil {
		return format.Record{}, err
	}
	return format.Record{Schema: format.Schema, Run: run, Pid: id.Pid, StartTimeMs: ms, Driver: driver, Nexus: nexus}, nil
}

// MaxRecordBytes bounds a record file; a larger one is malformed.
const MaxRecordBytes = 4096

// probeRecord opens a record and asks whether its liveness lock is held;
// only when it is not does it read the record. It uses the fewest syscalls
// (open, fcntl, read, close): on the happy path a sweep does this once per
// live run, and os.ReadFile's fstat, poller registration and EOF read would
// double the cost. dirfd, when >= 0, is the ledger directory: opening
// relative to it skips walking the state root's path once per run.
func probeRecord(dirfd int, path string) (locked bool, data []byte, err error) {
	// O_NONBLOCK: a FIFO swapped in under a record's name after the scan
	// must not hang the sweep on open (regular files ignore the flag).
	const flags = unix.O_RDONLY | unix.O_CLOEXEC | unix.O_NOFOLLOW | unix.O_NONBLOCK
	var fd int
	if dirfd >= 0 {
		fd, err = unix.Openat(dirfd, filepath.Base(path), flags, 0)
	} else {
		fd, err = unix.Open(path, flags, 0)
	}
	if err != nil {
		return false, nil, &os.PathError{Op: "open", Path: path, Err: err}
	}
	defer unix.Close(fd)
	// A failed probe is no evidence either way: read the record.
	if locked, err := lockedByOther(fd); err == nil && locked {
		return true, nil, nil
	}
	buf := make([]byte, MaxRecordBytes+1)
	n := 0
	for n < len(buf) {
		m, err := unix.Read(fd, buf[n:])
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return false, nil, &os.PathError{Op: "read", Path: path, Err: err}
		}
		if m == 0 {
			break
		}
		n += m
	}
	if n > MaxRecordBytes {
		return false, nil, fmt.Errorf("%s: larger than %d bytes", path, MaxRecordBytes)
	}
	return false, buf[:n], nil
}

// Exists reports whether any of run's files is still there.
func Exists(dir, run string) bool {
	for _, p := range []string{recordPath(dir, run), listPath(dir, run, Sandboxes), listPath(dir, run, Networks)} {
		if _, err := os.Lstat(p); err == nil {
			return true
		}
	}
	return false
}
