package store

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/oklog/ulid/v2"
	bolt "go.etcd.io/bbolt"
	"golang.org/x/sys/unix"

	"github.com/nexus-sandbox/nexus/projections"
)

// sandboxStore is the Sandboxes view at rest: one record per sandbox in a
// bbolt file (projections/sandboxes.db), keyed by ID, the indexes the
// per-entity questions need (handle, short ID, owned path, snapshot and
// its short ID, recorded processes), and the journal position the records
// reflect. A store reads
// the records it is asked about, not the file, and a checkpoint rewrites
// the records touched since the last one, not every record: what a
// command costs does not grow with the sandboxes it does not name.
// bbolt, because a B+tree file with atomic, fsynced
// transactions is what we would otherwise write by hand.
type sandboxStore struct{ db *bolt.DB }

// storeFile is the store's name under projections/.
const storeFile = "sandboxes.db"

// storeFormat is the version of the store's layout and records. A store of
// another format is rebuilt from the journal, never read.
const storeFormat = 6

var (
	bucketMeta    = []byte("meta")
	bucketRecords = []byte("sandboxes") // id → projections.EncodeSandbox
	bucketListing = []byte("listing")   // id → projections.ListItem of the record
	// Index buckets hold key 0x00 id → nothing, so a key with several
	// sandboxes (a history made by hand) keeps them all, in ID order.
	bucketHandles = []byte("handles")   // handle
	bucketShort   = []byte("short")     // projections.ShortID
	bucketOwners  = []byte("owners")    // resource path
	bucketSnaps   = []byte("snapshots") // snapshot ID
	bucketProcs   = []byte("processes") // "" for each sandbox that records a process (HasProcess)
	// bucketStates counts the records by state: StateKey.bytes → u64.
	bucketStates = []byte("states")
	// bucketSnapShort is an index whose key is a snapshot's short ID 0x00
	// the snapshot's ID, so a seek by a prefix of a short ID reads the
	// snapshot and its sandbox from the keys alone.
	bucketSnapShort = []byte("snapshort")

	// retiredBuckets are older formats' buckets, dropped when the store is rebuilt.
	retiredBuckets = [][]byte{[]byte("live")}

	metaFormat = []byte("format")
	metaSeq    = []byte("seq")
	metaEvent  = []byte("event")
	metaCount  = []byte("count")
)

// storePosition is the journal event the store's records reflect.
type storePosition struct {
	Seq     uint64
	EventID ulid.ULID
	Count   uint64 // records held
}

// storeOpenTimeout bounds the wait for the file's lock. Only the one store
// of a state root opens it, so a wait means another process holds the root
// against the rules; it is refused, not waited out.
const storeOpenTimeout = 5 * time.Second

func openSandboxStore(path string) (*sandboxStore, error) {
	db, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: storeOpenTimeout})
	if err != nil {
		return nil, fmt.Errorf("sandbox store %s: %w", path, err)
	}
	return &sandboxStore{db: db}, nil
}

func (s *sandboxStore) close() error { return s.db.Close() }

// unmapPages drops from this process's mapping the pages of the store's
// file it has touched: clean pages of the file, which stay in the page
// cache and fault back in when read again. Called within a read
// transaction, which holds bbolt's mapping in place. A reap's owner
// lookups read the whole owned-path index, and without this every page of
// it stays mapped and counts in the daemon's resident size.
func unmapPages(tx *bolt.Tx) {
	if size := tx.Size(); size > 0 {
		unix.Syscall(unix.SYS_MADVISE, tx.DB().Info().Data, uintptr(size), unix.MADV_DONTNEED)
	}
}

// position is what the store reflects; ok is false for a store that holds
// no position of this format (new, or written by another layout).
func (s *sandboxStore) position() (pos storePosition, ok bool, err error) {
	err = s.db.View(func(tx *bolt.Tx) error {
		m := tx.Bucket(bucketMeta)
		if m == nil || !bytes.Equal(m.Get(metaFormat), u64(storeFormat)) {
			return nil
		}
		seq, cnt, ev := m.Get(metaSeq), m.Get(metaCount), m.Get(metaEvent)
		if len(seq) != 8 || len(cnt) != 8 || len(ev) != len(ulid.ULID{}) {
			return fmt.Errorf("%w: sandbox store position is damaged", projections.ErrBadSnapshot)
		}
		pos.Seq, pos.Count = binary.BigEndian.Uint64(seq), binary.BigEndian.Uint64(cnt)
		copy(pos.EventID[:], ev)
		ok = true
		return nil
	})
	return pos, ok, err
}

func u64(v uint64) []byte { return binary.BigEndian.AppendUint64(nil, v) }

// get is the stored record of id; nil if the store holds none.
func (s *sandboxStore) get(id string) (sb *projections.Sandbox, err error) {
	err = s.db.View(func(tx *bolt.Tx) error {
		sb, err = getRecord(tx, id)
		return err
	})
	return sb, err
}

func getRecord(tx *bolt.Tx, id string) (*projections.Sandbox, error) {
	b := tx.Bucket(bucketRecords)
	if b == nil {
		return nil, nil
	}
	data := b.Get([]byte(id))
	if data == nil {
		return nil, nil
	}
	sb, err := projections.DecodeSandbox(data)
	if err != nil {
		return nil, fmt.Errorf("%w: sandbox %s: %v", projections.ErrBadSnapshot, id, err)
	}
	return sb, nil
}

// ids are the sandboxes the index holds under key, in ID order.
func (s *sandboxStore) ids(index []byte, key string) (out []string, err error) {
	err = s.db.View(func(tx *bolt.Tx) error {
		out = idsIn(tx, index, key)
		return nil
	})
	return out, err
}

// idsIn is ids within the read transaction tx.
func idsIn(tx *bolt.Tx, index []byte, key string) (out []string) {
	b := tx.Bucket(index)
	if b == nil {
		return nil
	}
	prefix := append([]byte(key), 0)
	c := b.Cursor()
	for k, _ := c.Seek(prefix); k != nil && bytes.HasPrefix(k, prefix); k, _ = c.Next() {
		out = append(out, string(k[len(prefix):]))
	}
	return out
}

// named are at most limit sandboxes, in key order, whose ID begins with
// idPrefix or whose short ID begins with shortPrefix, each found by one
// seek in the records or the short-ID index and read as keys alone, and
// accepted by keep (a record still current).
func (s *sandboxStore) named(idPrefix, shortPrefix string, limit int, keep func(id string) bool) (out []string, err error) {
	err = s.db.View(func(tx *bolt.Tx) error {
		if b := tx.Bucket(bucketRecords); b != nil {
			prefix, n := []byte(idPrefix), 0
			c := b.Cursor()
			for k, _ := c.Seek(prefix); k != nil && bytes.HasPrefix(k, prefix) && n < limit; k, _ = c.Next() {
				if keep(string(k)) {
					out, n = append(out, string(k)), n+1
				}
			}
		}
		if b := tx.Bucket(bucketShort); b != nil {
			prefix, n := []byte(shortPrefix), 0
			c := b.Cursor()
			for k, _ := c.Seek(prefix); k != nil && bytes.HasPrefix(k, prefix) && n < limit; k, _ = c.Next() {
				if i := bytes.IndexByte(k, 0); i >= 0 && keep(string(k[i+1:])) {
					out, n = append(out, string(k[i+1:])), n+1
				}
			}
		}
		return nil
	})
	return out, err
}

// snapshotsNamed are at most limit snapshots, in key order, whose ID
// begins with idPrefix and at most limit whose short ID begins with
// shortPrefix, each with the sandbox holding it, found by one seek in the
// snapshot or snapshot short-ID index and read from the keys alone, and
// accepted by keep (the holder's record still current).
func (s *sandboxStore) snapshotsNamed(idPrefix, shortPrefix string, limit int, keep func(id string) bool) (out []projections.SnapshotRef, err error) {
	seek := func(tx *bolt.Tx, index []byte, prefix string, parse func(k []byte) (snap, id []byte, ok bool)) {
		b := tx.Bucket(index)
		if b == nil {
			return
		}
		c, n := b.Cursor(), 0
		for k, _ := c.Seek([]byte(prefix)); k != nil && bytes.HasPrefix(k, []byte(prefix)) && n < limit; k, _ = c.Next() {
			if snap, id, ok := parse(k); ok && keep(string(id)) {
				out, n = append(out, projections.SnapshotRef{ID: string(snap), Sandbox: string(id)}), n+1
			}
		}
	}
	err = s.db.View(func(tx *bolt.Tx) error {
		seek(tx, bucketSnaps, idPrefix, func(k []byte) ([]byte, []byte, bool) { // snapshot 0x00 sandbox
			snap, id, ok := bytes.Cut(k, []byte{0})
			return snap, id, ok
		})
		seek(tx, bucketSnapShort, shortPrefix, func(k []byte) ([]byte, []byte, bool) { // short 0x00 snapshot 0x00 sandbox
			_, rest, ok := bytes.Cut(k, []byte{0})
			snap, id, ok2 := bytes.Cut(rest, []byte{0})
			return snap, id, ok && ok2
		})
		return nil
	})
	return out, err
}

// page is at most limit records whose IDs sort after after, in ID order,
// leaving out those skip names (the overlay's).
func (s *sandboxStore) page(after string, limit int, skip func(id string) bool) (out []*projections.Sandbox, err error) {
	err = s.db.View(func(tx *bolt.Tx) error {
		b := tx.Bucket(bucketRecords)
		if b == nil {
			return nil
		}
		c := b.Cursor()
		k, v := c.Seek([]byte(after))
		if k != nil && string(k) == after {
			k, v = c.Next()
		}
		for ; k != nil && len(out) < limit; k, v = c.Next() {
			if skip(string(k)) {
				continue
			}
			sb, err := projections.DecodeSandbox(v)
			if err != nil {
				return fmt.Errorf("%w: sandbox %s: %v", projections.ErrBadSnapshot, k, err)
			}
			out = append(out, sb)
		}
		return nil
	})
	return out, err
}

// Listed is one sandbox of a listing: the bytes the store keeps for it
// (JSON, projections.ListItem), or, for a record the caller must look at
// first (one that records a process, whose exit a listing observes, or
// one changed since the last checkpoint), the record itself.
type Listed struct {
	ID      string
	JSON    []byte
	Sandbox *projections.Sandbox
}

// listed is at most limit sandboxes whose IDs sort after after, in ID
// order, leaving out those skip names: the kept listing bytes of each,
// decoding only the records that record a process.
func (s *sandboxStore) listed(after string, limit int, skip func(id string) bool) (out []Listed, decoded int, err error) {
	err = s.db.View(func(tx *bolt.Tx) error {
		b, procs := tx.Bucket(bucketListing), tx.Bucket(bucketProcs)
		if b == nil {
			return nil
		}
		c := b.Cursor()
		k, v := c.Seek([]byte(after))
		if k != nil && string(k) == after {
			k, v = c.Next()
		}
		for ; k != nil && len(out) < limit; k, v = c.Next() {
			id := string(k)
			if skip(id) {
				continue
			}
			if hasKey(procs, append([]byte{0}, k...)) {
				sb, err := getRecord(tx, id)
				if err != nil {
					return err
				}
				decoded++
				out = append(out, Listed{ID: id, Sandbox: sb})
				continue
			}
			out = append(out, Listed{ID: id, JSON: bytes.Clone(v)})
		}
		return nil
	})
	return out, decoded, err
}

// hasKey says whether b holds key (an index entry's value is empty, which
// Get does not tell from a missing key).
func hasKey(b *bolt.Bucket, key []byte) bool {
	if b == nil {
		return false
	}
	k, _ := b.Cursor().Seek(key)
	return bytes.Equal(k, key)
}

// write makes the store reflect pos: each changed ID's record replaced by
// the one given, or deleted where that is nil, its index entries moved
// with it, in one transaction (bbolt syncs it before returning). pos.Count
// is ignored: the result carries the count the store holds now.
func (s *sandboxStore) write(pos storePosition, changed map[string]*projections.Sandbox) (storePosition, error) {
	err := s.db.Update(func(tx *bolt.Tx) error {
		b, err := createBuckets(tx)
		if err != nil {
			return err
		}
		count, err := storedCount(tx)
		if err != nil {
			return err
		}
		// In key order: new sandboxes' IDs (ULIDs) sort after the stored
		// ones, so their records append to the last page, which is then
		// filled, not split in half (a map's order scattered them over
		// half-empty pages: 146 MB for 100k sandboxes).
		for _, id := range slices.Sorted(maps.Keys(changed)) {
			sb := changed[id]
			old, err := getRecord(tx, id)
			if err != nil {
				return err
			}
			if old != nil {
				if err := indexRecord(tx, old, (*bolt.Bucket).Delete); err != nil {
					return err
				}
				if err := addState(tx, StateOf(old), -1); err != nil {
					return err
				}
				count--
			}
			if sb == nil {
				if err := b.Delete([]byte(id)); err != nil {
					return err
				}
				if err := tx.Bucket(bucketListing).Delete([]byte(id)); err != nil {
					return err
				}
				continue
			}
			if err := putRecord(tx, b, sb); err != nil {
				return err
			}
			count++
		}
		pos.Count = count
		return putPosition(tx, pos)
	})
	return pos, err
}

func storedCount(tx *bolt.Tx) (uint64, error) {
	c := tx.Bucket(bucketMeta).Get(metaCount)
	switch len(c) {
	case 0:
		return 0, nil
	case 8:
		return binary.BigEndian.Uint64(c), nil
	}
	return 0, fmt.Errorf("%w: sandbox store count is damaged", projections.ErrBadSnapshot)
}

// replace makes the store hold exactly all, at pos: a rebuild from the
// journal, or the first store of a root that had only snapshots.
func (s *sandboxStore) replace(pos storePosition, all []*projections.Sandbox) (storePosition, error) {
	pos.Count = uint64(len(all))
	err := s.db.Update(func(tx *bolt.Tx) error {
		for _, name := range append([][]byte{bucketMeta, bucketRecords, bucketListing, bucketHandles, bucketShort, bucketOwners, bucketSnaps, bucketSnapShort, bucketProcs, bucketStates}, retiredBuckets...) {
			if err := tx.DeleteBucket(name); err != nil && !errors.Is(err, bolt.ErrBucketNotFound) {
				return err
			}
		}
		b, err := createBuckets(tx)
		if err != nil {
			return err
		}
		for _, sb := range all {
			if err := putRecord(tx, b, sb); err != nil {
				return err
			}
		}
		return putPosition(tx, pos)
	})
	return pos, err
}

func createBuckets(tx *bolt.Tx) (*bolt.Bucket, error) {
	for _, name := range [][]byte{bucketMeta, bucketHandles, bucketShort, bucketOwners, bucketSnaps, bucketSnapShort, bucketProcs, bucketStates, bucketListing, bucketRecords} {
		b, err := tx.CreateBucketIfNotExists(name)
		if err != nil {
			return nil, err
		}
		// Records, owned paths (disks/<ID>...) and snapshots are keyed by
		// ULIDs that grow with time, so they are mostly appended: a page
		// split then keeps the old page nearly full, not half (bbolt's
		// default, made for random inserts, such as handles and short
		// IDs). FillPercent holds for this transaction.
		if !bytes.Equal(name, bucketHandles) && !bytes.Equal(name, bucketShort) && !bytes.Equal(name, bucketSnapShort) {
			b.FillPercent = appendFill
		}
	}
	return tx.Bucket(bucketRecords), nil
}

// appendFill is how full a split leaves the pages of the buckets whose
// keys mostly grow.
const appendFill = 0.9

func putRecord(tx *bolt.Tx, b *bolt.Bucket, sb *projections.Sandbox) error {
	data, err := projections.EncodeSandbox(sb)
	if err != nil {
		return err
	}
	if err := b.Put([]byte(sb.ID), data); err != nil {
		return err
	}
	item, err := projections.ListItem(*sb)
	if err != nil {
		return err
	}
	if err := tx.Bucket(bucketListing).Put([]byte(sb.ID), item); err != nil {
		return err
	}
	if err := addState(tx, StateOf(sb), 1); err != nil {
		return err
	}
	return indexRecord(tx, sb, func(b *bolt.Bucket, k []byte) error { return b.Put(k, nil) })
}

func putPosition(tx *bolt.Tx, pos storePosition) error {
	m := tx.Bucket(bucketMeta)
	for k, v := range map[string][]byte{
		string(metaFormat): u64(storeFormat), string(metaSeq): u64(pos.Seq),
		string(metaCount): u64(pos.Count), string(metaEvent): pos.EventID[:],
	} {
		if err := m.Put([]byte(k), v); err != nil {
			return err
		}
	}
	return nil
}

// indexRecord applies op (put or delete) to every index entry of sb.
func indexRecord(tx *bolt.Tx, sb *projections.Sandbox, op func(*bolt.Bucket, []byte) error) error {
	entry := func(index []byte, key string) error {
		k := make([]byte, 0, len(key)+1+len(sb.ID))
		k = append(append(append(k, key...), 0), sb.ID...)
		return op(tx.Bucket(index), k)
	}
	if sb.Handle != "" {
		if err := entry(bucketHandles, sb.Handle); err != nil {
			return err
		}
	}
	if err := entry(bucketShort, projections.ShortID(sb.ID)); err != nil {
		return err
	}
	for _, r := range sb.Resources {
		if err := entry(bucketOwners, r.Path); err != nil {
			return err
		}
	}
	for _, snap := range sb.Snapshots {
		if err := entry(bucketSnaps, snap); err != nil {
			return err
		}
		if err := entry(bucketSnapShort, projections.ShortID(snap)+"\x00"+snap); err != nil {
			return err
		}
	}
	if sb.HasProcess() {
		return entry(bucketProcs, "")
	}
	return nil
}

// StateKey is what the sandboxes are counted by: state, and Ready.
type StateKey struct {
	State projections.State
	Ready bool
}

// StateOf is sb's StateKey.
func StateOf(sb *projections.Sandbox) StateKey {
	return StateKey{State: sb.State, Ready: sb.IsReady()}
}

func (k StateKey) bytes() []byte {
	r := byte('0')
	if k.Ready {
		r = '1'
	}
	return append(append([]byte(k.State), 0), r)
}

func parseStateKey(b []byte) (StateKey, bool) {
	i := bytes.IndexByte(b, 0)
	if i < 0 || len(b) != i+2 {
		return StateKey{}, false
	}
	return StateKey{State: projections.State(b[:i]), Ready: b[i+1] == '1'}, true
}

// addState moves the count of records in state k by d.
func addState(tx *bolt.Tx, k StateKey, d int64) error {
	b := tx.Bucket(bucketStates)
	key := k.bytes()
	var c uint64
	if v := b.Get(key); len(v) == 8 {
		c = binary.BigEndian.Uint64(v)
	}
	c = uint64(int64(c) + d)
	if c == 0 {
		return b.Delete(key)
	}
	return b.Put(key, u64(c))
}

// stateCounts is the number of records in each state.
func (s *sandboxStore) stateCounts() (map[StateKey]uint64, error) {
	out := map[StateKey]uint64{}
	err := s.db.View(func(tx *bolt.Tx) error {
		b := tx.Bucket(bucketStates)
		if b == nil {
			return nil
		}
		return b.ForEach(func(k, v []byte) error {
			key, ok := parseStateKey(k)
			if !ok || len(v) != 8 {
				return fmt.Errorf("%w: sandbox store state count is damaged", projections.ErrBadSnapshot)
			}
			out[key] = binary.BigEndian.Uint64(v)
			return nil
		})
	})
	return out, err
}
