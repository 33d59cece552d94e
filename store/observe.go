package store

import (
	"context"
	"errors"
	"os"
	"time"

	"github.com/nexus-sandbox/nexus/events"
	"github.com/nexus-sandbox/nexus/host/journal"
)

// Observer hears what a store does, for metrics: each event it stores,
// with the kind of the saga the event belongs to ("" for none), how long
// each append waited for its answer, and each group commit's size. Its
// methods run on the append path, some under the store's lock: they must
// be quick and must not call the store.
type Observer interface {
	Stored(e events.Event, kind events.SagaKind)
	Appended(took time.Duration, err error)
	Grouped(requests, events int)
}

// SandboxStates counts the sandboxes by state and Ready, from the sandbox
// store's counts and the events folded since its last checkpoint: no
// record is read, however many sandboxes the root holds.
func (n *Store) SandboxStates(ctx context.Context) (map[StateKey]int, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if err := n.loadLocked(ctx); err != nil {
		return nil, err
	}
	return n.sandboxes.states()
}

// Usage is the room the store takes and the room left for it.
type Usage struct {
	journal.Usage
	// StoreBytes is the sandbox store's file (0: none yet).
	StoreBytes int64
}

// Usage measures the journal, its filesystem's free space against the
// append reserve, and the sandbox store's file.
func (n *Store) Usage(ctx context.Context) (Usage, error) {
	if err := n.Opened(ctx); err != nil {
		return Usage{}, err
	}
	ju, err := n.j.Usage(ctx)
	if err != nil {
		return Usage{}, err
	}
	u := Usage{Usage: ju}
	fi, err := os.Stat(n.storePath())
	switch {
	case err == nil:
		u.StoreBytes = fi.Size()
	case !errors.Is(err, os.ErrNotExist):
		return Usage{}, err
	}
	return u, nil
}
