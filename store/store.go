// Package store owns one state root while it is open: the journal, the
// projections folded from it, the bbolt sandbox store and its indexes, and
// their snapshots. It is the only writer, and admits each append with
// core.Admit; it holds no rule of its own. Exactly one Store per state
// root exists at a time; other processes reach it through control.
package store

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/oklog/ulid/v2"
	bolt "go.etcd.io/bbolt"

	"github.com/nexus-sandbox/nexus/core"
	"github.com/nexus-sandbox/nexus/events"
	"github.com/nexus-sandbox/nexus/host/fsx"
	"github.com/nexus-sandbox/nexus/host/journal"
	"github.com/nexus-sandbox/nexus/projections"
)

// ErrStateRoot means the state root cannot be used as given.
var ErrStateRoot = fsx.ErrStateRoot

// snapshotEvery bounds the tail a restart replays: a snapshot is written
// after this many events were folded since the last one.
const snapshotEvery = 10000

// closeSnapshotMin is the tail below which Close leaves the snapshots as
// they are: a command that appended a few events would otherwise rewrite
// every projection's snapshot (megabytes at 10k sandboxes) to save the next
// Open folding those few events again.
const closeSnapshotMin = 1000

// snapshotRetry is how many events after a failed snapshot the next try
// comes.
const snapshotRetry = 100

// appendTimeout bounds one journal append, which its caller cannot cancel.
const appendTimeout = time.Minute

// Options configure Open.
type Options struct {
	Journal journal.Options // Dir is filled in from the state root
	// Lazy opens the journal alone: the projections are loaded (snapshots
	// decoded, tail folded) on the first call that needs them (Load, View,
	// an append), and Sandbox of an ID folds only that sandbox's events
	// from the journal. A command without a daemon that reads one sandbox
	// then decodes one sandbox, not every projection of the root.
	Lazy bool
	// Observer, if set, hears each stored event and each append.
	Observer Observer
	// Early, for the daemon: if the last Close left the sandbox store
	// current with the journal (mark.go), Open returns before the
	// journal's server starts, and the reads that need only the sandbox
	// store (Sandbox, SandboxPage, ListedPage, Named, SnapshotOwner,
	// SnapshotsNamed, SandboxCount) are answered from it while the journal
	// opens behind them; everything else waits for the journal (Opened).
	// Close catches the store up to the journal, so the next Open can.
	Early bool
	// BeforeJournal, if set, runs before an early Open starts the
	// journal's server, while the early reads are answered (the tests
	// hold the journal shut with it).
	BeforeJournal func()
}

// Record is one journal event with its sequence.
type Record = events.Record

// Store is an open state root.
type Store struct {
	root string
	j    *journal.Journal // nil until the journal opens (Options.Early)
	lock *journal.Locked
	log  *slog.Logger
	// catchUp: Close checkpoints the sandbox store up to the journal, so
	// that it can leave the store marked current (Options.Early).
	catchUp bool
	// early is the sandbox store as the last Close left it, current with
	// the journal, while the journal opens (nil otherwise); never changed.
	// opened is closed once the journal is open and the store loaded (or
	// that failed: openErr). Until then the opening holds mu.
	early   *sandboxView
	opened  chan struct{}
	openErr error
	mu      sync.Mutex // serialises appends so expected-sequence checks hold
	gc      groupCommit
	obs     Observer // nil: none

	// views are the projections snapshotted whole; the sandboxes, which
	// grow with the root, live in the store under an overlay (sandboxView).
	views     []projections.Projection
	sandboxes *sandboxView
	store     *sandboxStore // open once loaded
	sagas     *projections.Sagas
	volumes   *projections.Volumes
	images    *projections.ImageCache
	lastID    ulid.ULID
	sinceSnap int
	// loaded: the views hold the journal (from Open, unless Options.Lazy).
	// Set under mu; read without it on the append path, which must not
	// take mu before queueing (the group committer holds it).
	loaded atomic.Bool
	// decoded counts the events folded and the sandbox records decoded
	// from snapshots since Open (Decoded, for tests).
	decoded atomic.Uint64
}

// Open opens the state root at root, creating it (0700) if missing.
func Open(ctx context.Context, root string, opts Options) (*Store, error) {
	root, err := PrepareRoot(root)
	if err != nil {
		return nil, err
	}
	jo := opts.Journal
	jo.Dir = filepath.Join(root, "journal")
	lock, err := journal.Lock(jo.Dir)
	if err != nil {
		return nil, err
	}
	n := &Store{
		root: root, lock: lock, gc: newGroupCommit(), obs: opts.Observer,
		log: jo.Logger, catchUp: opts.Early, opened: make(chan struct{}),
	}
	if n.log == nil {
		n.log = slog.New(slog.DiscardHandler)
	}
	n.resetViews()
	// Whoever opens the journal takes the mark first, before its server
	// can start: from here until a clean Close there is none.
	pos, current, err := n.takeMark()
	if err != nil {
		n.abandon()
		return nil, err
	}
	// A file the load would refuse is named by the load, before any
	// read is answered: with one there, the open takes the normal path.
	if opts.Early && current && n.loadFilesPlain() {
		n.early = newSandboxView(n.store, pos, &n.decoded)
		n.mu.Lock()
		go n.openBehind(ctx, jo, pos.Seq, opts.Lazy, opts.BeforeJournal)
		return n, nil
	}
	defer close(n.opened)
	if n.j, err = lock.Open(ctx, jo); err != nil {
		n.abandon()
		return nil, err
	}
	if opts.Lazy {
		return n, nil
	}
	if err := n.loadLocked(ctx); err != nil {
		n.closeStore()
		n.j.Close()
		return nil, err
	}
	return n, nil
}

// abandon lets go of a store whose journal did not open.
func (n *Store) abandon() {
	n.closeStore()
	n.lock.Release()
}

func (n *Store) closeStore() error {
	if n.store == nil {
		return nil
	}
	err := n.store.close()
	n.store = nil
	return err
}

// openBehind opens the journal and loads the store while the early reads
// are answered, holding mu (taken by Open) until it is done. A journal
// that does not end where the mark said is a store that answered reads
// from an older state: said loudly, then caught up by the load as any
// store behind its journal is.
func (n *Store) openBehind(ctx context.Context, jo journal.Options, marked uint64, lazy bool, before func()) {
	defer n.mu.Unlock()
	defer close(n.opened)
	if before != nil {
		before()
	}
	j, err := n.lock.Open(ctx, jo)
	if err != nil {
		n.openErr = err
		return
	}
	n.j = j
	last, err := j.LastSeq(ctx)
	if err != nil || last != marked {
		n.log.Error("SANDBOX STORE WAS NOT CURRENT: it was marked current at a journal sequence the journal does not end at; reads answered while the journal opened may be stale; catching the store up",
			"marked_seq", marked, "journal_last_seq", last, "err", err)
	}
	if lazy {
		return
	}
	if err := n.loadLocked(ctx); err != nil {
		n.openErr = err
	}
}

// Opened waits until the journal is open (at once unless Options.Early
// found the store current) and says whether that failed.
func (n *Store) Opened(ctx context.Context) error {
	select {
	case <-n.opened:
		return n.openErr
	default:
	}
	select {
	case <-n.opened:
		return n.openErr
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Early says whether Open returned before the journal opened (Opened).
func (n *Store) Early() bool { return n.early != nil }

// earlyView is the store as the last Close left it, while the journal
// opens behind it; nil once it is open, or when the store was not known
// to be current.
func (n *Store) earlyView() *sandboxView {
	if n.early == nil {
		return nil
	}
	select {
	case <-n.opened:
		return nil
	default:
		return n.early
	}
}

// Load brings the projections up to the journal, if Open was lazy and
// nothing has loaded them yet.
func (n *Store) Load(ctx context.Context) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.loadLocked(ctx)
}

func (n *Store) loadLocked(ctx context.Context) error {
	if n.openErr != nil {
		return n.openErr
	}
	if n.loaded.Load() {
		return nil
	}
	if err := n.load(ctx); err != nil {
		n.resetViews()
		return err
	}
	n.loaded.Store(true)
	return nil
}

// Decoded counts the journal events this store has folded and the sandbox
// records it has decoded from snapshots since Open: what a single-sandbox
// command must keep bounded, whatever the number of sandboxes.
func (n *Store) Decoded() uint64 { return n.decoded.Load() }

// Sandbox is one sandbox by ID (any case) or handle; found is false if
// there is none. On a lazy store not yet loaded, an ID is answered by
// folding that sandbox's own events, read through the journal's
// per-sandbox subject filter: the Sandboxes fold of a sandbox depends only
// on its own events, so this is the record a full load would hold, at the
// cost of that sandbox's history alone. A handle needs the loaded view.
func (n *Store) Sandbox(ctx context.Context, ref string) (projections.Sandbox, bool, error) {
	if v := n.earlyView(); v != nil {
		return found(sandboxIn(v, ref))
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	id := strings.ToUpper(ref)
	if _, err := ulid.ParseStrict(id); err == nil && !n.loaded.Load() {
		return n.foldOneLocked(ctx, id)
	}
	if err := n.loadLocked(ctx); err != nil {
		return projections.Sandbox{}, false, err
	}
	return found(sandboxIn(n.sandboxes, ref))
}

func found(sb *projections.Sandbox, err error) (projections.Sandbox, bool, error) {
	if err != nil || sb == nil {
		return projections.Sandbox{}, false, err
	}
	return *sb, true, nil
}

// foldOneLocked is sandbox id's record as a full load would hold it, at
// the cost of that sandbox alone: its record in the sandbox store, if the
// store exists and matches the journal, and then its own events after the
// store's position, read through the journal's per-sandbox subject filter
// (all its events without a usable store). A long-lived sandbox is read
// from its record, not replayed from its first event.
func (n *Store) foldOneLocked(ctx context.Context, id string) (projections.Sandbox, bool, error) {
	one := projections.NewSandboxes()
	from := uint64(0)
	if pos, ok := n.usableStoreLocked(ctx); ok {
		if sb, err := n.store.get(id); err == nil {
			if sb != nil {
				n.decoded.Add(1)
				one.Put(sb)
			}
			from = pos.Seq + 1
		}
		// A record that does not read back: its events from the start.
	}
	err := n.j.Scan(ctx, journal.Range{From: from, Filters: []string{events.SandboxSubjects(id)}}, func(r journal.Record) error {
		e, err := events.Decode(r.Data)
		if err != nil {
			return fmt.Errorf("journal event %d: %w", r.Seq, err)
		}
		n.decoded.Add(1)
		one.Apply(r.Seq, e)
		return nil
	})
	if err != nil {
		return projections.Sandbox{}, false, err
	}
	if sb := one.Get(id); sb != nil {
		return *sb, true, nil
	}
	return projections.Sandbox{}, false, nil
}

// usableStoreLocked opens the sandbox store if one exists (a read creates
// none) and says where it stands, if that is an event of this journal.
func (n *Store) usableStoreLocked(ctx context.Context) (storePosition, bool) {
	if n.store == nil {
		if fi, err := os.Lstat(n.storePath()); err != nil || !fi.Mode().IsRegular() {
			return storePosition{}, false
		}
		if n.openStoreLocked() != nil {
			return storePosition{}, false
		}
	}
	pos, ok, err := n.store.position()
	if err != nil || !ok || !n.storeMatches(ctx, pos) {
		return storePosition{}, false
	}
	return pos, true
}

// SandboxPage is at most limit sandboxes whose IDs sort after after (""
// from the first), in ID order, read from the store a page at a time.
func (n *Store) SandboxPage(ctx context.Context, after string, limit int) ([]projections.Sandbox, error) {
	if v := n.earlyView(); v != nil {
		return copies(v.page(after, limit))
	}
	return n.sandboxList(ctx, func(v *sandboxView) ([]*projections.Sandbox, error) { return v.page(after, limit) })
}

// ListedPage is SandboxPage for a listing: at most limit sandboxes after
// after, in ID order, each as the JSON the store keeps for it, except that
// a sandbox that records a process, or changed since the store's last
// checkpoint, comes as its record (Listed). A listing of stopped
// sandboxes decodes no record.
func (n *Store) ListedPage(ctx context.Context, after string, limit int) ([]Listed, error) {
	v := n.earlyView()
	if v == nil {
		n.mu.Lock()
		defer n.mu.Unlock()
		if err := n.loadLocked(ctx); err != nil {
			return nil, err
		}
		v = n.sandboxes
	}
	list, err := v.listed(after, limit)
	for i, l := range list {
		if l.Sandbox != nil {
			sb := *l.Sandbox // the caller's copy, not the overlay's record
			list[i].Sandbox = &sb
		}
	}
	return list, err
}

// WithProcesses is every sandbox that records a process, running or
// exited (an index of the store, not a scan): what the daemon's exit
// watcher starts from and what recover checks.
func (n *Store) WithProcesses(ctx context.Context) ([]projections.Sandbox, error) {
	return n.sandboxList(ctx, (*sandboxView).withProcesses)
}

func (n *Store) sandboxList(ctx context.Context, read func(*sandboxView) ([]*projections.Sandbox, error)) ([]projections.Sandbox, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if err := n.loadLocked(ctx); err != nil {
		return nil, err
	}
	return copies(read(n.sandboxes))
}

// copies are the caller's copies of a view's records.
func copies(list []*projections.Sandbox, err error) ([]projections.Sandbox, error) {
	if err != nil {
		return nil, err
	}
	out := make([]projections.Sandbox, len(list))
	for i, sb := range list {
		out[i] = *sb
	}
	return out, nil
}

// OwnerOf names the sandbox other than except whose resources include one
// of paths (the least ID, as projections.Sandboxes.OwnerOf), and that path.
func (n *Store) OwnerOf(ctx context.Context, paths []string, except string) (id, path string, found bool, err error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if err := n.loadLocked(ctx); err != nil {
		return "", "", false, err
	}
	return n.sandboxes.ownerOf(paths, except)
}

// PathOwners is, for each of paths, the sandbox that owns it by
// projections.PathOwner's rule ("" for none): point lookups in the
// store's ownership index, so a reap costs the paths it scanned, not the
// sandboxes the root holds.
func (n *Store) PathOwners(ctx context.Context, paths []string) ([]string, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if err := n.loadLocked(ctx); err != nil {
		return nil, err
	}
	return n.sandboxes.pathOwners(paths)
}

// EachPathOwner is PathOwners answered through fn, for the daemon to
// write each answer as it is found: fn gets the index of each of paths
// and its owner (nil for none) as bytes valid only during the call, so a
// batch copies no path and no ID.
func (n *Store) EachPathOwner(ctx context.Context, paths []string, fn func(i int, owner []byte)) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if err := n.loadLocked(ctx); err != nil {
		return err
	}
	return n.sandboxes.eachPathOwner(paths, fn)
}

// NamedLimit bounds how many sandboxes Named, and snapshots
// SnapshotsNamed, read of each kind (ID prefix, short-ID prefix): two
// already make a reference ambiguous, and the rest are a list for the
// operator to pick from.
const NamedLimit = 16

// Named is the sandboxes ref could name by projections.Match (its
// handle's holder, those whose ID or short ID it is a prefix of), in ID
// order, for Match to choose from: point lookups and seeks in the store's
// indexes, not a read of every sandbox. A handle a sandbox held twice (a
// history made by hand) lists it once; a prefix of many lists at most
// NamedLimit of each kind.
func (n *Store) Named(ctx context.Context, ref string) ([]projections.Ref, error) {
	if v := n.earlyView(); v != nil {
		return v.named(ref, NamedLimit)
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	if err := n.loadLocked(ctx); err != nil {
		return nil, err
	}
	return n.sandboxes.named(ref, NamedLimit)
}

// SnapshotOwner is the sandbox holding snapshot snap (an exact ID).
func (n *Store) SnapshotOwner(ctx context.Context, snap string) (projections.Sandbox, bool, error) {
	if v := n.earlyView(); v != nil {
		return found(v.snapshotOwner(snap))
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	if err := n.loadLocked(ctx); err != nil {
		return projections.Sandbox{}, false, err
	}
	return found(n.sandboxes.snapshotOwner(snap))
}

// SnapshotsNamed is the snapshots ref could name by
// projections.MatchSnapshot (those whose ID or short ID it is a prefix
// of), each with the sandbox holding it, in snapshot ID order, for
// MatchSnapshot to choose from: seeks in the store's snapshot indexes,
// not a read of every sandbox. A prefix of many lists at most NamedLimit
// of each kind.
func (n *Store) SnapshotsNamed(ctx context.Context, ref string) ([]projections.SnapshotRef, error) {
	if v := n.earlyView(); v != nil {
		return v.snapshotsNamed(ref, NamedLimit)
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	if err := n.loadLocked(ctx); err != nil {
		return nil, err
	}
	return n.sandboxes.snapshotsNamed(ref, NamedLimit)
}

// ImageCache is the image cache's state: its entries and open sagas, and
// every persisted sandbox with the entry it came from, read from the store
// a page at a time (prune and list need them all).
func (n *Store) ImageCache(ctx context.Context) (projections.ImageCacheState, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if err := n.loadLocked(ctx); err != nil {
		return projections.ImageCacheState{}, err
	}
	var users []projections.CacheUser
	err := n.sandboxes.each(func(page []*projections.Sandbox) {
		users = append(users, projections.CacheUsers(page)...)
	})
	if err != nil {
		return projections.ImageCacheState{}, err
	}
	return n.images.State(users), nil
}

// Sandboxes is every sandbox, in ID order, read from the store a page at
// a time.
func (n *Store) Sandboxes(ctx context.Context) ([]projections.Sandbox, error) {
	return n.sandboxList(ctx, func(v *sandboxView) ([]*projections.Sandbox, error) {
		var all []*projections.Sandbox
		err := v.each(func(page []*projections.Sandbox) { all = append(all, page...) })
		return all, err
	})
}

// SandboxCount is the number of sandboxes the journal shows.
func (n *Store) SandboxCount(ctx context.Context) (int, error) {
	if v := n.earlyView(); v != nil {
		return v.count(), nil
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	if err := n.loadLocked(ctx); err != nil {
		return 0, err
	}
	return n.sandboxes.count(), nil
}

// sandboxIn is v's sandbox by ID, or by handle.
func sandboxIn(v *sandboxView, ref string) (*projections.Sandbox, error) {
	sb, err := v.get(strings.ToUpper(ref))
	if err != nil || sb != nil || ref == "" {
		return sb, err
	}
	return v.byHandle(ref)
}

// PrepareRoot makes root absolute, creates it 0700 if missing, and refuses
// a root nexus cannot use (fsx.PrepareRoot, where the rule lives).
func PrepareRoot(root string) (string, error) { return fsx.PrepareRoot(root) }

// Root is the absolute state root.
func (n *Store) Root() string { return n.root }

// Journal exposes the journal, for the daemon's subscriber listener and
// mirror: it waits for the journal to open (nil if that failed).
func (n *Store) Journal() *journal.Journal {
	<-n.opened
	return n.j
}

// load restores each whole projection from its snapshot when the snapshot
// still matches the journal, opens the sandbox store, then folds the tail
// past the oldest of them. A snapshot that does not decode or whose last
// event is not in the journal is ignored, and its projection is rebuilt
// from the start; so is a sandbox store that does not match the journal
// (or a damaged record found in it), which is then written again whole.
func (n *Store) load(ctx context.Context) error {
	err := n.loadOnce(ctx)
	if errors.Is(err, errStoreDamaged) {
		// The journal is the truth: drop the store and rebuild it.
		n.resetViews()
		if err = n.dropStore(); err == nil {
			err = n.loadOnce(ctx)
		}
	}
	return err
}

// errStoreDamaged marks a sandbox store that cannot be read as written.
var errStoreDamaged = errors.New("damaged sandbox store")

func (n *Store) loadOnce(ctx context.Context) error {
	from := uint64(0)
	restored := true
	for _, v := range n.views {
		snap, err := n.readSnapshot(ctx, v)
		if refused(err) {
			return fmt.Errorf("projections: %w", err)
		}
		if err != nil {
			restored = false
			break
		}
		if from == 0 || snap.Seq < from {
			from = snap.Seq
		}
	}
	if !restored {
		n.resetViews()
		from = 0
	}
	if err := n.openSandboxesLocked(ctx); err != nil {
		return err
	}
	from = min(from, n.sandboxes.Seq())
	folded := 0
	err := n.j.Read(ctx, from+1, journal.Subjects, func(r journal.Record) error {
		e, err := events.Decode(r.Data)
		if err != nil {
			return fmt.Errorf("journal event %d: %w", r.Seq, err)
		}
		for _, v := range n.views {
			if r.Seq > v.Seq() {
				v.Apply(r.Seq, e)
			}
		}
		if r.Seq > n.sandboxes.Seq() {
			if err := n.sandboxes.apply(r.Seq, e); err != nil {
				return fmt.Errorf("%w: %v", errStoreDamaged, err)
			}
		}
		n.lastID = e.ID
		folded++
		n.decoded.Add(1)
		return nil
	})
	if err != nil {
		return err
	}
	if from > 0 && folded == 0 {
		// Nothing after the snapshot: its recorded event id is the last one.
		rec, err := n.j.Get(ctx, from)
		if err == nil {
			if e, err := events.Decode(rec.Data); err == nil {
				n.lastID = e.ID
			}
		}
	}
	n.sinceSnap = folded
	if folded >= snapshotEvery || n.sandboxes.store == nil {
		// Best effort, as after an append: a full projections/ must not
		// keep the state root from opening for reads. A view without a
		// store is written into one now, so the next open reads records,
		// not the whole view.
		if err := n.writeSnapshots(); err != nil {
			n.sinceSnap = snapshotEvery - snapshotRetry
		}
	}
	return nil
}

func (n *Store) storePath() string { return filepath.Join(n.root, "projections", storeFile) }

// openSandboxesLocked opens the sandbox store and reads through it if it
// matches the journal. Otherwise the view starts whole in memory: from an
// older build's sandboxes snapshot if that still matches, else empty (the
// journal is folded from its start), and is written to the store once
// loaded. A store that cannot be created (projections/ out of space) is
// no reason to refuse the root: the view stays whole in memory until a
// later checkpoint can write one.
func (n *Store) openSandboxesLocked(ctx context.Context) error {
	if f, err := fsx.Open(n.root, n.storePath()); err == nil {
		f.Close()
	} else if refused(err) {
		return fmt.Errorf("projections: %w", err)
	}
	err := n.openStoreLocked()
	if errors.Is(err, bolt.ErrTimeout) {
		return err
	}
	if err == nil {
		pos, ok, err := n.store.position()
		if err == nil && ok && n.storeMatches(ctx, pos) {
			n.sandboxes = newSandboxView(n.store, pos, &n.decoded)
			return nil
		}
	}
	full := projections.NewSandboxes()
	if _, err := n.readSnapshot(ctx, full); err != nil {
		full = projections.NewSandboxes()
	}
	n.decoded.Add(uint64(full.Len()))
	n.sandboxes = completeView(full, &n.decoded)
	return nil
}

// openStoreLocked opens the sandbox store, if it is not open, creating it
// if missing. A file bbolt cannot open is removed and created again (the
// journal rebuilds it); one whose lock another process holds is that
// process's, and an error.
func (n *Store) openStoreLocked() error {
	if n.store != nil {
		return nil
	}
	if err := fsx.MkdirAll(n.root, "projections", 0o700); err != nil {
		return fmt.Errorf("projections: %w", err)
	}
	st, err := openSandboxStore(n.storePath())
	if err != nil && !errors.Is(err, bolt.ErrTimeout) {
		if err = n.dropStore(); err == nil {
			st, err = openSandboxStore(n.storePath())
		}
	}
	if err != nil {
		return err
	}
	n.store = st
	return nil
}

// storeMatches says whether the store's position is an event of this
// journal, not of an earlier or replaced one.
func (n *Store) storeMatches(ctx context.Context, pos storePosition) bool {
	if pos.Seq == 0 {
		return true
	}
	rec, err := n.j.Get(ctx, pos.Seq)
	if err != nil {
		return false
	}
	e, err := events.Decode(rec.Data)
	return err == nil && e.ID == pos.EventID
}

// dropStore closes and removes the sandbox store, to be written again.
func (n *Store) dropStore() error {
	if n.store != nil {
		n.store.close()
		n.store = nil
	}
	if err := os.Remove(n.storePath()); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("projections: %w", err)
	}
	return nil
}

func (n *Store) resetViews() {
	n.sandboxes = completeView(projections.NewSandboxes(), &n.decoded)
	n.sagas, n.volumes = projections.NewSagas(), projections.NewVolumes()
	n.images = projections.NewImageCache()
	n.views = []projections.Projection{n.sagas, n.volumes, n.images}
}

// retiredSnaps are snapshots older builds kept: of an ownership view no
// command read, and of the sandboxes, which live in the store now.
var retiredSnaps = []string{"ownership.snap", "sandboxes.snap"}

func (n *Store) snapshotPath(v projections.Projection) string {
	return filepath.Join(n.root, "projections", v.Name()+".snap")
}

// The load's rule for its own files under projections/ (each whole view's
// snapshot, the sandbox store): one that is there but is not a regular
// file (a FIFO, a link, a device) is not nexus's, and the load refuses the
// root naming it; an operator must look at it, not a rebuild.
func refused(err error) bool {
	return errors.Is(err, fsx.ErrNotRegular) || errors.Is(err, fsx.ErrSymlink)
}

// loadFiles are the files under projections/ a load reads.
func (n *Store) loadFiles() []string {
	files := []string{n.storePath()}
	for _, v := range n.views {
		files = append(files, n.snapshotPath(v))
	}
	return files
}

// loadFilesPlain says whether the load would find none of its files
// refused: projections/ a directory, each file regular or absent. It
// looks with lstat alone, opening nothing, so a FIFO cannot block it.
func (n *Store) loadFilesPlain() bool {
	if fi, err := os.Lstat(filepath.Join(n.root, "projections")); err != nil || !fi.IsDir() {
		return false
	}
	for _, f := range n.loadFiles() {
		fi, err := os.Lstat(f)
		if err != nil && !errors.Is(err, os.ErrNotExist) || err == nil && !fi.Mode().IsRegular() {
			return false
		}
	}
	return true
}

func (n *Store) readSnapshot(ctx context.Context, v projections.Projection) (projections.Snapshot, error) {
	data, err := fsx.ReadFile(n.root, n.snapshotPath(v))
	if err != nil {
		return projections.Snapshot{}, err
	}
	snap, err := projections.DecodeSnapshot(data, v)
	if err != nil {
		return snap, err
	}
	if snap.Seq == 0 {
		return snap, nil
	}
	// The snapshot must describe this journal, not an earlier or replaced one.
	rec, err := n.j.Get(ctx, snap.Seq)
	if err != nil {
		return snap, err
	}
	e, err := events.Decode(rec.Data)
	if err != nil {
		return snap, err
	}
	if e.ID != snap.EventID {
		return snap, fmt.Errorf("%w: event %d is not the one the snapshot covered", projections.ErrBadSnapshot, snap.Seq)
	}
	return snap, nil
}

// writeSnapshots snapshots the whole views and checkpoints the sandboxes
// into their store.
func (n *Store) writeSnapshots() error {
	if err := fsx.MkdirAll(n.root, "projections", 0o700); err != nil {
		return err
	}
	for _, v := range n.views {
		data, err := projections.EncodeSnapshot(v, n.lastID)
		if err != nil {
			return err
		}
		if err := fsx.WriteFile(n.root, n.snapshotPath(v), data, 0o600); err != nil {
			return err
		}
	}
	if err := n.openStoreLocked(); err != nil {
		return err
	}
	if err := n.sandboxes.checkpoint(n.store, n.lastID); err != nil {
		return err
	}
	// What older builds kept goes rather than lingering as files nothing
	// accounts for.
	for _, name := range retiredSnaps {
		if err := fsx.Remove(n.root, filepath.Join("projections", name)); err != nil && !errors.Is(err, os.ErrNotExist) {
			return err
		}
	}
	n.sinceSnap = 0
	return nil
}

// Close snapshots the projections, if the tail the next Open would replay
// has grown past closeSnapshotMin events or there are no snapshots yet,
// catches the sandbox store up to the journal (Options.Early), and closes
// the journal, leaving the store marked current if it is (mark.go).
func (n *Store) Close() error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.j == nil { // the journal did not open
		return errors.Join(n.closeStore(), n.lock.Release())
	}
	if n.openErr != nil {
		// No mark: the next open takes the path that fails naming why.
		return n.j.CloseThen(n.closeStore)
	}
	var err error
	if n.loaded.Load() && (n.sinceSnap >= closeSnapshotMin || n.sinceSnap > 0 && !n.haveSnapshots()) {
		err = n.writeSnapshots()
	} else if n.catchUp && n.loaded.Load() && (n.sandboxes.store == nil || n.sandboxes.Seq() != n.sandboxes.pos.Seq) {
		if err = n.openStoreLocked(); err == nil {
			err = n.sandboxes.checkpoint(n.store, n.lastID)
		}
	}
	last, lastID, lerr := n.lastEvent(context.Background())
	return errors.Join(err, n.j.CloseThen(func() error {
		var err error
		if lerr == nil {
			err = n.markIfCurrent(last, lastID)
		}
		return errors.Join(err, n.closeStore())
	}))
}

// haveSnapshots reports whether every whole projection has a snapshot
// file and the sandboxes a store.
func (n *Store) haveSnapshots() bool {
	for _, v := range n.views {
		if _, err := fsx.Stat(n.root, n.snapshotPath(v)); err != nil {
			return false
		}
	}
	return n.sandboxes.store != nil
}

// Append journals evs in order, each synced before the next, asserting the
// journal has not moved since this store last folded it, then folds them.
// It returns each event's sequence.
func (n *Store) Append(ctx context.Context, evs ...events.Event) ([]uint64, error) {
	return n.AppendExpect(ctx, nil, evs...)
}

// AppendExpect is Append for a decision: it refuses the whole batch with a
// *core.StaleError unless every expected entity is still at the sequence
// the decision saw. The store checks under its append lock, and the journal
// checks the first sandbox expectation again on the event's own subjects.
// Any event of a saga the journal has closed is refused (core.ErrSagaClosed).
//
// Concurrent calls are committed together (see groupAppend): each call's
// events are one atomic journal batch, and calls that touch different
// entities share it, so they share one fsync. Each call still returns only
// once its own events are on disk, and a refusal of one call does not fail
// the others.
func (n *Store) AppendExpect(ctx context.Context, expect []core.Expect, evs ...events.Event) ([]uint64, error) {
	return n.AppendDecoded(ctx, expect, evs, nil)
}

// AppendDecoded is AppendExpect for events that arrived encoded (the
// daemon's append stream): data[i] is the journal bytes evs[i] was decoded
// from (events.Decode, which refuses anything it would not keep), stored
// as they are instead of encoded again. data may be nil.
func (n *Store) AppendDecoded(ctx context.Context, expect []core.Expect, evs []events.Event, data [][]byte) ([]uint64, error) {
	if data != nil && len(data) != len(evs) {
		return nil, fmt.Errorf("append: %d events with %d encodings", len(evs), len(data))
	}
	// An append is decided against the views (expectations, open sagas):
	// a lazy store loads them first.
	if !n.loaded.Load() {
		if err := n.Load(ctx); err != nil {
			return nil, err
		}
	}
	return n.groupAppend(ctx, expect, evs, data)
}

// appendOneByOneLocked is AppendExpect for one call on its own: each event
// is its own journal append, synced before the next, except that an event
// giving a handle and its handle.claimed go in together, as one batch. It
// is the fallback when a batch is refused as a whole, which tells each
// call its own result.
func (n *Store) appendOneByOneLocked(ctx context.Context, expect []core.Expect, evs []events.Event) ([]uint64, error) {
	k, refusal := n.admitLocked(ctx, expect, evs)
	if seqs, ok := errStored(refusal); ok {
		return seqs, nil
	}
	if k == 0 && refusal != nil {
		return nil, refusal
	}
	msgs, err := n.messagesLocked(ctx, expect, evs[:k], nil)
	if err != nil {
		return nil, err
	}
	seqs := make([]uint64, 0, k)
	for i := 0; i < k; {
		unit := 1
		if core.Claimed(evs, i) {
			unit = 2
		}
		got, err := n.appendLocked(ctx, msgs[i:i+unit], evs[i:i+unit])
		if err != nil {
			return seqs, err
		}
		seqs = append(seqs, got...)
		i += unit
	}
	return seqs, refusal
}

// Rev is the sequence of the last event about entity (0: none, or when
// it cannot be read).
func (n *Store) Rev(entity core.Entity) uint64 {
	rev, _ := n.EntityRev(context.Background(), entity)
	return rev
}

// EntityRev is the sequence of the last event about entity (0: none): what
// a decision about it expects (core.Expect). For a handle it is the
// handle's last handle.claimed.
func (n *Store) EntityRev(ctx context.Context, entity core.Entity) (uint64, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if err := n.loadLocked(ctx); err != nil {
		return 0, err
	}
	return n.revLocked(ctx, entity)
}

func (n *Store) revLocked(ctx context.Context, entity core.Entity) (uint64, error) {
	switch entity.Kind() {
	case "sandbox":
		sb, err := n.sandboxes.get(entity.Name())
		if err != nil || sb == nil {
			return 0, err
		}
		return sb.Rev, nil
	case "volume":
		if v := n.volumes.Get(entity.Name()); v != nil {
			return v.Rev, nil
		}
		// Removed (or never made): its last record on its own subject,
		// which a new volume of the name expects there.
		return n.j.LastOnSubject(ctx, events.VolumeSubjects(entity.Name()))
	case "handle":
		return n.handleRevLocked(ctx, entity.Name())
	}
	return 0, nil
}

// handleRevLocked is the sequence of handle's last handle.claimed: the
// journal's last record on the handle's subject, which is what the
// journal checks a new claim against. Every append goes through this
// store under its lock, so the answer holds until the lock is let go.
func (n *Store) handleRevLocked(ctx context.Context, handle string) (uint64, error) {
	return n.j.LastOnSubject(ctx, events.HandleSubject(handle))
}

// volumeJournalSeqLocked is the sequence the journal is to find last on
// a volume's own subject for an event on it, given the expectation the
// decision named. The volume's revision counts every event naming it, and
// some of those are on other subjects: a volume.attached or .detached on
// its sandbox's, and every volume event written before volumes had
// subjects of their own, on the shared one. So the journal is asked for
// the decision's sequence when the volume's subject is already past it
// (the append is refused), and otherwise for the subject's own last
// record: any event landing there after this read refuses the append.
// With no expectation named, the subject's last record too.
func (n *Store) volumeJournalSeqLocked(ctx context.Context, expect []core.Expect, name string) (uint64, error) {
	last, err := n.j.LastOnSubject(ctx, events.VolumeSubjects(name))
	if err != nil {
		return 0, err
	}
	if x := expectationOf(expect, core.Volume(name)); x != nil && x.Seq < last {
		return x.Seq, nil
	}
	return last, nil
}

// typeAt names the event at seq for a refusal message; "" if unknown.
func (n *Store) typeAt(ctx context.Context, seq uint64) events.Type {
	if seq == 0 {
		return ""
	}
	rec, err := n.j.Get(ctx, seq)
	if err != nil {
		return ""
	}
	e, err := events.Decode(rec.Data)
	if err != nil {
		return ""
	}
	return e.Type
}

// journalExpectation is the expectation the journal itself checks for an
// event: the one about the event's own sandbox, whose subjects are
// nexus.events.*.*.<sandbox>.
func journalExpectation(expect []core.Expect, e events.Event) *core.Expect {
	if e.Sandbox == "" {
		return nil
	}
	return expectationOf(expect, core.Sandbox(e.Sandbox))
}

func expectationOf(expect []core.Expect, entity core.Entity) *core.Expect {
	for i := range expect {
		if expect[i].Entity == entity {
			return &expect[i]
		}
	}
	return nil
}

// appendLocked appends msgs, the journal messages of evs: one message on
// its own, or an event giving a handle and its claim as one batch.
func (n *Store) appendLocked(ctx context.Context, msgs []journal.Message, evs []events.Event) ([]uint64, error) {
	last := n.sandboxes.Seq()
	msgs[0].ExpectLastSeq = &last
	// Once published, a record is stored whether or not its caller is
	// still there (a client killed mid-append, a daemon request whose
	// connection closed): the caller's cancellation must not split "stored"
	// from "folded", or every later append would find the journal moved on.
	actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), appendTimeout)
	defer cancel()
	var acks []journal.Ack
	var err error
	if len(msgs) == 1 {
		var ack journal.Ack
		ack, err = n.j.Append(actx, msgs[0])
		acks = []journal.Ack{ack}
	} else {
		acks, err = n.j.AppendBatch(actx, msgs)
	}
	if err != nil {
		return nil, n.journalRefusal(ctx, msgs, evs, err)
	}
	seqs := make([]uint64, len(acks))
	for i, ack := range acks {
		seqs[i] = ack.Seq
		if !ack.Duplicate { // a duplicate was folded when first appended
			n.foldLocked(ack.Seq, evs[i])
		}
	}
	return seqs, nil
}

// journalRefusal names what the journal's own expectation refused: the
// entity whose subject moved (a *core.StaleError), or err as it is.
func (n *Store) journalRefusal(ctx context.Context, msgs []journal.Message, evs []events.Event, err error) error {
	var be *journal.BatchError
	stale := errors.Is(err, journal.ErrStaleSubject) ||
		errors.As(err, &be) && be.WrongLastSequence()
	if !stale {
		return err
	}
	for i, m := range msgs {
		if m.ExpectSubjects == "" {
			continue
		}
		entity := core.Sandbox(evs[i].Sandbox)
		if c, ok := evs[i].Payload.(events.HandleClaimedEvent); ok {
			entity = core.Handle(c.Handle)
		} else if name, own := events.VolumeOf(evs[i]); own {
			entity = core.Volume(name)
		}
		if actual, rerr := n.revLocked(ctx, entity); rerr == nil && actual != m.ExpectSubjectSeq {
			return &core.StaleError{Entity: entity, Expected: m.ExpectSubjectSeq, Actual: actual, Latest: n.typeAt(ctx, actual)}
		}
	}
	return err
}

// foldLocked applies a newly stored event to every view and writes the
// snapshots when enough events have been folded since the last ones.
func (n *Store) foldLocked(seq uint64, e events.Event) {
	if n.obs != nil {
		// Before the views fold it: a saga's last event closes it there.
		n.obs.Stored(e, n.sagaKind(e))
	}
	if !n.loaded.Load() {
		return // dropped after a fold failed: the next call loads them again
	}
	for _, v := range n.views {
		v.Apply(seq, e)
	}
	if err := n.sandboxes.apply(seq, e); err != nil {
		// The event is stored; the view could not read the sandbox's
		// record to fold it. It is dropped, and the next call loads it
		// again from the store and the journal (load rebuilds a store that
		// does not read back).
		fmt.Fprintf(os.Stderr, "nexus: folding event %d: %v (reloading the views)\n", seq, err)
		n.loaded.Store(false)
		n.resetViews()
		return
	}
	n.lastID = e.ID
	n.sinceSnap++
	if n.sinceSnap >= snapshotEvery {
		// A snapshot only shortens the next start's replay. The event is
		// stored and folded, so a snapshot that fails (ENOSPC on the
		// projections directory) must not fail the append; it is retried
		// snapshotRetry events later.
		if err := n.writeSnapshots(); err != nil {
			n.sinceSnap = snapshotEvery - snapshotRetry
		}
	}
}

// Query selects journal events.
type Query = events.Query

// Events calls fn for every event matching q, in journal order. Without
// Follow it stops at the end of the journal; with it, when ctx is done.
func (n *Store) Events(ctx context.Context, q Query, fn func(Record) error) error {
	return n.EventsRaw(ctx, q, func(seq uint64, data []byte) error {
		e, err := events.Decode(data)
		if err != nil {
			return fmt.Errorf("journal event %d: %w", seq, err)
		}
		return fn(Record{Seq: seq, Event: e})
	})
}

// EventsRaw is Events with each event as stored, undecoded: the daemon
// relays the bytes, so a client decodes each event once and the daemon not
// at all.
func (n *Store) EventsRaw(ctx context.Context, q Query, fn func(seq uint64, data []byte) error) error {
	if err := n.Opened(ctx); err != nil {
		return err
	}
	types := q.Types
	if q.Type != "" || len(types) == 0 {
		types = append(slices.Clip(types), q.Type)
	}
	filters, err := events.FilterSubjects(types, q.Sandbox)
	if err != nil {
		return err
	}
	r := journal.Range{From: q.Since, FromTime: q.SinceTime, To: q.Until, ToTime: q.UntilTime,
		Filters: filters, Tail: q.Tail, Follow: q.Follow}
	if q.Sandbox != "" && q.Tail > 0 && !q.Follow {
		// A sandbox's tail ends at its last event, which the store knows:
		// bounded there, it is found among the journal's records before
		// that one, not by counts that match every sandbox's subjects.
		if rev, err := n.EntityRev(ctx, core.Sandbox(q.Sandbox)); err == nil && rev > 0 && (r.To == 0 || rev < r.To) {
			r.To = rev
		}
	}
	return n.j.Scan(ctx, r, func(r journal.Record) error { return fn(r.Seq, r.Data) })
}

// Views are the projections a store keeps current. The sandboxes are read
// one at a time (Sandbox): they live in the store, not in memory.
type Views struct {
	sandboxes *sandboxView
	Sagas     *projections.Sagas
	Volumes   *projections.Volumes
	Images    *projections.ImageCache
}

// Sandbox is the sandbox with id (exact), or nil.
func (v Views) Sandbox(id string) (*projections.Sandbox, error) { return v.sandboxes.get(id) }

// Seq is the last journal event the views have folded.
func (v Views) Seq() uint64 { return v.sandboxes.Seq() }

// View runs fn with the projections held still; fn must not keep them.
// A lazy store must have been loaded (Load) first: a view that failed to
// load must never be decided on as if it were empty.
func (n *Store) View(fn func(Views)) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if !n.loaded.Load() {
		panic("node: View of a lazy node before Load")
	}
	fn(Views{n.sandboxes, n.sagas, n.volumes, n.images})
}
