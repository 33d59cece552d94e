package store

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"os"

	"github.com/oklog/ulid/v2"
	bolt "go.etcd.io/bbolt"

	"github.com/nexus-sandbox/nexus/events"
)

// The current mark: what lets a daemon answer reads of the sandbox store
// before the journal's server has started (Options.Early), which at 100k
// sandboxes takes seconds of rebuilding the server's per-subject index.
//
// The rule: the store may be read without the journal only when it is
// known to be exactly the journal's fold. A clean Close knows it: with the
// journal's lock held and its server stopped, the store's position is the
// journal's last event. It then records, in the store's meta bucket (one
// bbolt transaction, fsynced), that position and the journal's
// fingerprint (journal.Fingerprint: its files fsynced, then their names,
// sizes, inodes and times). Every Open takes the lock and then the mark,
// deleting it durably before the journal's server can start, whether or
// not it uses it; so from any open until the next clean close there is no
// mark, and a process killed at any point leaves none that could lie.
// An Open uses the mark only if the journal's files still have that
// fingerprint and the store is at that position: anything that opened the
// journal without this store (a server started on it, `nexus journal
// repair`, a copy or restore of journal/) changed its files. Once the
// journal is open, its last sequence is checked against the mark.

var metaCurrent = []byte("current") // seq u64, event ID, journal fingerprint

type currentMark struct {
	Seq     uint64
	EventID ulid.ULID
	Journal []byte
}

func (m currentMark) bytes() []byte {
	b := binary.BigEndian.AppendUint64(nil, m.Seq)
	b = append(b, m.EventID[:]...)
	return append(b, m.Journal...)
}

// takeMark deletes the store's current mark, if it has one, and says
// whether it held for the journal as its files stand and for the store's
// position, which it returns. It opens the store only if its
// file exists. The journal's lock must be held and its server not started.
func (n *Store) takeMark() (pos storePosition, current bool, err error) {
	var m currentMark
	if fi, err := os.Lstat(n.storePath()); err != nil || !fi.Mode().IsRegular() {
		return pos, false, nil
	}
	if err := n.openStoreLocked(); err != nil {
		if errors.Is(err, bolt.ErrTimeout) {
			return pos, false, err
		}
		// A store that cannot be opened holds no mark anyone can read;
		// the load deals with it as before.
		return pos, false, nil
	}
	var raw []byte
	err = n.store.db.View(func(tx *bolt.Tx) error {
		if b := tx.Bucket(bucketMeta); b != nil {
			raw = bytes.Clone(b.Get(metaCurrent))
		}
		return nil
	})
	if err != nil || raw == nil {
		return pos, false, err
	}
	err = n.store.db.Update(func(tx *bolt.Tx) error { return tx.Bucket(bucketMeta).Delete(metaCurrent) })
	if err != nil {
		// A mark that cannot be taken (projections/ full) goes with the
		// store, which the journal rebuilds.
		if err := n.dropStore(); err != nil {
			return pos, false, fmt.Errorf("sandbox store: take the current mark: %w", err)
		}
		return pos, false, nil
	}
	if len(raw) <= 8+len(ulid.ULID{}) {
		return pos, false, nil
	}
	m.Seq = binary.BigEndian.Uint64(raw)
	copy(m.EventID[:], raw[8:])
	m.Journal = raw[8+len(ulid.ULID{}):]
	fp, err := n.lock.Fingerprint()
	if err != nil || !bytes.Equal(fp, m.Journal) {
		return pos, false, nil
	}
	pos, ok, err := n.store.position()
	if err != nil || !ok || pos.Seq != m.Seq || pos.EventID != m.EventID {
		return pos, false, nil
	}
	return pos, true, nil
}

// markIfCurrent runs with the journal's server stopped and its lock held
// (journal.CloseThen): if the store's position is the journal's last
// event (last, and the ID of the event there: lastID), it records the
// mark with the journal's fingerprint.
func (n *Store) markIfCurrent(last uint64, lastID ulid.ULID) error {
	if n.store == nil {
		return nil
	}
	pos, ok, err := n.store.position()
	if err != nil || !ok || pos.Seq != last || pos.EventID != lastID {
		return err
	}
	fp, err := n.j.Fingerprint()
	if err != nil {
		return err
	}
	m := currentMark{Seq: last, EventID: lastID, Journal: fp}
	return n.store.db.Update(func(tx *bolt.Tx) error { return tx.Bucket(bucketMeta).Put(metaCurrent, m.bytes()) })
}

// lastEvent is the journal's last sequence and the ID of the event there
// (zero for an empty journal).
func (n *Store) lastEvent(ctx context.Context) (uint64, ulid.ULID, error) {
	last, err := n.j.LastSeq(ctx)
	if err != nil || last == 0 {
		return last, ulid.ULID{}, err
	}
	rec, err := n.j.Get(ctx, last)
	if err != nil {
		return 0, ulid.ULID{}, err
	}
	e, err := events.Decode(rec.Data)
	return last, e.ID, err
}
