// Package intent publishes the leased markers written before any disk is
// materialised: the ULID-keyed create intent and the
// handle-keyed shadow intent. An intent becomes visible only already
// leased, and the lease lives exactly as long as its creator.
package intent

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"

	"github.com/nexus-sandbox/nexus/host/durable"
	"github.com/nexus-sandbox/nexus/host/fsx"
	"github.com/nexus-sandbox/nexus/host/lease"
)

// SchemaVersion is the version of the intent file's JSON.
const SchemaVersion = 1

// Intent is what the marker says: who is being created and which paths the
// creator may have materialised.
type Intent struct {
	Schema  int      `json:"schema"`
	Kind    string   `json:"kind"` // create or shadow
	Sandbox string   `json:"sandbox"`
	Handle  string   `json:"handle,omitempty"`
	Saga    string   `json:"saga"`
	Covers  []string `json:"covers"` // paths relative to the state root
	Pid     int      `json:"pid"`
}

// Held is a published intent whose lease this process holds.
type Held struct {
	Path string
	f    *os.File
}

// Publish writes the intent into an unnamed file (O_TMPFILE), takes the
// exclusive flock on it, writes and fsyncs it, links it into place and
// fsyncs the directory. The flock is taken before the marker has a name,
// so it is never visible unleased, and a publisher killed before the link
// leaves nothing behind. An existing marker is never replaced (the link
// fails). On a filesystem without O_TMPFILE it stages the intent under a
// temporary name instead (publishStaged).
func Publish(path string, in Intent) (*Held, error) {
	in.Schema = SchemaVersion
	in.Pid = os.Getpid()
	data, err := json.Marshal(in)
	if err != nil {
		return nil, err
	}
	dir := filepath.Dir(path)
	fd, err := unix.Open(dir, unix.O_TMPFILE|unix.O_RDWR|unix.O_CLOEXEC, 0o600)
	if errors.Is(err, unix.EOPNOTSUPP) || errors.Is(err, unix.EISDIR) {
		return publishStaged(path, data)
	}
	if err != nil {
		return nil, fmt.Errorf("intent %s: %w", path, &os.PathError{Op: "open", Path: dir, Err: err})
	}
	f := os.NewFile(uintptr(fd), path)
	fail := func(err error) (*Held, error) {
		f.Close()
		return nil, fmt.Errorf("intent %s: %w", path, err)
	}
	if err := writeLeased(f, data); err != nil {
		return fail(err)
	}
	// Linking through /proc/self/fd needs no capability (AT_EMPTY_PATH
	// would), and like a rename with RENAME_NOREPLACE it refuses an
	// existing name: two creators of one name never swap markers.
	if err := unix.Linkat(unix.AT_FDCWD, fmt.Sprintf("/proc/self/fd/%d", fd), unix.AT_FDCWD, path, unix.AT_SYMLINK_FOLLOW); err != nil {
		return fail(&os.LinkError{Op: "link", Old: "O_TMPFILE", New: path, Err: err})
	}
	if err := durable.SyncDir(dir); err != nil {
		f.Close()
		return nil, err
	}
	return &Held{Path: path, f: f}, nil
}

// writeLeased takes the marker's exclusive flock, then writes and fsyncs
// data into it.
func writeLeased(f *os.File, data []byte) error {
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		return err
	}
	if err := f.Chmod(0o600); err != nil {
		return err
	}
	if _, err := f.Write(data); err != nil {
		return err
	}
	return f.Sync()
}

// publishStaged is Publish where O_TMPFILE is missing: the intent is staged
// under ".<name>.stage-XXXX", leased, written and renamed into place. A
// publisher killed before the rename leaves the staged file, which recover
// sweeps once its lease is free and the reaper judges by that lease.
func publishStaged(path string, data []byte) (*Held, error) {
	dir := filepath.Dir(path)
	f, err := os.CreateTemp(dir, "."+filepath.Base(path)+StageInfix+"*")
	if err != nil {
		return nil, fmt.Errorf("intent %s: %w", path, err)
	}
	fail := func(err error) (*Held, error) {
		f.Close()
		os.Remove(f.Name())
		return nil, fmt.Errorf("intent %s: %w", path, err)
	}
	if err := writeLeased(f, data); err != nil {
		return fail(err)
	}
	// RENAME_NOREPLACE: two creators of one name must not silently swap markers.
	if err := unix.Renameat2(unix.AT_FDCWD, f.Name(), unix.AT_FDCWD, path, unix.RENAME_NOREPLACE); err != nil {
		return fail(err)
	}
	if err := durable.SyncDir(dir); err != nil {
		f.Close()
		return nil, err
	}
	return &Held{Path: path, f: f}, nil
}

// StageInfix marks a marker staged under a temporary name by publishStaged
// (or by builds before O_TMPFILE): ".<final name>.stage-XXXX".
const StageInfix = ".stage-"

// Release drops the lease without removing the marker. Callers release only
// after the journal acknowledged the event that makes the intent redundant,
// so a reaper that sees the lease free also sees the owner.
func (h *Held) Release() error {
	if h == nil || h.f == nil {
		return nil
	}
	err := lease.Drop(h.f)
	h.f = nil
	return err
}

// Retire removes the marker at path and fsyncs its directory. A marker
// already gone is not an error.
func Retire(path string) error {
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("retire intent %s: %w", path, err)
	}
	return durable.SyncUnlink(filepath.Dir(path))
}

// ErrUnreadable means the marker exists but cannot be read or parsed; the
// reaper must keep what it might cover, since its creator may be alive.
var ErrUnreadable = errors.New("intent unreadable")

// Read parses the marker at path.
func Read(path string) (Intent, error) {
	f, err := openMarker(path)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return Intent{}, err
		}
		return Intent{}, fmt.Errorf("%w: %s: %v", ErrUnreadable, path, err)
	}
	defer f.Close()
	var in Intent
	data, err := io.ReadAll(io.LimitReader(f, 1<<20))
	if err == nil {
		err = json.Unmarshal(data, &in)
	}
	if err != nil {
		return Intent{}, fmt.Errorf("%w: %s: %v", ErrUnreadable, path, err)
	}
	if in.Schema > SchemaVersion {
		return Intent{}, fmt.Errorf("%w: %s: schema %d is newer than %d", ErrUnreadable, path, in.Schema, SchemaVersion)
	}
	return in, nil
}

// LeaseHeld reports whether some process holds the marker's lease
// (lease.Held: a shared flock tried without waiting, never blocking a
// creator).
func LeaseHeld(path string) (bool, error) { return lease.Held(path) }

// openMarker opens a marker through fsx (beneath its directory): a link or
// a FIFO planted under a marker's name is an error (so the reaper keeps
// what it might cover), never followed and never a blocking open.
func openMarker(path string) (*os.File, error) {
	return fsx.Open(filepath.Dir(path), filepath.Base(path))
}
