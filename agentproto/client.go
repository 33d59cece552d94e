package agentproto

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"time"
)

// AgentError is an error answer: the agent understood the request and
// refused it or failed to carry it out.
type AgentError struct {
	Type   string // the request's type
	Reason string
}

func (e *AgentError) Error() string { return fmt.Sprintf("agent: %s: %s", e.Type, e.Reason) }

// ErrClosed is returned for requests on a session whose stream ended.
var ErrClosed = errors.New("agent session closed")

// Client is the host's end of one session. Requests may run concurrently;
// frames are routed back to their request by id.
type Client struct {
	rw  io.ReadWriteCloser
	wmu sync.Mutex
	w   *FrameWriter // under wmu

	mu      sync.Mutex
	next    uint32
	pending map[uint32]*pending
	err     error // why the session ended
	done    chan struct{}
}

// NewClient starts a session on rw; call Hello before anything else.
func NewClient(rw io.ReadWriteCloser) *Client {
	c := &Client{rw: rw, w: NewFrameWriter(rw), pending: map[uint32]*pending{}, done: make(chan struct{})}
	go c.readLoop()
	return c
}

// Close ends the session; the agent kills what the session started.
func (c *Client) Close() error {
	err := c.rw.Close()
	<-c.done
	return err
}

func (c *Client) readLoop() {
	var err error
	r := NewFrameReader(c.rw)
	for {
		var m *Message
		m, err = r.Read()
		if err != nil {
			break
		}
		c.mu.Lock()
		p := c.pending[m.ID]
		c.mu.Unlock()
		if p == nil {
			continue // an answer to a request its caller gave up on
		}
		// A caller can give up after the lookup (its writer failed, its
		// context ended): then the frame is dropped, or every later frame
		// of the session would wait behind it for good.
		select {
		case p.ch <- m:
		case <-p.gone:
		}
	}
	if err == io.EOF {
		err = ErrClosed
	}
	c.mu.Lock()
	c.err = err
	c.mu.Unlock()
	close(c.done)
}

func (c *Client) closedErr() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.err == nil || errors.Is(c.err, ErrClosed) {
		return ErrClosed
	}
	return fmt.Errorf("%w: %v", ErrClosed, c.err)
}

func (c *Client) send(m *Message) error {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	return c.w.Write(m)
}

// pending is a request in flight: where its frames go, and closed once
// its caller stopped receiving them.
type pending struct {
	ch   chan *Message
	gone chan struct{}
}

// start sends a request and returns the channel its frames arrive on.
func (c *Client) start(m *Message) (chan *Message, func(), error) {
	m.ID = c.allocID()
	p := &pending{ch: make(chan *Message), gone: make(chan struct{})}
	ch := p.ch
	c.mu.Lock()
	c.pending[m.ID] = p
	c.mu.Unlock()
	var once sync.Once
	end := func() {
		once.Do(func() {
			c.mu.Lock()
			delete(c.pending, m.ID)
			c.mu.Unlock()
			close(p.gone)
		})
	}
	if err := c.send(m); err != nil {
		end()
		return nil, nil, err
	}
	return ch, end, nil
}

func (c *Client) recv(ctx context.Context, ch chan *Message) (*Message, error) {
	select {
	case m := <-ch:
		return m, nil
	case <-c.done:
		return nil, c.closedErr()
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// Call sends a request with a single answer and returns the answer; an
// error answer is an *AgentError.
func (c *Client) Call(ctx context.Context, m *Message) (*Message, error) {
	typ := m.Type
	ch, end, err := c.start(m)
	if err != nil {
		return nil, err
	}
	defer end()
	a, err := c.recv(ctx, ch)
	if err != nil {
		return nil, err
	}
	if a.Type == TError {
		return nil, &AgentError{Type: typ, Reason: a.Error}
	}
	return a, nil
}

// Hello negotiates the version; it must be the session's first request.
func (c *Client) Hello(ctx context.Context) (version int, agent string, err error) {
	a, err := c.Call(ctx, &Message{Type: THello, Version: Version})
	if err != nil {
		return 0, "", err
	}
	if a.Type != THello || a.Version < 1 || a.Version > Version {
		return 0, "", fmt.Errorf("%w: hello answered %q version %d", ErrProtocol, a.Type, a.Version)
	}
	return a.Version, a.Agent, nil
}

// Ping asks the agent to answer.
func (c *Client) Ping(ctx context.Context) error {
	_, err := c.Call(ctx, &Message{Type: TPing})
	return err
}

// Freeze freezes the guest's nexus filesystems until Thaw or deadline, and
// returns their mount points.
func (c *Client) Freeze(ctx context.Context, deadline time.Duration) ([]string, error) {
	a, err := c.Call(ctx, &Message{Type: TFreeze, DeadlineMs: deadline.Milliseconds()})
	if err != nil {
		return nil, err
	}
	return a.Paths, nil
}

// Flush is Freeze for stop: its nil return is the proof a flush
// acknowledgement is journaled on.
func (c *Client) Flush(ctx context.Context, deadline time.Duration) ([]string, error) {
	a, err := c.Call(ctx, &Message{Type: TFlush, DeadlineMs: deadline.Milliseconds()})
	if err != nil {
		return nil, err
	}
	return a.Paths, nil
}

// Thaw thaws what a freeze or flush froze.
func (c *Client) Thaw(ctx context.Context) ([]string, error) {
	a, err := c.Call(ctx, &Message{Type: TThaw})
	if err != nil {
		return nil, err
	}
	return a.Paths, nil
}

// Exec describes a command to run in the guest.
type Exec struct {
	Argv  []string
	Env   []string
	Cwd   string
	Stdin io.Reader // nil: the command reads /dev/null
	// Stdout and Stderr receive the command's output as it streams; nil
	// discards it.
	Stdout, Stderr io.Writer
	// Signals forwards signal numbers to the running command.
	Signals <-chan int
	// TTY runs the command on a terminal the agent allocates: its
	// output, stderr included, arrives as stdout.
	TTY bool
}

// ExitStatus is how a guest command ended: Signal is non-zero when a
// signal killed it, Code otherwise.
type ExitStatus struct {
	Code   int
	Signal int
}

// Exec runs a command and streams its output until it exits.
func (c *Client) Exec(ctx context.Context, e Exec) (ExitStatus, error) {
	req := &Message{Type: TExec, Argv: e.Argv, Env: e.Env, Cwd: e.Cwd, Stdin: e.Stdin != nil, TTY: e.TTY}
	ch, end, err := c.start(req)
	if err != nil {
		return ExitStatus{}, err
	}
	defer end()
	id := req.ID
	stop := make(chan struct{})
	defer close(stop)
	if e.Stdin != nil {
		go c.pump(id, e.Stdin, stop)
	}
	if e.Signals != nil {
		go func() {
			for {
				select {
				case s := <-e.Signals:
					c.send(&Message{Type: TSignal, ID: c.allocID(), Ref: id, Signal: s})
				case <-stop:
					return
				}
			}
		}()
	}
	for {
		m, err := c.recv(ctx, ch)
		if err != nil {
			return ExitStatus{}, err
		}
		switch m.Type {
		case TStdout, TStderr:
			w := e.Stdout
			if m.Type == TStderr {
				w = e.Stderr
			}
			if w != nil {
				if _, err := w.Write(m.Data); err != nil {
					return ExitStatus{}, err
				}
			}
			ReleaseData(m.Data)
		case TExit:
			return ExitStatus{Code: m.Code, Signal: m.Signal}, nil
		case TError:
			return ExitStatus{}, &AgentError{Type: TExec, Reason: m.Error}
		}
	}
}

// allocID is an id for a frame that expects no answer routed to a caller.
func (c *Client) allocID() uint32 {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.next++
	if c.next == 0 {
		c.next = 1
	}
	return c.next
}

// pump sends r as data frames for request ref, the last one with eof.
func (c *Client) pump(ref uint32, r io.Reader, stop <-chan struct{}) error {
	// Whole frames: fewer frames are fewer writes and wake-ups at both
	// ends.
	buf := make([]byte, MaxData)
	for {
		n, err := r.Read(buf)
		if n > 0 {
			if serr := c.send(&Message{Type: TData, ID: c.allocID(), Ref: ref, Data: buf[:n]}); serr != nil {
				return serr
			}
		}
		select {
		case <-stop:
			return nil
		default:
		}
		if err == io.EOF {
			return c.send(&Message{Type: TData, ID: c.allocID(), Ref: ref, EOF: true})
		}
		if err != nil {
			return err
		}
	}
}

// ReadFile copies a guest file to w and returns its size.
func (c *Client) ReadFile(ctx context.Context, path string, w io.Writer) (int64, error) {
	ch, end, err := c.start(&Message{Type: TRead, Path: path})
	if err != nil {
		return 0, err
	}
	defer end()
	var n int64
	for {
		m, err := c.recv(ctx, ch)
		if err != nil {
			return n, err
		}
		switch m.Type {
		case TData:
			k, err := w.Write(m.Data)
			ReleaseData(m.Data)
			n += int64(k)
			if err != nil {
				return n, err
			}
		case TOK:
			if m.Size != n {
				return n, fmt.Errorf("%w: read %s: %d bytes arrived, agent sent %d", ErrProtocol, path, n, m.Size)
			}
			return n, nil
		case TError:
			return n, &AgentError{Type: TRead, Reason: m.Error}
		}
	}
}

// WriteFile replaces a guest file with r's bytes (mode 0 means 0644); the
// agent publishes it only after the last byte is durable.
func (c *Client) WriteFile(ctx context.Context, path string, mode uint32, r io.Reader) (int64, error) {
	req := &Message{Type: TWrite, Path: path, Mode: mode}
	ch, end, err := c.start(req)
	if err != nil {
		return 0, err
	}
	defer end()
	id := req.ID
	stop := make(chan struct{})
	defer close(stop)
	perr := make(chan error, 1)
	go func() { perr <- c.pump(id, r, stop) }()
	m, err := c.recv(ctx, ch)
	if err != nil {
		return 0, err
	}
	if m.Type == TError {
		return 0, &AgentError{Type: TWrite, Reason: m.Error}
	}
	if err := <-perr; err != nil {
		return 0, err
	}
	return m.Size, nil
}
