package store

import (
	"bytes"
	"context"
	"encoding/binary"
	"os"
	"path/filepath"

	bolt "go.etcd.io/bbolt"

	"github.com/nexus-sandbox/nexus/host/journal"
)

// ReadTxs counts the read transactions begun on the sandbox store's file.
func (n *Store) ReadTxs() int {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.store == nil {
		return 0
	}
	return n.store.db.Stats().TxN
}

// EarlyGated is Options{Early: true} whose early Open starts the journal
// only once gate is closed.
func EarlyGated(gate <-chan struct{}) Options {
	return Options{Early: true, BeforeJournal: func() { <-gate }}
}

// MarkHeld says whether the open store's file holds a current mark.
func (n *Store) MarkHeld() bool {
	var held bool
	n.store.db.View(func(tx *bolt.Tx) error {
		held = tx.Bucket(bucketMeta).Get(metaCurrent) != nil
		return nil
	})
	return held
}

// MarkTruth reads, on the root no process holds, the store's current mark
// (marked), whether the journal's files still have its fingerprint
// (matches), the mark's sequence, the store's position and the journal's
// last sequence once opened. It opens the journal, so it consumes nothing
// but changes the files: call it once per state to check.
func MarkTruth(root string) (marked, matches bool, markSeq, storeSeq, journalLast uint64, err error) {
	lock, err := journal.Lock(filepath.Join(root, "journal"))
	if err != nil {
		return
	}
	n := &Store{root: root, lock: lock}
	if fi, serr := os.Lstat(n.storePath()); serr == nil && fi.Mode().IsRegular() {
		if err = n.openStoreLocked(); err != nil {
			lock.Release()
			return
		}
		var raw []byte
		n.store.db.View(func(tx *bolt.Tx) error {
			if b := tx.Bucket(bucketMeta); b != nil {
				raw = bytes.Clone(b.Get(metaCurrent))
			}
			return nil
		})
		if raw != nil {
			marked = true
			markSeq = binary.BigEndian.Uint64(raw)
			fp, ferr := lock.Fingerprint()
			matches = ferr == nil && bytes.Equal(fp, raw[8+16:])
		}
		pos, _, perr := n.store.position()
		if perr != nil {
			err = perr
		}
		storeSeq = pos.Seq
		n.closeStore()
	}
	j, err := lock.Open(context.Background(), journal.Options{})
	if err != nil {
		lock.Release()
		return
	}
	journalLast, err = j.LastSeq(context.Background())
	j.Close()
	return
}

// ForgeMark writes root's current mark for the journal's files as they
// are now and the store's position, whatever the journal holds: a mark
// that lies, for the test of what an early open does with one.
func ForgeMark(root string) error {
	lock, err := journal.Lock(filepath.Join(root, "journal"))
	if err != nil {
		return err
	}
	defer lock.Release()
	n := &Store{root: root, lock: lock}
	if err := n.openStoreLocked(); err != nil {
		return err
	}
	defer n.closeStore()
	pos, _, err := n.store.position()
	if err != nil {
		return err
	}
	fp, err := lock.Fingerprint()
	if err != nil {
		return err
	}
	m := currentMark{Seq: pos.Seq, EventID: pos.EventID, Journal: fp}
	return n.store.db.Update(func(tx *bolt.Tx) error { return tx.Bucket(bucketMeta).Put(metaCurrent, m.bytes()) })
}
