package control

import (
	"context"
	"errors"

	"github.com/nexus-sandbox/nexus/host/journal"
	"github.com/nexus-sandbox/nexus/layout"
	"github.com/nexus-sandbox/nexus/store"
)

// ErrStateRoot means the state root cannot be used as given.
var ErrStateRoot = store.ErrStateRoot

// CorruptError is a journal block found damaged: the operator's way out
// is RepairJournal.
type CorruptError = journal.CorruptError

// RepairReport says what RepairJournal cut, or that the journal was whole.
type RepairReport = journal.RepairReport

// PrepareRoot makes the state root if it is missing and returns its
// absolute path, refusing one that others can write, that belongs to
// another user or that cannot be written (ErrStateRoot).
func PrepareRoot(root string) (string, error) { return store.PrepareRoot(root) }

// RepairJournal copies the state root's journal store to backup, then
// cuts a torn tail off its last block. A daemon started on demand holds
// the store, so with o.Auto set it is asked to step down first (as a
// command that needs the journal in process asks it); a hand-started one
// does not, and the refusal says so.
func RepairJournal(ctx context.Context, root, backup string, o ConnectOptions) (RepairReport, error) {
	dir := layout.Root(root).Journal()
	rep, err := journal.Repair(dir, backup)
	if errors.Is(err, journal.ErrLocked) && retireAuto(ctx, root, o) == nil {
		rep, err = journal.Repair(dir, backup)
	}
	return rep, err
}

// retireAuto asks a daemon started on demand to step down by taking the
// journal in this process, then lets go of it.
func retireAuto(ctx context.Context, root string, o ConnectOptions) error {
	if o.Auto == nil {
		return errors.New("no daemon to retire")
	}
	o.Exclusive = true
	b, err := ConnectWith(ctx, root, o)
	if err != nil {
		return err
	}
	return b.Close()
}
