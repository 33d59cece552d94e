// Package control is how a nexus command reaches the state root's journal:
// in process when no daemon runs, over the daemon's unix socket when one
// does. Both paths implement Backend, so commands never know which it is.
package control

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/nexus-sandbox/nexus/control/wire"
	"github.com/nexus-sandbox/nexus/core"
	"github.com/nexus-sandbox/nexus/events"
	"github.com/nexus-sandbox/nexus/host/journal"
	"github.com/nexus-sandbox/nexus/lifecycle"
	"github.com/nexus-sandbox/nexus/projections"
	"github.com/nexus-sandbox/nexus/store"
)

// Backend is what commands need from a state root: what the flows
// consume (lifecycle.Backend, declared once there) and what commands alone
// use.
type Backend interface {
	lifecycle.Backend
	// SandboxPage is at most limit sandboxes whose IDs sort after after
	// ("" from the first), in ID order: `ls` reads a page at a time, so
	// neither the daemon's answer nor the command holds every sandbox.
	SandboxPage(ctx context.Context, after string, limit int) ([]projections.Sandbox, error)
	Close() error
}

// Both of Connect's answers are Backends.
var (
	_ Backend = (*Client)(nil)
	_ Backend = Local{}
)

// Local serves a Backend from a store this process owns. A command's store
// is opened lazily (store.Options.Lazy): reading one sandbox by ID folds
// that sandbox's events alone, and anything else loads the projections
// first (Load), returning the error if they cannot be.
type Local struct{ *store.Store }

func (l Local) Sandboxes(ctx context.Context) ([]projections.Sandbox, error) {
	return l.Store.Sandboxes(ctx)
}

func (l Local) SandboxPage(ctx context.Context, after string, limit int) ([]projections.Sandbox, error) {
	return l.Store.SandboxPage(ctx, after, limit)
}

func (l Local) Sandbox(ctx context.Context, ref string) (projections.Sandbox, bool, error) {
	return l.Store.Sandbox(ctx, ref)
}

func (l Local) OwnerOf(ctx context.Context, paths []string, except string) (sandbox, path string, found bool, err error) {
	return l.Store.OwnerOf(ctx, paths, except)
}

func (l Local) SnapshotOwner(ctx context.Context, snap string) (sb projections.Sandbox, found bool, err error) {
	return l.Store.SnapshotOwner(ctx, snap)
}

func (l Local) OpenSagas(ctx context.Context) ([]projections.OpenSaga, error) {
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

func (l Local) Volumes(ctx context.Context) ([]projections.Volume, error) {
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

func (l Local) ImageCache(ctx context.Context) (projections.ImageCacheState, error) {
	return l.Store.ImageCache(ctx)
}

// Bootstrap reads the sandbox's own record: on a lazy store, its events
// alone.
func (l Local) Bootstrap(ctx context.Context, id string) (events.Bootstrap, error) {
	sb, found, err := l.Store.Sandbox(ctx, id)
	if err != nil || !found {
		return events.Bootstrap{}, err
	}
	return sb.Bootstrap, nil
}

func (l Local) Rev(ctx context.Context, entity core.Entity) (uint64, error) {
	return l.Store.EntityRev(ctx, entity)
}

// ErrBusy means the state root stayed owned by another process that serves
// no control socket (another command running without a daemon) until the
// wait ran out.
var ErrBusy = errors.New("state root is busy")

// Connect reaches the state root at root: the daemon if one answers on its
// socket, else the journal opened in this process. While another process
// holds the journal without serving a socket (a daemon starting up, or a
// short command), it retries until wait has passed. It never opens the
// store while someone else has it.
func Connect(ctx context.Context, root string, wait time.Duration) (Backend, error) {
	return ConnectWith(ctx, root, ConnectOptions{Wait: wait})
}

// connectLocal is Connect on a prepared root.
func connectLocal(ctx context.Context, root string, wait time.Duration) (Backend, error) {
	sock := filepath.Join(root, wire.SocketName)
	deadline := time.Now().Add(wait)
	backoff := 5 * time.Millisecond
	for {
		c, st, err := dialStatus(ctx, sock)
		if final(err) {
			return nil, err
		}
		if err == nil {
			if sameBuild(st) {
				return c, nil
			}
			// Another build's daemon is never used: one started on demand
			// retires, and the journal is ours once it has finished with
			// its clients; one started by hand is the operator's to restart.
			if !st.Auto {
				c.Close()
				return nil, otherBuild(root, st)
			}
			c.Retire(ctx)
			c.Close()
		}
		n, err := store.Open(ctx, root, store.Options{Lazy: true})
		if err == nil {
			return Local{n}, nil
		}
		if !errors.Is(err, journal.ErrLocked) {
			return nil, err
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("%w: %v; it serves no %s (start `nexus daemon` to share the state root)", ErrBusy, err, wire.SocketName)
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(backoff):
		}
		backoff = min(backoff*2, 200*time.Millisecond)
	}
}

// errRetiring is a daemon that answers only to finish with the commands
// it was serving.
var errRetiring = errors.New("the daemon is retiring")

// Dial returns a client if a daemon that is not retiring answers on sock.
func Dial(ctx context.Context, sock string) (*Client, error) {
	c, _, err := dialStatus(ctx, sock)
	return c, err
}

// dialStatus is dial with the daemon's Status.
func dialStatus(ctx context.Context, sock string) (*Client, wire.Status, error) {
	if _, err := os.Lstat(sock); err != nil {
		return nil, wire.Status{}, err
	}
	c := NewClient(sock)
	pctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	st, err := c.Status(pctx)
	if err == nil && st.Retiring {
		err = errRetiring
	}
	if err != nil {
		c.Close()
		return nil, st, err
	}
	return c, st, nil
}
