// Package control is how a nexus command reaches the state root's journal:
// in process when no daemon runs, over the daemon's unix socket when one
// does. Both paths implement Backend, so commands never know which it is.
package control

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/url"
	"os"
	"path/filepath"
	"time"

	"github.com/nexus-sandbox/nexus/control/wire"
	"github.com/nexus-sandbox/nexus/lifecycle"
	"github.com/nexus-sandbox/nexus/projections"
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
	// ListJSON writes to w the sandboxes whose IDs sort after after (at
	// most limit; 0: all) as `ls --json` prints them: an indented JSON
	// array of projections.ListItem, as the store keeps each stopped
	// sandbox's, written as it is read (a page at a time), not decoded
	// and encoded again. A sandbox that records a process is listed with
	// its exits observed (lifecycle.ObserveExits).
	ListJSON(ctx context.Context, w io.Writer, after string, limit int) error
	Close() error
}

// A daemon's client is a Backend, as is control/local's store.
var _ Backend = (*Client)(nil)

// InProcess opens a root's store in this process: control/local, which
// the daemon's binary links. A build without it (the CLI) reaches a root
// through a daemon only, and ErrInProcess says a command needs the store in
// its own process.
type InProcess interface {
	// Open opens the store of a prepared root.
	Open(ctx context.Context, root string) (Backend, error)
	// Held says an error of Open's is the store being owned by another
	// process, which a wait may outlast.
	Held(err error) bool
}

// ErrInProcess means the command needs the store in its own process and
// this build cannot open it: the daemon's binary runs the command instead.
var ErrInProcess = errors.New("this command opens the store in its own process, which this build does not link")

// ErrBusy means the state root stayed owned by another process that serves
// no control socket (another command running without a daemon) until the
// wait ran out.
var ErrBusy = errors.New("state root is busy")

// connectLocal reaches a prepared root without starting a daemon: the
// daemon if one answers on its socket, else the store opened in this
// process (ip). While another process holds the store without serving a
// socket (a daemon starting up, or a short command), it retries until wait
// has passed. It never opens the store while someone else has it.
func connectLocal(ctx context.Context, root string, wait time.Duration, ip InProcess) (Backend, error) {
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
		if ip == nil {
			return nil, ErrInProcess
		}
		b, err := ip.Open(ctx, root)
		if err == nil {
			return b, nil
		}
		if !ip.Held(err) {
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

// statusWait bounds one Status question. A daemon on a loaded machine can
// take seconds to answer and is still answering; a stopped one is named at
// once from its peer's process state, not by this wait running out.
const statusWait = 15 * time.Second

// dialStatus is dial with the daemon's Status.
func dialStatus(ctx context.Context, sock string) (*Client, wire.Status, error) {
	if _, err := os.Lstat(sock); err != nil {
		return nil, wire.Status{}, err
	}
	c := NewClient(sock)
	pctx, cancel := context.WithTimeout(ctx, statusWait)
	defer cancel()
	st, err := c.firstStatus(pctx)
	if err == nil && st.Retiring {
		err = errRetiring
	}
	if err != nil {
		c.Close()
		return nil, st, err
	}
	return c, st, nil
}

// firstStatus opens the client's first connection and returns the Status
// its proof carried, handing the connection to the transport for the
// command's requests; a daemon whose proof carries none is asked
// PathStatus on it. Errors read as Status's.
func (c *Client) firstStatus(ctx context.Context) (wire.Status, error) {
	conn, st, err := c.connect(ctx)
	switch {
	case err != nil && ctx.Err() != nil:
		return wire.Status{}, notAwaited{cause: context.Cause(ctx), ctxErr: ctx.Err()}
	case final(err):
		return wire.Status{}, err
	case err != nil:
		return wire.Status{}, fmt.Errorf("daemon: %w", &url.Error{Op: "Get", URL: base + wire.PathStatus, Err: err})
	}
	c.fmu.Lock()
	c.first = conn
	c.fmu.Unlock()
	if st == nil {
		return c.Status(ctx)
	}
	return *st, nil
}
