package store

import (
	"bytes"
	"slices"
	"strings"
	"sync/atomic"

	"github.com/oklog/ulid/v2"
	bolt "go.etcd.io/bbolt"

	"github.com/nexus-sandbox/nexus/events"
	"github.com/nexus-sandbox/nexus/projections"
)

// sandboxView is the Sandboxes view a store decides from: the records at
// rest in the store, as of the store's position, under an overlay that
// holds every sandbox an event touched since. Folding an event seeds the
// overlay with the sandbox's stored record first, so the overlay's record
// is the one a fold of the whole journal would hold (the Sandboxes fold of
// a sandbox depends on that sandbox's events alone), and a touched
// sandbox missing from the overlay is gone. A checkpoint writes the
// touched records back and empties the overlay, so the overlay, and so a
// store's memory, is bounded by the events since the last checkpoint.
//
// Without a store (none usable yet, or none could be written) the overlay
// holds every sandbox and is the whole view, as before the store existed.
type sandboxView struct {
	store   *sandboxStore // nil: the overlay is complete
	pos     storePosition // what the store holds
	overlay *projections.Sandboxes
	// touched: the sandboxes with an event since pos, each mapped to
	// whether the store holds a record of it and that record's state (for
	// count and states).
	touched map[string]storedAs
	decoded *atomic.Uint64 // records decoded from the store, for Decoded
}

func newSandboxView(store *sandboxStore, pos storePosition, decoded *atomic.Uint64) *sandboxView {
	return &sandboxView{store: store, pos: pos, overlay: projections.NewSandboxesAt(pos.Seq),
		touched: map[string]storedAs{}, decoded: decoded}
}

// completeView is a view held whole in memory: full is every sandbox.
func completeView(full *projections.Sandboxes, decoded *atomic.Uint64) *sandboxView {
	return &sandboxView{overlay: full, touched: map[string]storedAs{}, decoded: decoded}
}

// Seq is the last event folded.
func (v *sandboxView) Seq() uint64 { return v.overlay.Seq() }

func (v *sandboxView) stored(id string) (*projections.Sandbox, error) {
	sb, err := v.store.get(id)
	if sb != nil {
		v.decoded.Add(1)
	}
	return sb, err
}

// apply folds the event stored at seq.
func (v *sandboxView) apply(seq uint64, e events.Event) error {
	if id := e.Sandbox; id != "" && v.store != nil {
		if _, seen := v.touched[id]; !seen {
			sb, err := v.stored(id)
			if err != nil {
				return err
			}
			if sb != nil {
				v.overlay.Put(sb)
			}
			at := storedAs{}
			if sb != nil {
				at = storedAs{in: true, key: StateOf(sb)}
			}
			v.touched[id] = at
		}
	}
	v.overlay.Apply(seq, e)
	return nil
}

// fromStore says whether id's current record is the stored one.
func (v *sandboxView) fromStore(id string) bool {
	if v.store == nil {
		return false
	}
	_, seen := v.touched[id]
	return !seen
}

// storedBytes is fromStore of an ID read from the store's page, without
// copying it.
func (v *sandboxView) storedBytes(id []byte) bool {
	if v.store == nil {
		return false
	}
	_, seen := v.touched[string(id)]
	return !seen
}

// get is the sandbox with id, or nil.
func (v *sandboxView) get(id string) (*projections.Sandbox, error) {
	if v.fromStore(id) {
		return v.stored(id)
	}
	return v.overlay.Get(id), nil
}

// least is the smallest of the overlay's answer (over, "" for none) and
// the stored IDs of index under key that are still current, leaving out
// except.
func (v *sandboxView) least(over string, index []byte, key, except string) (string, error) {
	if v.store == nil {
		return over, nil
	}
	err := v.store.db.View(func(tx *bolt.Tx) error {
		if b := tx.Bucket(index); b != nil {
			if id := v.leastCurrent(b.Cursor(), append([]byte(key), 0), false, except, over); id != nil {
				over = string(id)
			}
		}
		return nil
	})
	return over, err
}

// leastCurrent walks the index keys c holds beginning with prefix (a key
// is a key NUL an ID; below a directory, the ID is what follows the
// key's NUL) and returns the least ID, other than except, whose stored
// record is still current and that is less than over (the overlay's
// answer, "" for none): a slice of the store's page, nil when over
// stays the least.
func (v *sandboxView) leastCurrent(c *bolt.Cursor, prefix []byte, below bool, except, over string) (found []byte) {
	n := len(prefix)
	for k, _ := c.Seek(prefix); k != nil && bytes.HasPrefix(k, prefix); k, _ = c.Next() {
		id := k[n:]
		if below {
			i := bytes.IndexByte(k, 0)
			if i < 0 {
				continue
			}
			id = k[i+1:]
		}
		switch {
		case string(id) == except || !v.storedBytes(id):
		case found != nil && bytes.Compare(id, found) >= 0:
		case found == nil && over != "" && string(id) >= over:
		default:
			found = id
		}
	}
	return found
}

// byHandle is Sandboxes.ByHandle over the whole view.
func (v *sandboxView) byHandle(handle string) (*projections.Sandbox, error) {
	if handle == "" {
		return nil, nil
	}
	over := ""
	if sb := v.overlay.ByHandle(handle); sb != nil {
		over = sb.ID
	}
	id, err := v.least(over, bucketHandles, handle, "")
	if err != nil || id == "" {
		return nil, err
	}
	return v.get(id)
}

// named is Sandboxes.Named over the whole view, in ID order: the
// overlay's answer and the store's, each of the store's by a seek in an
// index (handle, ID, short ID), at most limit of each kind.
func (v *sandboxView) named(ref string, limit int) (out []projections.Ref, err error) {
	defer func() {
		slices.SortStableFunc(out, func(a, b projections.Ref) int { return strings.Compare(a.ID, b.ID) })
	}()
	out = v.overlay.Named(ref)
	if v.store == nil {
		return out, nil
	}
	ids, err := v.store.ids(bucketHandles, ref)
	if err != nil {
		return nil, err
	}
	for _, id := range ids {
		if v.fromStore(id) {
			out = append(out, projections.Ref{ID: id, Handle: ref})
		}
	}
	if !projections.IDPrefixLike(ref) {
		return out, nil
	}
	ids, err = v.store.named(strings.ToUpper(ref), strings.ToLower(ref), limit, v.fromStore)
	if err != nil {
		return nil, err
	}
	for _, id := range ids {
		out = append(out, projections.Ref{ID: id})
	}
	return out, nil
}

// snapshotOwner is Sandboxes.SnapshotOwner over the whole view.
func (v *sandboxView) snapshotOwner(snap string) (*projections.Sandbox, error) {
	over := ""
	if sb := v.overlay.SnapshotOwner(snap); sb != nil {
		over = sb.ID
	}
	id, err := v.least(over, bucketSnaps, snap, "")
	if err != nil || id == "" {
		return nil, err
	}
	return v.get(id)
}

// snapshotsNamed is Sandboxes.SnapshotsNamed over the whole view, in
// snapshot ID order: the overlay's answer and the store's, each of the
// store's by a seek in a snapshot index (ID, short ID), at most limit of
// each kind.
func (v *sandboxView) snapshotsNamed(ref string, limit int) (out []projections.SnapshotRef, err error) {
	out = v.overlay.SnapshotsNamed(ref)
	if v.store == nil || !projections.IDPrefixLike(ref) {
		return out, nil
	}
	stored, err := v.store.snapshotsNamed(strings.ToUpper(ref), strings.ToLower(ref), limit, v.fromStore)
	if err != nil {
		return nil, err
	}
	out = append(out, stored...)
	slices.SortStableFunc(out, func(a, b projections.SnapshotRef) int {
		if c := strings.Compare(a.ID, b.ID); c != 0 {
			return c
		}
		return strings.Compare(a.Sandbox, b.Sandbox)
	})
	return out, nil
}

// ownerOf is Sandboxes.OwnerOf over the whole view.
func (v *sandboxView) ownerOf(paths []string, except string) (id, path string, found bool, err error) {
	id, path, found = v.overlay.OwnerOf(paths, except)
	for _, p := range paths {
		if id, err = v.least(id, bucketOwners, p, except); err != nil {
			return "", "", false, err
		}
	}
	if id == "" || !v.fromStore(id) {
		return id, path, found, nil
	}
	sb, err := v.stored(id)
	if err != nil || sb == nil {
		return "", "", false, err
	}
	for _, p := range paths {
		if sb.Owns(p) {
			return id, p, true, nil
		}
	}
	return "", "", false, nil // unreachable: the index named it for one of paths
}

// eachPathOwner calls fn with the index of each of paths and the sandbox
// owning it by projections.PathOwner's rule (nil for none), over the
// overlay's indexes and the store's: point lookups that decode no record,
// all in one read transaction of the store through one cursor, copying
// no path and no ID (owner is the store's page or the overlay's string,
// valid during the call).
func (v *sandboxView) eachPathOwner(paths []string, fn func(i int, owner []byte)) error {
	judge := func(tx *bolt.Tx) error {
		l := ownerLookup{v: v}
		if tx != nil {
			if b := tx.Bucket(bucketOwners); b != nil {
				l.c = b.Cursor()
			}
			// A reap asks batch after batch, in path order: each one's
			// pages are let go when it is answered.
			defer unmapPages(tx)
		}
		for i, rel := range paths {
			l.found, l.over = nil, ""
			if _, ok, err := projections.PathOwner(rel, l.exact, l.below); err != nil {
				return err
			} else if !ok {
				fn(i, nil)
				continue
			}
			if l.found != nil {
				fn(i, l.found)
				continue
			}
			l.key = append(l.key[:0], l.over...)
			fn(i, l.key)
		}
		return nil
	}
	if v.store == nil {
		return judge(nil)
	}
	return v.store.db.View(judge)
}

// ownerLookup answers projections.PathOwner's two questions for
// eachPathOwner. The owner it finds is left in found (a key of the
// store's index: a slice of its page) or over (the overlay's), and
// PathOwner is told only whether there is one, so that no ID is copied
// into a string.
type ownerLookup struct {
	v     *sandboxView
	c     *bolt.Cursor // the owners index; nil: none
	key   []byte       // the seek key, reused
	found []byte
	over  string
}

func (l *ownerLookup) exact(p string) (string, bool, error) {
	l.over, _, _ = l.v.overlay.OwnerExact(p)
	l.found = nil
	if l.c != nil {
		l.key = append(append(l.key[:0], p...), 0)
		l.least(len(l.key), false)
	}
	return "", l.found != nil || l.over != "", nil
}

func (l *ownerLookup) below(dir string) (string, bool, error) {
	l.over, _, _ = l.v.overlay.OwnerBelow(dir)
	l.found = nil
	if l.c != nil {
		l.key = append(append(l.key[:0], dir...), '/')
		l.least(len(l.key), true)
	}
	return "", l.found != nil || l.over != "", nil
}

// least keeps in found the least current ID of the index's keys
// beginning with the seek key (of length n) if it is less than the
// overlay's answer (which it then clears).
func (l *ownerLookup) least(n int, below bool) {
	if id := l.v.leastCurrent(l.c, l.key[:n], below, "", l.over); id != nil {
		l.found, l.over = id, ""
	}
}

// pathOwners is eachPathOwner's answers as strings.
func (v *sandboxView) pathOwners(paths []string) ([]string, error) {
	out := make([]string, len(paths))
	err := v.eachPathOwner(paths, func(i int, owner []byte) { out[i] = string(owner) })
	return out, err
}

// page is Sandboxes.Page over the whole view: the overlay's page and the
// store's, merged in ID order.
func (v *sandboxView) page(after string, limit int) ([]*projections.Sandbox, error) {
	over := v.overlay.Page(after, limit)
	if v.store == nil {
		return over, nil
	}
	stored, err := v.store.page(after, limit, func(id string) bool { return !v.fromStore(id) })
	if err != nil {
		return nil, err
	}
	v.decoded.Add(uint64(len(stored)))
	out := append(over, stored...)
	slices.SortFunc(out, func(a, b *projections.Sandbox) int {
		switch {
		case a.ID < b.ID:
			return -1
		case a.ID > b.ID:
			return 1
		}
		return 0
	})
	return out[:min(limit, len(out))], nil
}

// listed is page for a listing: the overlay's records and the store's
// kept listing bytes (sandboxStore.listed), merged in ID order.
func (v *sandboxView) listed(after string, limit int) ([]Listed, error) {
	var out []Listed
	for _, sb := range v.overlay.Page(after, limit) {
		out = append(out, Listed{ID: sb.ID, Sandbox: sb})
	}
	if v.store == nil {
		return out, nil
	}
	stored, decoded, err := v.store.listed(after, limit, func(id string) bool { return !v.fromStore(id) })
	if err != nil {
		return nil, err
	}
	v.decoded.Add(uint64(decoded))
	out = append(out, stored...)
	slices.SortFunc(out, func(a, b Listed) int { return strings.Compare(a.ID, b.ID) })
	return out[:min(limit, len(out))], nil
}

// each calls fn with every sandbox, a page at a time in ID order.
func (v *sandboxView) each(fn func([]*projections.Sandbox)) error {
	const pageSize = 1000
	for after := ""; ; {
		page, err := v.page(after, pageSize)
		if err != nil {
			return err
		}
		fn(page)
		if len(page) < pageSize {
			return nil
		}
		after = page[len(page)-1].ID
	}
}

// count is the number of sandboxes in the view.
func (v *sandboxView) count() int {
	n := int(v.pos.Count) + v.overlay.Len()
	for _, at := range v.touched {
		if at.in {
			n--
		}
	}
	return n
}

// storedAs is what the store holds of a touched sandbox.
type storedAs struct {
	in  bool     // the store holds a record of it
	key StateKey // that record's state
}

// states counts the view's sandboxes by state: the store's counts as of
// its position, less the touched records it holds, plus the overlay. It
// reads the counts index and the overlay, never the records.
func (v *sandboxView) states() (map[StateKey]int, error) {
	out := map[StateKey]int{}
	if v.store != nil {
		stored, err := v.store.stateCounts()
		if err != nil {
			return nil, err
		}
		for k, c := range stored {
			out[k] += int(c)
		}
		for _, at := range v.touched {
			if at.in {
				out[at.key]--
			}
		}
	}
	for _, sb := range v.overlay.List() {
		out[StateOf(sb)]++
	}
	for k, c := range out {
		if c == 0 {
			delete(out, k)
		}
	}
	return out, nil
}

// withProcesses is every sandbox that records a process (HasProcess).
func (v *sandboxView) withProcesses() ([]*projections.Sandbox, error) {
	var out []*projections.Sandbox
	for _, sb := range v.overlay.List() {
		if sb.HasProcess() {
			out = append(out, sb)
		}
	}
	if v.store == nil {
		return out, nil
	}
	ids, err := v.store.ids(bucketProcs, "")
	if err != nil {
		return nil, err
	}
	for _, id := range ids {
		if !v.fromStore(id) {
			continue
		}
		sb, err := v.stored(id)
		if err != nil {
			return nil, err
		}
		if sb != nil {
			out = append(out, sb)
		}
	}
	return out, nil
}

// checkpoint writes the view to the store as of its last event (lastID)
// and empties the overlay. A complete view is written whole to store, which
// it then reads through.
func (v *sandboxView) checkpoint(store *sandboxStore, lastID ulid.ULID) error {
	pos := storePosition{Seq: v.Seq(), EventID: lastID}
	var err error
	if v.store == nil {
		pos, err = store.replace(pos, v.overlay.List())
	} else {
		changed := make(map[string]*projections.Sandbox, len(v.touched))
		for id := range v.touched {
			changed[id] = v.overlay.Get(id)
		}
		pos, err = store.write(pos, changed)
	}
	if err != nil {
		return err
	}
	*v = *newSandboxView(store, pos, v.decoded)
	return nil
}
