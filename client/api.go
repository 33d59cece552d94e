package client

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/nexus-sandbox/nexus/control"
	"github.com/nexus-sandbox/nexus/events"
	"github.com/nexus-sandbox/nexus/host/driver"
	"github.com/nexus-sandbox/nexus/layout"
	"github.com/nexus-sandbox/nexus/lifecycle"
	"github.com/nexus-sandbox/nexus/projections"
)

// The errors callers branch on, with errors.Is. Every error a call returns
// is an *OpError naming the call and the sandbox.
var (
	// ErrNotFound: no sandbox (or snapshot) by that reference.
	ErrNotFound = lifecycle.ErrNotFound
	// ErrHandleTaken: another live sandbox holds the handle asked for.
	ErrHandleTaken = lifecycle.ErrHandleTaken
	// ErrRefused: the call was refused before it changed anything (a
	// taken handle is one such refusal).
	ErrRefused = lifecycle.ErrRefused
	// ErrAlready: a Start of a running sandbox or a Stop of a stopped
	// one. Start and Stop report it only through OpError.Already: the
	// state asked for holds, and they return nil.
	ErrAlready = lifecycle.ErrAlready
	// ErrDaemonRoot: the daemon answering on the state root's socket
	// serves another root, or the socket is not its daemon's (a link).
	// Nothing was sent to it.
	ErrDaemonRoot = control.ErrForeignSocket
	// ErrDaemonStopped: the root's daemon is stopped (SIGSTOP) and answers
	// nothing.
	ErrDaemonStopped = control.ErrDaemonStopped
	// ErrBusy: the root stayed held by a process serving no socket.
	ErrBusy = control.ErrBusy
	// ErrClosed: the client was closed.
	ErrClosed = errors.New("client: closed")
)

// OpError is a failed call: what it was, on which sandbox, and why.
type OpError struct {
	Op  string // "create", "stop", ...
	Ref string // the sandbox reference given, if any
	Err error
}

func (e *OpError) Error() string {
	if e.Ref == "" {
		return "nexus " + e.Op + ": " + e.Err.Error()
	}
	return fmt.Sprintf("nexus %s %s: %s", e.Op, e.Ref, e.Err)
}

func (e *OpError) Unwrap() error { return e.Err }

// wrap is err as an OpError (nil stays nil).
func wrap(op, ref string, err error) error {
	if err == nil {
		return nil
	}
	if oe := (*OpError)(nil); errors.As(err, &oe) {
		return err
	}
	return &OpError{Op: op, Ref: ref, Err: err}
}

// Sandbox is one sandbox as the journal has it: the document `nexus
// inspect --json` prints (docs/json.md's Sandbox), one type for both.
type Sandbox = projections.SandboxJSON

func sandboxOf(sb projections.Sandbox) Sandbox { return projections.SandboxDocument(sb) }

// backend is the connection to the state root's daemon, made at the first
// call: a daemon already answering, or one started on demand from nexusd
// as the CLI starts it. It is shared by every call; a daemon that idles
// out between calls is started again by the next one.
func (c *Client) backend(ctx context.Context) (control.Backend, error) {
	c.cmu.Lock()
	defer c.cmu.Unlock()
	if c.conn != nil {
		return c.conn, nil
	}
	nexusd := c.opts.Nexusd
	b, err := control.ConnectWith(ctx, c.opts.StateDir, control.ConnectOptions{
		Wait: connectWait,
		Auto: &control.AutoStart{Exe: nexusd, Args: func(root string) []string {
			return []string{"--state-dir", root, "daemon", "--auto"}
		}},
	})
	if err != nil {
		return nil, err
	}
	if c.root == "" {
		// The root as ConnectWith prepared and checked it; set once, so
		// a call that connected reads it without the lock.
		if c.root, err = control.PrepareRoot(c.opts.StateDir); err != nil {
			b.Close()
			return nil, err
		}
	}
	c.conn = b
	return b, nil
}

// connectWait is how long a call waits for a state root held by a process
// that serves no socket, as the CLI waits.
const connectWait = 10 * time.Second

func (c *Client) disconnect() error {
	c.cmu.Lock()
	defer c.cmu.Unlock()
	if c.conn == nil {
		return nil
	}
	err := c.conn.Close()
	c.conn = nil
	return err
}

// open is the daemon connection for a call of a client not closed.
func (c *Client) open(ctx context.Context) (control.Backend, error) {
	c.mu.Lock()
	closed := c.closed
	c.mu.Unlock()
	if closed {
		return nil, ErrClosed
	}
	return c.backend(ctx)
}

// manage runs fn with a lifecycle manager over the daemon connection: one
// per call, so calls on several goroutines set nothing of each other's.
func (c *Client) manage(ctx context.Context, fn func(*lifecycle.Manager) error) error {
	b, err := c.open(ctx)
	if err != nil {
		return err
	}
	return c.manageOver(b, fn)
}

// manageOver is manage over b, whether or not the client is closing.
func (c *Client) manageOver(b control.Backend, fn func(*lifecycle.Manager) error) error {
	mgr, err := c.cfg.Manager(lifecycle.Manager{
		Root: layout.Root(c.root), B: b, Driver: driver.Driver{Name: c.opts.Driver, Exe: c.opts.Nexusd},
	})
	if err != nil {
		return err
	}
	return fn(mgr)
}

// awaitReady waits for a sandbox a call booted to be Ready, as w says, and
// returns it as it then stands with the wait's error. One that is not
// running (a fork of a stopped parent) is not waited for.
func awaitReady(ctx context.Context, m *lifecycle.Manager, sb projections.Sandbox, w ReadyWait) (projections.Sandbox, error) {
	if w.NoWait || sb.State != projections.StateRunning {
		return sb, nil
	}
	timeout := w.Timeout
	if timeout <= 0 {
		timeout = lifecycle.DefaultReadyTimeout
	}
	ready, err := m.WaitReady(ctx, sb.ID, timeout, true)
	if err == nil {
		return ready, nil
	}
	if now, ferr := m.Find(context.WithoutCancel(ctx), sb.ID); ferr == nil {
		sb = now
	}
	return sb, err
}

// ListOptions select the sandboxes List returns.
type ListOptions struct {
	// Filters are `nexus ls --filter` values, each KEY=VALUE: label=K or
	// label=K=V, state=running, handle=web/*, driver=process, ready=true.
	// A sandbox is listed when it matches every one.
	Filters []string
	// Limit returns at most this many (0: all).
	Limit int
	// After starts after this sandbox ID (the last of a previous page).
	After string
}

// listPage is how many sandboxes one request to the daemon reads.
const listPage = 500

// List is the sandboxes of the state root, every one (not only this
// run's), in ID order (oldest first), read from the daemon a page at a
// time.
func (c *Client) List(ctx context.Context, o ListOptions) ([]Sandbox, error) {
	filters, err := projections.ParseFilters(o.Filters, projections.SandboxFilters)
	if err != nil {
		return nil, wrap("list", "", err)
	}
	b, err := c.open(ctx)
	if err != nil {
		return nil, wrap("list", "", err)
	}
	out := []Sandbox{}
	after := strings.ToUpper(o.After)
	for {
		want := listPage
		if o.Limit > 0 && len(filters) == 0 {
			want = min(want, o.Limit-len(out))
		}
		if o.Limit > 0 && len(out) == o.Limit {
			return out, nil
		}
		page, err := b.SandboxPage(ctx, after, want)
		if err != nil {
			return nil, wrap("list", "", err)
		}
		// Filtered after the exits are observed: state and ready are
		// what the caller is told.
		for _, sb := range lifecycle.ObserveExits(page) {
			if filters.Match(projections.SandboxFacts(sb)) && (o.Limit == 0 || len(out) < o.Limit) {
				out = append(out, sandboxOf(sb))
			}
		}
		if len(page) < want {
			return out, nil
		}
		after = page[len(page)-1].ID
	}
}

// Get is one sandbox by ID, handle, short ID or unique ID prefix.
func (c *Client) Get(ctx context.Context, ref string) (Sandbox, error) {
	var sb projections.Sandbox
	err := c.manage(ctx, func(m *lifecycle.Manager) error {
		var err error
		sb, err = m.Lookup(ctx, ref)
		return err
	})
	if err != nil {
		return Sandbox{}, wrap("get", ref, err)
	}
	return sandboxOf(lifecycle.ObserveExits([]projections.Sandbox{sb})[0]), nil
}

// Start boots a stopped sandbox and, unless w.NoWait, waits for it to be
// Ready. A running one is left alone and returned.
func (c *Client) Start(ctx context.Context, ref string, w ReadyWait) (Sandbox, error) {
	var sb projections.Sandbox
	err := c.manage(ctx, func(m *lifecycle.Manager) error {
		var err error
		if sb, err = m.Start(ctx, ref); err != nil {
			return err
		}
		sb, err = awaitReady(ctx, m, sb, w)
		return err
	})
	return already("start", ref, sb, err)
}

// Stop stops a running sandbox (its guest flushed first, within the
// default deadline). A stopped one is left alone and returned.
func (c *Client) Stop(ctx context.Context, ref string) (Sandbox, error) {
	var sb projections.Sandbox
	err := c.manage(ctx, func(m *lifecycle.Manager) error {
		var err error
		sb, err = m.Stop(ctx, ref)
		return err
	})
	return already("stop", ref, sb, err)
}

// already turns a call whose end state already held into success.
func already(op, ref string, sb projections.Sandbox, err error) (Sandbox, error) {
	if errors.Is(err, lifecycle.ErrAlready) {
		err = nil
	}
	if err != nil && sb.ID == "" {
		return Sandbox{}, wrap(op, ref, err)
	}
	return sandboxOf(sb), wrap(op, ref, err)
}

// ExecOptions is one command to run in a sandbox's guest.
type ExecOptions struct {
	Argv []string
	Env  []string // added to the guest's environment (K=V)
	Cwd  string
	// Stdin, when set, is forwarded to the command; nil gives it none.
	Stdin          io.Reader
	Stdout, Stderr io.Writer
}

// ExitStatus is how a command in the guest ended: its exit code, or the
// signal that killed it (Signal > 0).
type ExitStatus struct {
	Code   int
	Signal int
}

// Exec runs a command in a sandbox's guest through its agent and returns
// how it ended. A command the guest could not start is an error
// (*lifecycle.ExecStartError within). On the process driver the "guest"
// is the host: the command runs on the host, as this process's user.
func (c *Client) Exec(ctx context.Context, ref string, o ExecOptions) (ExitStatus, error) {
	var st ExitStatus
	err := c.manage(ctx, func(m *lifecycle.Manager) error {
		es, err := m.Exec(ctx, ref, lifecycle.ExecOptions{Argv: o.Argv, Env: o.Env, Cwd: o.Cwd, Stdin: o.Stdin, Stdout: o.Stdout, Stderr: o.Stderr})
		st = ExitStatus{Code: es.Code, Signal: es.Signal}
		return err
	})
	return st, wrap("exec", ref, err)
}

// Snapshot takes a snapshot of a sandbox and returns its ID. A running
// sandbox's guest freezes its filesystems for it.
func (c *Client) Snapshot(ctx context.Context, ref string) (string, error) {
	var snap string
	err := c.manage(ctx, func(m *lifecycle.Manager) error {
		var err error
		snap, err = m.Snapshot(ctx, ref)
		return err
	})
	return snap, wrap("snapshot", ref, err)
}

// ForkSpec is a fork of a sandbox into Count children (0: one).
type ForkSpec struct {
	Parent string
	Count  int
	// Handle is the child's, or each child's with {n} for its number.
	Handle string
	Labels map[string]string
	Ready  ReadyWait
}

// Fork forks a sandbox. The children are listed in this run's ledger as
// the fork returns them: a process killed during the fork leaves the
// children made so far to `nexus ls` and `rm`, not to the watchdog.
func (c *Client) Fork(ctx context.Context, spec ForkSpec) ([]Sandbox, error) {
	if spec.Count == 0 {
		spec.Count = 1
	}
	c.mu.Lock()
	err := c.beginLocked(ctx)
	c.mu.Unlock()
	if err != nil {
		return nil, wrap("fork", spec.Parent, err)
	}
	var out []Sandbox
	err = c.manage(ctx, func(m *lifecycle.Manager) error {
		children, err := m.Fork(ctx, lifecycle.ForkSpec{Parent: spec.Parent, Count: spec.Count, Handle: spec.Handle, Labels: events.Labels(spec.Labels)})
		for i := range children {
			err = errors.Join(err, c.bind(children[i].ID))
		}
		for i := range children {
			var werr error
			children[i], werr = awaitReady(ctx, m, children[i], spec.Ready)
			err = errors.Join(err, werr)
			out = append(out, sandboxOf(children[i]))
		}
		return err
	})
	return out, wrap("fork", spec.Parent, err)
}

// Event is one journaled lifecycle fact, as `nexus events --json` prints
// it (docs/json.md's Event).
type Event struct {
	EventHeader
	// Data is the payload, as docs/events.md describes each type's.
	Data json.RawMessage `json:"data"`
}

// EventHeader is an event but its payload: the fields every event has.
type EventHeader struct {
	Seq     uint64    `json:"seq"`
	ID      string    `json:"id"`
	Type    string    `json:"type"`
	Schema  uint16    `json:"schema"`
	Sandbox string    `json:"sandbox,omitempty"`
	Time    time.Time `json:"time"`
	Saga    string    `json:"saga,omitempty"`
	Step    string    `json:"step,omitempty"`
}

// HeaderOf is the header of the record r.
func HeaderOf(r events.Record) EventHeader {
	e := r.Event
	return EventHeader{Seq: r.Seq, ID: e.ID.String(), Type: string(e.Type), Schema: e.Schema, Sandbox: e.Sandbox, Time: e.Time,
		Saga: e.Saga, Step: e.Step}
}

// EventQuery selects events.
type EventQuery struct {
	// Sandbox is a sandbox reference (ID, handle, short ID); "" for all.
	Sandbox string
	// Types are full types (sandbox.created) or categories (sandbox);
	// none selects all. Notable adds the user-level ones (`nexus events`'
	// default).
	Types   []string
	Notable bool
	Since   uint64    // first sequence (0: from the start)
	Tail    int       // only the last Tail selected (0: all)
	After   time.Time // nothing stored before it
	// Follow keeps delivering new events until ctx ends or fn fails.
	Follow bool
}

// Events delivers the journal's events, oldest first, to fn; with Follow
// it then waits for new ones. It returns fn's error, or ctx's once
// following ends.
func (c *Client) Events(ctx context.Context, q EventQuery, fn func(Event) error) error {
	eq := events.Query{Types: q.Types, Since: q.Since, Tail: q.Tail, SinceTime: q.After, Follow: q.Follow}
	if q.Notable {
		eq.Types = append(eq.Types, events.Notable()...)
	}
	b, err := c.open(ctx)
	if err != nil {
		return wrap("events", q.Sandbox, err)
	}
	if q.Sandbox != "" {
		sb, err := lifecycle.Lookup(ctx, b, q.Sandbox)
		if err != nil {
			return wrap("events", q.Sandbox, err)
		}
		eq.Sandbox = sb.ID
	}
	err = b.Events(ctx, eq, func(r events.Record) error {
		data, err := json.Marshal(r.Event.Payload)
		if err != nil {
			return err
		}
		return fn(Event{EventHeader: HeaderOf(r), Data: data})
	})
	return wrap("events", q.Sandbox, err)
}

// StopDaemon asks the state root's daemon to finish with the commands it
// has and exit (`nexus daemon stop`), and waits until it has. A daemon
// started on demand also exits by itself once idle.
func (c *Client) StopDaemon(ctx context.Context) error {
	if err := c.disconnect(); err != nil {
		return err
	}
	_, err := control.StopDaemon(ctx, c.opts.StateDir)
	if errors.Is(err, control.ErrNoDaemon) {
		return nil
	}
	return wrap("daemon stop", "", err)
}
