// Package node owns one state root while it is open: the journal, the
// projections folded from it, and their snapshots. Exactly one node per
// state root exists at a time; other processes reach it through control.
package node

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/oklog/ulid/v2"
	"golang.org/x/sys/unix"

	"github.com/nexus-sandbox/nexus/events"
	"github.com/nexus-sandbox/nexus/guard"
	"github.com/nexus-sandbox/nexus/host/fsx"
	"github.com/nexus-sandbox/nexus/host/journal"
	"github.com/nexus-sandbox/nexus/projections"
)

// ErrStateRoot means the state root cannot be used as given.
var ErrStateRoot = errors.New("unusable state root")

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
}

// Record is one journal event with its sequence.
type Record = events.Record

// Node is an open state root.
type Node struct {
	root string
	j    *journal.Journal
	mu   sync.Mutex // serialises appends so expected-sequence checks hold
	gc   groupCommit

	views     []projections.Projection
	sandboxes *projections.Sandboxes
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
func Open(ctx context.Context, root string, opts Options) (*Node, error) {
	root, err := PrepareRoot(root)
	if err != nil {
		return nil, err
	}
	jo := opts.Journal
	jo.Dir = filepath.Join(root, "journal")
	j, err := journal.Open(ctx, jo)
	if err != nil {
		return nil, err
	}
	n := &Node{
		root: root, j: j, gc: newGroupCommit(),
	}
	n.resetViews()
	if opts.Lazy {
		return n, nil
	}
	if err := n.loadLocked(ctx); err != nil {
		j.Close()
		return nil, err
	}
	return n, nil
}

// Load brings the projections up to the journal, if Open was lazy and
// nothing has loaded them yet.
func (n *Node) Load(ctx context.Context) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.loadLocked(ctx)
}

func (n *Node) loadLocked(ctx context.Context) error {
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

// Decoded counts the journal events this node has folded and the sandbox
// records it has decoded from snapshots since Open: what the O(1) tests of
// issue 21 count.
func (n *Node) Decoded() uint64 { return n.decoded.Load() }

// Sandbox is one sandbox by ID (any case) or handle; found is false if
// there is none. On a lazy node not yet loaded, an ID is answered by
// folding that sandbox's own events, read through the journal's
// per-sandbox subject filter: the Sandboxes fold of a sandbox depends only
// on its own events, so this is the record a full load would hold, at the
// cost of that sandbox's history alone. A handle needs the loaded view.
func (n *Node) Sandbox(ctx context.Context, ref string) (projections.Sandbox, bool, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	id := strings.ToUpper(ref)
	if _, err := ulid.ParseStrict(id); err == nil && !n.loaded.Load() {
		return n.foldOneLocked(ctx, id)
	}
	if err := n.loadLocked(ctx); err != nil {
		return projections.Sandbox{}, false, err
	}
	sb := n.sandboxes.Get(id)
	if sb == nil && ref != "" {
		sb = n.sandboxes.ByHandle(ref)
	}
	if sb == nil {
		return projections.Sandbox{}, false, nil
	}
	return *sb, true, nil
}

func (n *Node) foldOneLocked(ctx context.Context, id string) (projections.Sandbox, bool, error) {
	one := projections.NewSandboxes()
	err := n.j.Scan(ctx, journal.Range{Filters: []string{events.SandboxSubjects(id)}}, func(r journal.Record) error {
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

// PrepareRoot makes root absolute, creates it 0700 if missing, and refuses
// a root that is not a directory, is a symlink, is writable by group or
// others, belongs to another user, or cannot be written.
func PrepareRoot(root string) (string, error) {
	if root == "" {
		return "", fmt.Errorf("%w: empty path", ErrStateRoot)
	}
	abs, err := filepath.Abs(root)
	if err != nil {
		return "", fmt.Errorf("%w: %v", ErrStateRoot, err)
	}
	if err := os.MkdirAll(abs, 0o700); err != nil {
		return "", fmt.Errorf("%w: %s: %v", ErrStateRoot, abs, errors.Unwrap(err))
	}
	var st unix.Stat_t
	if err := unix.Lstat(abs, &st); err != nil {
		return "", fmt.Errorf("%w: %s: %v", ErrStateRoot, abs, err)
	}
	switch {
	case st.Mode&unix.S_IFMT != unix.S_IFDIR:
		return "", fmt.Errorf("%w: %s is not a directory", ErrStateRoot, abs)
	case st.Uid != uint32(os.Geteuid()):
		return "", fmt.Errorf("%w: %s belongs to uid %d, not %d", ErrStateRoot, abs, st.Uid, os.Geteuid())
	case st.Mode&0o022 != 0:
		return "", fmt.Errorf("%w: %s is writable by group or others (mode %04o)", ErrStateRoot, abs, st.Mode&0o7777)
	}
	if err := unix.Access(abs, unix.W_OK); err != nil {
		return "", fmt.Errorf("%w: %s is not writable: %v", ErrStateRoot, abs, err)
	}
	return abs, nil
}

// Root is the absolute state root.
func (n *Node) Root() string { return n.root }

// Journal exposes the journal, for the daemon's subscriber listener.
func (n *Node) Journal() *journal.Journal { return n.j }

// load restores each projection from its snapshot when the snapshot still
// matches the journal, then folds the tail. A snapshot that does not decode
// or whose last event is not in the journal is ignored, and the projection
// is rebuilt from the start.
func (n *Node) load(ctx context.Context) error {
	from := uint64(0)
	restored := true
	for _, v := range n.views {
		snap, err := n.readSnapshot(ctx, v)
		if errors.Is(err, fsx.ErrNotRegular) || errors.Is(err, fsx.ErrSymlink) {
			// Not nexus's file: an operator must look at it, not a rebuild.
			return fmt.Errorf("projections: %w", err)
		}
		if err != nil {
			restored = false
			break
		}
		if from == 0 || snap.Seq < from {
			from = snap.Seq
		}
		if v == projections.Projection(n.sandboxes) {
			n.decoded.Add(uint64(n.sandboxes.Len()))
		}
	}
	if !restored {
		n.resetViews()
		from = 0
	}
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
	if folded >= snapshotEvery {
		// Best effort, as after an append: a full projections/ must not
		// keep the state root from opening for reads.
		if err := n.writeSnapshots(); err != nil {
			n.sinceSnap = snapshotEvery - snapshotRetry
		}
	}
	return nil
}

func (n *Node) resetViews() {
	n.sandboxes = projections.NewSandboxes()
	n.sagas, n.volumes = projections.NewSagas(), projections.NewVolumes()
	n.images = projections.NewImageCache()
	n.views = []projections.Projection{n.sandboxes, n.sagas, n.volumes, n.images}
}

// retiredOwnershipSnap is the snapshot of the ownership view older builds
// folded here; the Sandboxes view answers every ownership question now.
const retiredOwnershipSnap = "ownership.snap"

func (n *Node) snapshotPath(v projections.Projection) string {
	return filepath.Join(n.root, "projections", v.Name()+".snap")
}

func (n *Node) readSnapshot(ctx context.Context, v projections.Projection) (projections.Snapshot, error) {
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

func (n *Node) writeSnapshots() error {
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
	// Older builds also kept an ownership view no command read; its
	// snapshot goes rather than lingering as a file nothing accounts for.
	if err := fsx.Remove(n.root, filepath.Join("projections", retiredOwnershipSnap)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	n.sinceSnap = 0
	return nil
}

// Close snapshots the projections, if the tail the next Open would replay
// has grown past closeSnapshotMin events or there are no snapshots yet, and
// closes the journal.
func (n *Node) Close() error {
	n.mu.Lock()
	defer n.mu.Unlock()
	var err error
	if !n.loaded.Load() {
		return n.j.Close() // nothing folded, nothing to snapshot
	}
	if n.sinceSnap >= closeSnapshotMin || n.sinceSnap > 0 && !n.haveSnapshots() {
		err = n.writeSnapshots()
	}
	return errors.Join(err, n.j.Close())
}

// haveSnapshots reports whether every projection has a snapshot file.
func (n *Node) haveSnapshots() bool {
	for _, v := range n.views {
		if _, err := fsx.Stat(n.root, n.snapshotPath(v)); err != nil {
			return false
		}
	}
	return true
}

// Append journals evs in order, each synced before the next, asserting the
// journal has not moved since this node last folded it, then folds them.
// It returns each event's sequence.
func (n *Node) Append(ctx context.Context, evs ...events.Event) ([]uint64, error) {
	return n.AppendExpect(ctx, nil, evs...)
}

// AppendExpect is Append for a decision: it refuses the whole batch with a
// *guard.StaleError unless every expected entity is still at the sequence
// the decision saw. The node checks under its append lock, and the journal
// checks the first sandbox expectation again on the event's own subjects.
// Any event of a saga the journal has closed is refused (guard.ErrSagaClosed).
//
// Concurrent calls are committed together (see groupAppend): each call's
// events are one atomic journal batch, and calls that touch different
// entities share it, so they share one fsync. Each call still returns only
// once its own events are on disk, and a refusal of one call does not fail
// the others.
func (n *Node) AppendExpect(ctx context.Context, expect []guard.Expect, evs ...events.Event) ([]uint64, error) {
	return n.AppendDecoded(ctx, expect, evs, nil)
}

// AppendDecoded is AppendExpect for events that arrived encoded (the
// daemon's append stream): data[i] is the journal bytes evs[i] was decoded
// from (events.Decode, which refuses anything it would not keep), stored
// as they are instead of encoded again. data may be nil.
func (n *Node) AppendDecoded(ctx context.Context, expect []guard.Expect, evs []events.Event, data [][]byte) ([]uint64, error) {
	if data != nil && len(data) != len(evs) {
		return nil, fmt.Errorf("append: %d events with %d encodings", len(evs), len(data))
	}
	// An append is decided against the views (expectations, open sagas):
	// a lazy node loads them first.
	if !n.loaded.Load() {
		if err := n.Load(ctx); err != nil {
			return nil, err
		}
	}
	return n.groupAppend(ctx, expect, evs, data)
}

// appendOneByOneLocked is AppendExpect for one call on its own: each event
// is its own journal append, synced before the next. It is the fallback
// when a batch is refused as a whole, which tells each call its own result.
func (n *Node) appendOneByOneLocked(ctx context.Context, expect []guard.Expect, evs []events.Event) ([]uint64, error) {
	if err := n.checkExpectLocked(ctx, expect, evs); err != nil {
		if seqs, ok := errStored(err); ok {
			return seqs, nil
		}
		return nil, err
	}
	seqs := make([]uint64, 0, len(evs))
	for i, e := range evs {
		if err := n.admitLocked(e); err != nil {
			return seqs, err
		}
		var subj *guard.Expect
		if i == 0 {
			subj = journalExpectation(expect, e)
		}
		seq, err := n.appendLocked(ctx, e, subj)
		if err != nil {
			return seqs, err
		}
		seqs = append(seqs, seq)
	}
	return seqs, nil
}

// Rev is the sequence of the last event about entity (0: none).
func (n *Node) Rev(entity guard.Entity) uint64 {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.loadLocked(context.Background()) != nil {
		return 0
	}
	return n.revLocked(entity)
}

func (n *Node) revLocked(entity guard.Entity) uint64 {
	switch entity.Kind() {
	case "sandbox":
		if sb := n.sandboxes.Get(entity.Name()); sb != nil {
			return sb.Rev
		}
	case "volume":
		if v := n.volumes.Get(entity.Name()); v != nil {
			return v.Rev
		}
	}
	return 0
}

// typeAt names the event at seq for a refusal message; "" if unknown.
func (n *Node) typeAt(ctx context.Context, seq uint64) events.Type {
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

// admitLocked refuses an event of a saga the journal does not show open:
// once a saga is finished or compensated (by its runner or by recover),
// nothing more may be written in its name.
func (n *Node) admitLocked(e events.Event) error {
	if e.Saga == "" || e.Type == events.SagaStarted || n.sagas.Get(e.Saga) != nil {
		return nil
	}
	return sagaClosedError(e)
}

func sagaClosedError(e events.Event) error {
	return fmt.Errorf("%w: %s of saga %s is not open in the journal", guard.ErrSagaClosed, e.Type, e.Saga)
}

// journalExpectation is the expectation the journal itself checks for an
// event: the one about the event's own sandbox, whose subjects are
// nexus.events.*.*.<sandbox>.
func journalExpectation(expect []guard.Expect, e events.Event) *guard.Expect {
	if e.Sandbox == "" {
		return nil
	}
	for i := range expect {
		if expect[i].Entity == guard.Sandbox(e.Sandbox) {
			return &expect[i]
		}
	}
	return nil
}

func (n *Node) appendLocked(ctx context.Context, e events.Event, subj *guard.Expect) (uint64, error) {
	subject, err := e.Subject()
	if err != nil {
		return 0, err
	}
	data, err := events.Encode(e)
	if err != nil {
		return 0, err
	}
	last := n.sandboxes.Seq()
	msg := journal.Message{Subject: subject, ID: e.DedupID(), Data: data, ExpectLastSeq: &last,
		Reserve: freesSpace(e, n.sagaKind(e))}
	if subj != nil {
		msg.ExpectSubjects, msg.ExpectSubjectSeq = events.SandboxSubjects(e.Sandbox), subj.Seq
	}
	// Once published, a record is stored whether or not its caller is
	// still there (a client killed mid-append, a daemon request whose
	// connection closed): the caller's cancellation must not split "stored"
	// from "folded", or every later append would find the journal moved on.
	actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), appendTimeout)
	defer cancel()
	ack, err := n.j.Append(actx, msg)
	if errors.Is(err, journal.ErrStaleSubject) {
		return 0, &guard.StaleError{Entity: subj.Entity, Expected: subj.Seq, Actual: n.revLocked(subj.Entity)}
	}
	if err != nil {
		return 0, err
	}
	if ack.Duplicate {
		return ack.Seq, nil // already folded when it was first appended
	}
	n.foldLocked(ack.Seq, e)
	return ack.Seq, nil
}

// foldLocked applies a newly stored event to every view and writes the
// snapshots when enough events have been folded since the last ones.
func (n *Node) foldLocked(seq uint64, e events.Event) {
	for _, v := range n.views {
		v.Apply(seq, e)
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
func (n *Node) Events(ctx context.Context, q Query, fn func(Record) error) error {
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
func (n *Node) EventsRaw(ctx context.Context, q Query, fn func(seq uint64, data []byte) error) error {
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
	return n.j.Scan(ctx, r, func(r journal.Record) error { return fn(r.Seq, r.Data) })
}

// Views are the projections a node keeps current.
type Views struct {
	Sandboxes *projections.Sandboxes
	Sagas     *projections.Sagas
	Volumes   *projections.Volumes
	Images    *projections.ImageCache
}

// View runs fn with the projections held still; fn must not keep them.
// A lazy node must have been loaded (Load) first: a view that failed to
// load must never be decided on as if it were empty.
func (n *Node) View(fn func(Views)) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if !n.loaded.Load() {
		panic("node: View of a lazy node before Load")
	}
	fn(Views{n.sandboxes, n.sagas, n.volumes, n.images})
}
