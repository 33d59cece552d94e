// Package sagalease holds the runner lease of an entity (a sandbox, a
// volume, the reap run): an exclusive flock on <state-root>/leases/<entity>
// that whoever runs a saga on the entity holds from before its decision to
// the saga's end. The kernel drops it however the runner dies, so a free
// lease is the proof recover needs before it resumes or compensates a saga,
// and a held one names the live saga that refuses a second command.
//
// A lease file exists only while its lease is held (or its holder died
// holding it): the holder unlinks it before it unlocks, and whoever takes
// a lease checks, once it holds the flock, that the path still names the
// file it locked, retrying on the new one otherwise. So leases/ holds no
// more files than there are runners, live or dead, whatever the number of
// entities.
//
// A file no one holds is therefore what a runner left by dying (or by
// choosing to, Abandon): the trace recover follows to whatever such a
// runner may have left elsewhere (Leftovers), instead of looking for it
// in every directory it could be in.
package sagalease

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/nexus-sandbox/nexus/host/durable"
	"github.com/nexus-sandbox/nexus/host/fsx"
	"github.com/nexus-sandbox/nexus/host/lease"
)

// Dir is the leases directory, relative to the state root.
const Dir = "leases"

// ErrHeld means a live process holds the entity's lease.
var ErrHeld = errors.New("runner lease is held")

// Holder is what a lease file says about the process holding it. The flock
// is the truth; this text only names the holder in refusals.
type Holder struct {
	Pid  int    `json:"pid"`
	Kind string `json:"kind,omitempty"` // the command or saga kind
	Saga string `json:"saga,omitempty"` // once journaled
}

func (h Holder) String() string {
	s := h.Kind
	if s == "" {
		s = "a command"
	}
	if h.Saga != "" {
		s += " saga " + h.Saga
	}
	if h.Pid > 0 {
		s += fmt.Sprintf(" (pid %d)", h.Pid)
	}
	return s
}

// HeldError names who holds a lease.
type HeldError struct {
	Entity string
	By     Holder
}

func (e *HeldError) Error() string {
	return fmt.Sprintf("%s is busy: %s is running on it (pass --wait to wait for it)", e.Entity, e.By)
}

func (e *HeldError) Unwrap() error { return ErrHeld }

// Lease is a held runner lease.
type Lease struct {
	f      *os.File
	path   string
	holder Holder
}

// Path is the lease file of entity under root. An entity is named as its
// caller names it ("sandbox/<id>", "volume/<name>", "reap"); a slash in
// the name is a dot in the file's.
func Path(root, entity string) string {
	return filepath.Join(root, Dir, strings.ReplaceAll(entity, "/", ".")+".lease")
}

// Acquire takes entity's lease. Without wait a held lease is a *HeldError
// at once; with it Acquire polls until the lease is free or ctx is done.
func Acquire(ctx context.Context, root, entity string, h Holder, wait bool) (*Lease, error) {
	if err := fsx.EnsureDir(root, Dir); err != nil {
		return nil, err
	}
	path := Path(root, entity)
	for delay := 5 * time.Millisecond; ; delay = min(delay*2, 100*time.Millisecond) {
		l, err := try(path, h)
		if err == nil || !errors.Is(err, ErrHeld) {
			return l, err
		}
		if !wait {
			return nil, &HeldError{Entity: entity, By: readHolder(path)}
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("waiting for %s: %w", entity, context.Cause(ctx))
		case <-time.After(delay):
		}
	}
}

// try takes the lease once, creating its file if need be.
func try(path string, h Holder) (*Lease, error) {
	for {
		f, err := lockFile(path, os.O_RDWR|os.O_CREATE)
		if errors.Is(err, errMoved) {
			continue
		}
		if err != nil {
			return nil, err
		}
		l := &Lease{f: f, path: path}
		l.Set(h)
		return l, nil
	}
}

// errMoved: the path no longer names the file locked.
var errMoved = errors.New("lease file unlinked since it was opened")

// lockFile opens path (flag says whether it may create it), takes the
// file's flock without waiting, and checks that the path still names the
// file locked. A file its holder unlinked (Release) between our open and
// our flock is a lock nobody else can see: errMoved. While we hold it
// nobody else passes that check, so nobody else unlinks the path: it
// names our file until we release it.
func lockFile(path string, flag int) (*os.File, error) {
	f, err := fsx.OpenFile(filepath.Dir(path), filepath.Base(path), flag, 0o600) // no link, no FIFO hang
	if err != nil {
		return nil, err
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		f.Close()
		if errors.Is(err, unix.EWOULDBLOCK) {
			return nil, ErrHeld
		}
		return nil, fmt.Errorf("flock %s: %w", path, err)
	}
	var held, named unix.Stat_t
	if unix.Fstat(int(f.Fd()), &held) != nil || unix.Lstat(path, &named) != nil || held.Ino != named.Ino || held.Dev != named.Dev {
		f.Close()
		return nil, errMoved
	}
	return f, nil
}

// Set rewrites the holder text (for instance once the saga id is known).
func (l *Lease) Set(h Holder) {
	if h.Pid == 0 {
		h.Pid = os.Getpid()
	}
	l.holder = h
	data, _ := json.Marshal(h)
	if l.f.Truncate(0) == nil {
		l.f.WriteAt(append(data, '\n'), 0)
	}
}

// Release unlinks the lease file, then drops the lock: removed under the
// lock, the path is never unlinked from under another holder, and a waiter
// that opened the old file finds it unlinked once it locks it and retries
// on a new one.
func (l *Lease) Release() {
	if l == nil || l.f == nil {
		return
	}
	os.Remove(l.path)
	lease.Drop(l.f)
	l.f = nil
}

// Abandon drops the lock and leaves the file, as a dying runner would: a
// runner that leaves behind something it could not undo abandons its
// lease, so that recover, which follows the files no one holds, finds it.
func (l *Lease) Abandon() {
	if l == nil || l.f == nil {
		return
	}
	lease.Drop(l.f)
	l.f = nil
}

// Sync makes the lease file survive a power cut. A runner syncs it before
// it writes anything recover must find should the runner die, so that a
// cut cannot keep those files and lose the lease file that leads to them.
func (l *Lease) Sync() error {
	return durable.SyncDir(filepath.Dir(l.path))
}

// Leftovers lists the lease files under root that no process holds:
// those a runner left by dying while it held them (or by Abandon), and
// those of a root written before released leases took their files with
// them. A file is probed without being created, and a probe that cannot
// tell counts it as left over. Its cost is the files in leases/, never the
// entities of the root.
func Leftovers(root string) ([]string, error) {
	d, err := fsx.OpenDir(root, Dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	names, err := d.Readdirnames(-1)
	d.Close()
	if err != nil {
		return nil, fmt.Errorf("list %s: %w", filepath.Join(root, Dir), err)
	}
	var free []string
	for _, name := range names {
		if !strings.HasSuffix(name, ".lease") {
			continue
		}
		held, err := lease.Held(filepath.Join(root, Dir, name))
		if errors.Is(err, os.ErrNotExist) {
			continue // released since the listing
		}
		if err != nil || !held {
			free = append(free, name)
		}
	}
	slices.Sort(free)
	return free, nil
}

// Clear removes the lease files named (as Leftovers lists them) that no
// process holds now; one taken since is left to its holder. It returns
// how many it removed.
func Clear(root string, names []string) (int, error) {
	removed := 0
	for _, name := range names {
		l, err := take(filepath.Join(root, Dir, name))
		if errors.Is(err, ErrHeld) || errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			return removed, err
		}
		l.Release()
		removed++
	}
	return removed, nil
}

// take locks an existing lease file that no one holds, without creating
// one where it is gone.
func take(path string) (*Lease, error) {
	f, err := lockFile(path, os.O_RDWR)
	if errors.Is(err, errMoved) {
		return nil, os.ErrNotExist // released, perhaps taken anew, since the open
	}
	if err != nil {
		return nil, err
	}
	return &Lease{f: f, path: path}, nil
}

func readHolder(path string) Holder {
	var h Holder
	if data, err := fsx.ReadFile(filepath.Dir(path), filepath.Base(path)); err == nil {
		json.Unmarshal(data, &h)
	}
	return h
}
