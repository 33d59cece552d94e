// Package local is the store opened in the command's own process, the
// Backend control reaches a root by when no daemon serves it: the daemon's
// binary links it (control.InProcess), the CLI does not.
package local

import (
	"context"
	"errors"
	"time"

	"github.com/nexus-sandbox/nexus/control"
	"github.com/nexus-sandbox/nexus/core"
	"github.com/nexus-sandbox/nexus/events"
	"github.com/nexus-sandbox/nexus/host/journal"
	"github.com/nexus-sandbox/nexus/layout"
	"github.com/nexus-sandbox/nexus/projections"
	"github.com/nexus-sandbox/nexus/store"
)

var _ control.Backend = Backend{}

// InProcess opens a root's store lazily in this process.
type InProcess struct{}

func (InProcess) Open(ctx context.Context, root string) (control.Backend, error) {
	n, err := store.Open(ctx, root, store.Options{Lazy: true})
	if err != nil {
		return nil, err
	}
	return Backend{n}, nil
}

func (InProcess) Held(err error) bool { return errors.Is(err, journal.ErrLocked) }

// Connect reaches the state root at root: the daemon if one answers on its
// socket, else the store opened in this process (control.ConnectWith
// without a daemon started on demand).
func Connect(ctx context.Context, root string, wait time.Duration) (control.Backend, error) {
	return control.ConnectWith(ctx, root, control.ConnectOptions{Wait: wait, InProcess: InProcess{}})
}

// Backend serves a control.Backend from a store this process owns. A command's store
// is opened lazily (store.Options.Lazy): reading one sandbox by ID folds
// that sandbox's events alone, and anything else loads the projections
// first (Load), returning the error if they cannot be.
type Backend struct{ *store.Store }

func (l Backend) Sandboxes(ctx context.Context) ([]projections.Sandbox, error) {
	return l.Store.Sandboxes(ctx)
}

func (l Backend) SandboxPage(ctx context.Context, after string, limit int) ([]projections.Sandbox, error) {
	return l.Store.SandboxPage(ctx, after, limit)
}

func (l Backend) Sandbox(ctx context.Context, ref string) (projections.Sandbox, bool, error) {
	return l.Store.Sandbox(ctx, ref)
}

func (l Backend) OwnerOf(ctx context.Context, paths []string, except string) (sandbox, path string, found bool, err error) {
	return l.Store.OwnerOf(ctx, paths, except)
}

func (l Backend) SnapshotOwner(ctx context.Context, snap string) (sb projections.Sandbox, found bool, err error) {
	return l.Store.SnapshotOwner(ctx, snap)
}

func (l Backend) OpenSagas(ctx context.Context) ([]projections.OpenSaga, error) {
	if err := l.Load(ctx); err != nil {
		return nil, err
	}
	var out []projections.OpenSaga
	l.View(func(v store.Views) {
		for _, sg := range v.Sagas.Open() {
			out = append(out, *sg)
		}
	})
	return out, nil
}

func (l Backend) Volumes(ctx context.Context) ([]projections.Volume, error) {
	if err := l.Load(ctx); err != nil {
		return nil, err
	}
	var out []projections.Volume
	l.View(func(v store.Views) {
		for _, vol := range v.Volumes.List() {
			out = append(out, *vol)
		}
	})
	return out, nil
}

func (l Backend) ImageCache(ctx context.Context) (projections.ImageCacheState, error) {
	return l.Store.ImageCache(ctx)
}

// Bootstrap reads the sandbox's own record: on a lazy store, its events
// alone.
func (l Backend) Bootstrap(ctx context.Context, id string) (events.Bootstrap, error) {
	sb, found, err := l.Store.Sandbox(ctx, id)
	if err != nil || !found {
		return events.Bootstrap{}, err
	}
	return sb.Bootstrap, nil
}

func (l Backend) Rev(ctx context.Context, entity core.Entity) (uint64, error) {
	return l.Store.EntityRev(ctx, entity)
}

// CorruptError is a journal block found damaged: the operator's way out
// is RepairJournal.
type CorruptError = journal.CorruptError

// RepairReport says what RepairJournal cut, or that the journal was whole.
type RepairReport = journal.RepairReport

// RepairJournal copies the state root's journal store to backup, then
// cuts a torn tail off its last block. A daemon started on demand holds
// the store, so with o.Auto set it is asked to step down first (as a
// command that needs the journal in process asks it); a hand-started one
// does not, and the refusal says so.
func RepairJournal(ctx context.Context, root, backup string, o control.ConnectOptions) (RepairReport, error) {
	dir := layout.Root(root).Journal()
	rep, err := journal.Repair(dir, backup)
	if errors.Is(err, journal.ErrLocked) && retireAuto(ctx, root, o) == nil {
		rep, err = journal.Repair(dir, backup)
	}
	return rep, err
}

// retireAuto asks a daemon started on demand to step down by taking the
// journal in this process, then lets go of it.
func retireAuto(ctx context.Context, root string, o control.ConnectOptions) error {
	if o.Auto == nil {
		return errors.New("no daemon to retire")
	}
	o.Exclusive, o.InProcess = true, InProcess{}
	b, err := control.ConnectWith(ctx, root, o)
	if err != nil {
		return err
	}
	return b.Close()
}
