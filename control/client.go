package control

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/nexus-sandbox/nexus/control/wire"
	"github.com/nexus-sandbox/nexus/core"
	"github.com/nexus-sandbox/nexus/events"
	"github.com/nexus-sandbox/nexus/host/fleetstate"
	"github.com/nexus-sandbox/nexus/host/fsx"
	"github.com/nexus-sandbox/nexus/host/proc"
	"github.com/nexus-sandbox/nexus/host/unixsock"
	"github.com/nexus-sandbox/nexus/projections"
)

// Client talks to a daemon over its control socket.
type Client struct {
	root, sock string
	http       *http.Client
	// stream carries appends (appendstream.go); opened on the first.
	smu    sync.Mutex
	stream *appendStream
	// ensure, for a daemon started on demand, makes a daemon answer again
	// (starting one if need be) after this one went away: idled out between
	// our requests, or was killed.
	ensure func(context.Context) error
	// lost is set once ensure found another build's daemon: every later
	// dial fails with it, so no retry reaches that daemon.
	lost atomic.Pointer[replacedError]
	// first is a connection already proven (dialStatus's), which the
	// transport takes at its first dial instead of opening another.
	fmu   sync.Mutex
	first net.Conn
}

// NewClient returns a client for the daemon socket at sock, directly
// under its state root.
func NewClient(sock string) *Client {
	c := &Client{root: filepath.Dir(sock), sock: sock}
	c.http = &http.Client{Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			if conn := c.takeFirst(); conn != nil {
				return conn, nil
			}
			return c.dial(ctx)
		},
	}}
	return c
}

// takeFirst is the proven connection waiting for the transport, or nil.
func (c *Client) takeFirst() net.Conn {
	c.fmu.Lock()
	defer c.fmu.Unlock()
	conn := c.first
	c.first = nil
	return conn
}

// dial connects to the daemon, making one answer first if it went away.
func (c *Client) dial(ctx context.Context) (net.Conn, error) {
	if re := c.lost.Load(); re != nil {
		return nil, re
	}
	conn, _, err := c.connect(ctx)
	if err != nil && c.ensure != nil && gone(err) {
		if err := c.ensure(ctx); err != nil {
			if re := (*replacedError)(nil); errors.As(err, &re) {
				c.lost.Store(re)
			}
			return nil, err
		}
		conn, _, err = c.connect(ctx)
	}
	return conn, err
}

// ErrForeignSocket means the root's control socket is not its daemon's:
// a link, not a socket, or answered by a daemon serving another root (a
// hard link or bind mount can put one there). Nothing is sent through it.
var ErrForeignSocket = errors.New("refusing the daemon socket")

// OpenFailedError is a daemon's answer that the root's journal did not
// open behind the reads it had begun to answer early
// (wire.OpenFailedHeader): the open's error, as a command opening the root
// itself would fail with it. The daemon is exiting; nothing is retried.
type OpenFailedError struct{ Text string }

func (e *OpenFailedError) Error() string { return e.Text }

// openFailed is the OpenFailedError an answer carries, or nil; it reads
// the answer's body if it carries one.
func openFailed(resp *http.Response, body []byte) error {
	if resp.Header.Get(wire.OpenFailedHeader) == "" {
		return nil
	}
	if body == nil {
		body, _ = io.ReadAll(io.LimitReader(resp.Body, 1<<16))
		resp.Body.Close()
	}
	var ea wire.ErrorAnswer
	if json.Unmarshal(body, &ea) != nil || ea.Error == "" {
		ea.Error = "the daemon could not open the state root: " + resp.Status
	}
	return &OpenFailedError{Text: ea.Error}
}

// connect opens the root's socket under the rules of every other file
// under the root (host/fsx: no link anywhere), and proves, before the
// connection carries a request, that the daemon answering serves this
// root. The daemon's Status comes with the proof (nil from a daemon of a
// build that does not send it).
func (c *Client) connect(ctx context.Context) (net.Conn, *wire.Status, error) {
	f, err := fsx.OpenSocket(c.root, filepath.Base(c.sock))
	if err != nil {
		if errors.Is(err, fsx.ErrSymlink) || errors.Is(err, fsx.ErrNotSocket) || errors.Is(err, fsx.ErrEscapes) {
			return nil, nil, fmt.Errorf("%w: %w (a state root's control socket is its daemon's own; remove what is there)", ErrForeignSocket, err)
		}
		return nil, nil, err
	}
	defer f.Close()
	conn, err := unixsock.DialFile(ctx, f)
	if err != nil {
		return nil, nil, err
	}
	// A stopped daemon's socket still accepts (the kernel queues the
	// connection) and nothing ever answers: asked first, the kernel says
	// who is on the other end and /proc whether it runs.
	if err := stoppedPeer(conn); err != nil {
		conn.Close()
		return nil, nil, err
	}
	st, err := c.prove(ctx, conn)
	if err != nil {
		conn.Close()
		return nil, nil, err
	}
	return conn, st, nil
}

// ErrDaemonStopped means the daemon holding the root is stopped (SIGSTOP,
// Ctrl-Z, a debugger): its socket accepts, nothing answers, and no other
// daemon can take the root until it runs again.
var ErrDaemonStopped = errors.New("stopped")

// stoppedPeer is the error for a connection whose daemon did not answer
// because it is stopped, or nil: the kernel names the peer of a unix
// socket (SO_PEERCRED), and /proc says whether it runs.
func stoppedPeer(conn net.Conn) error {
	uc, ok := conn.(*net.UnixConn)
	if !ok {
		return nil
	}
	raw, err := uc.SyscallConn()
	if err != nil {
		return nil
	}
	var cred *unix.Ucred
	raw.Control(func(fd uintptr) { cred, _ = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED) })
	if cred == nil || cred.Pid <= 0 {
		return nil
	}
	pid := int(cred.Pid)
	switch st, _ := proc.State(pid); st {
	case 'T':
		return fmt.Errorf("the daemon serving this state root (pid %d) is %w (SIGSTOP or Ctrl-Z) and answers nothing: resume it with `kill -CONT %d`", pid, ErrDaemonStopped, pid)
	case 't':
		return fmt.Errorf("the daemon serving this state root (pid %d) is %w by a debugger and answers nothing: detach the debugger or run `kill -CONT %d`", pid, ErrDaemonStopped, pid)
	}
	return nil
}

// final is a dial error no retry, daemon start or fallback may pass: the
// socket is another root's, or its daemon is stopped.
func final(err error) bool {
	var of *OpenFailedError
	return errors.Is(err, ErrForeignSocket) || errors.Is(err, ErrDaemonStopped) || errors.As(err, &of)
}

// prove asks the daemon on conn which root it serves (wire.PathIdentity)
// and refuses a daemon of another root, naming both. A daemon of a build
// from before the question answers 404 and is let through: a client uses
// another build's daemon for nothing but its status and retirement. The
// Status the answer carries is returned (nil if it carries none).
func (c *Client) prove(ctx context.Context, conn net.Conn) (*wire.Status, error) {
	want, err := fsx.RootID(c.root)
	if err != nil {
		return nil, err
	}
	stop := context.AfterFunc(ctx, func() { conn.SetDeadline(time.Unix(1, 0)) })
	resp, body, err := identityExchange(conn)
	if !stop() {
		return nil, notAwaited{cause: context.Cause(ctx), ctxErr: ctx.Err()}
	}
	if err != nil {
		return nil, fmt.Errorf("the daemon on %s did not say which root it serves: %w", c.sock, err)
	}
	if err := openFailed(resp, body); err != nil {
		return nil, err
	}
	switch resp.StatusCode {
	case http.StatusNotFound:
		return nil, nil
	case http.StatusOK:
		var got wire.RootIdentity
		if err := json.Unmarshal(body, &got); err != nil {
			return nil, fmt.Errorf("the daemon on %s: its root identity: %w", c.sock, err)
		}
		if !got.Same(wire.RootIdentity{Dev: want.Dev, Ino: want.Ino}) {
			self := wire.RootIdentity{Root: c.root, Dev: want.Dev, Ino: want.Ino}
			return nil, fmt.Errorf("%w: the daemon answering on %s (pid %d) serves the state root %s, not %s", ErrForeignSocket, c.sock, got.Pid, got, self)
		}
		return got.Status, nil
	default:
		var ea wire.ErrorAnswer
		json.Unmarshal(body, &ea)
		if ea.Error == "" {
			ea.Error = resp.Status
		}
		return nil, fmt.Errorf("%w: the daemon on %s: %s", ErrForeignSocket, c.sock, ea.Error)
	}
}

// identityExchange sends the identity question on a fresh connection and
// reads the whole answer, leaving the connection at a request boundary
// for the transport that takes it next.
func identityExchange(conn net.Conn) (*http.Response, []byte, error) {
	if _, err := io.WriteString(conn, "GET "+wire.PathIdentity+" HTTP/1.1\r\nHost: nexus\r\n\r\n"); err != nil {
		return nil, nil, err
	}
	br := bufio.NewReader(conn)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		return nil, nil, err
	}
	body, err := io.ReadAll(io.LimitReader(resp.Body, 1<<16))
	resp.Body.Close()
	if err != nil {
		return nil, nil, err
	}
	if br.Buffered() > 0 {
		return nil, nil, errors.New("it sent more than its answer")
	}
	return resp, body, nil
}

// afterBreak runs when this client's connection to its daemon broke and
// it is about to go on: whatever daemon answers now must be of this build.
// A dial alone cannot tell: when the replacement already listens, the dial
// succeeds, and a command from before an upgrade would talk to the new
// build's daemon silently (as a long-running `events --follow` would).
func (c *Client) afterBreak(ctx context.Context) error {
	if c.ensure == nil {
		return nil
	}
	if re := c.lost.Load(); re != nil {
		return re
	}
	err := c.ensure(ctx)
	if re := (*replacedError)(nil); errors.As(err, &re) {
		c.lost.Store(re)
	}
	return err
}

// gone is a dial error that means no daemon listens on the socket, or the
// one that did closed the connection before saying which root it serves
// (it is retiring, or died).
func gone(err error) bool {
	return errors.Is(err, syscall.ENOENT) || errors.Is(err, syscall.ECONNREFUSED) ||
		errors.Is(err, syscall.EPIPE) || errors.Is(err, syscall.ECONNRESET) || errors.Is(err, io.EOF)
}

// do sends req; for a daemon started on demand, a request that got no
// response because the connection broke (the daemon closed it while
// retiring, or died) is sent once more, through a daemon that answers. An
// append sent twice is harmless: events carry dedup ids.
func (c *Client) do(req *http.Request) (*http.Response, error) {
	resp, err := c.doOnce(req)
	if err != nil && req.Context().Err() != nil {
		// Interrupted or timed out: say that, not which URL the
		// transport was posting to.
		return nil, notAwaited{cause: context.Cause(req.Context()), ctxErr: req.Context().Err()}
	}
	if ue := (*url.Error)(nil); final(err) && errors.As(err, &ue) {
		// The refusal is the whole story: not which URL was being asked.
		return nil, ue.Err
	}
	if final(err) {
		return nil, err
	}
	if err == nil || c.ensure == nil {
		return resp, err
	}
	if aerr := c.afterBreak(req.Context()); aerr != nil {
		return nil, aerr
	}
	if req.GetBody != nil {
		body, berr := req.GetBody()
		if berr != nil {
			return nil, err
		}
		req.Body = body
	}
	return c.doOnce(req)
}

// doOnce sends req once; an answer marked wire.OpenFailedHeader is its
// OpenFailedError.
func (c *Client) doOnce(req *http.Request) (*http.Response, error) {
	resp, err := c.http.Do(req)
	if err != nil {
		return nil, err
	}
	if err := openFailed(resp, nil); err != nil {
		return nil, err
	}
	return resp, nil
}

// notAwaited is a request whose context ended first. It reads as the
// cause (an interruption, say) and is both the cause and the context's
// error to errors.Is.
type notAwaited struct{ cause, ctxErr error }

func (e notAwaited) Error() string   { return "the daemon's answer was not awaited: " + e.cause.Error() }
func (e notAwaited) Unwrap() []error { return []error{e.cause, e.ctxErr} }

// Retire asks a daemon started on demand to stop accepting and exit once
// its clients are done.
func (c *Client) Retire(ctx context.Context) error {
	return c.post(ctx, wire.PathRetire, nil)
}

// Stop asks the daemon, however it was started, to finish with the
// commands it has and exit.
func (c *Client) Stop(ctx context.Context) error {
	body, err := json.Marshal(wire.StopRequest{Pid: os.Getpid()})
	if err != nil {
		return err
	}
	return c.post(ctx, wire.PathStop, body)
}

// post sends body (nil: none) to path and wants 200 OK.
func (c *Client) post(ctx context.Context, path string, body []byte) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+path, bytes.NewReader(body))
	if err != nil {
		return err
	}
	resp, err := c.doOnce(req)
	if err != nil {
		return err
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("daemon: %s: %s", strings.TrimPrefix(path, "/v1/"), resp.Status)
	}
	return nil
}

const base = "http://nexus"

func (c *Client) Close() error {
	c.smu.Lock()
	if c.stream != nil {
		c.stream.close()
		c.stream = nil
	}
	c.smu.Unlock()
	if conn := c.takeFirst(); conn != nil {
		conn.Close()
	}
	c.http.CloseIdleConnections()
	return nil
}

// Status asks the daemon who it is.
func (c *Client) Status(ctx context.Context) (wire.Status, error) {
	var st wire.Status
	err := c.getJSON(ctx, wire.PathStatus, &st)
	return st, err
}

// Stats asks the daemon what it has served (tests count with it).
func (c *Client) Stats(ctx context.Context) (wire.Stats, error) {
	var st wire.Stats
	err := c.getJSON(ctx, wire.PathStats, &st)
	return st, err
}

// Metrics copies the daemon's Prometheus metrics, as it serves them, to w.
func (c *Client) Metrics(ctx context.Context, w io.Writer) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+wire.PathMetrics, nil)
	if err != nil {
		return err
	}
	resp, err := c.do(req)
	if err != nil {
		return fmt.Errorf("daemon: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("daemon: %s: %s", wire.PathMetrics, resp.Status)
	}
	_, err = io.Copy(w, resp.Body)
	return err
}

// Mirror asks the daemon for its fleet mirror's state (nil: none).
func (c *Client) Mirror(ctx context.Context) (*fleetstate.MirrorState, error) {
	var out wire.MirrorAnswer
	err := c.getJSON(ctx, wire.PathMirror, &out)
	return out.Mirror, err
}

func (c *Client) Sandboxes(ctx context.Context) ([]projections.Sandbox, error) {
	var list []wire.Sandbox
	err := c.getJSON(ctx, wire.PathSandboxes, &list)
	return wire.Views(list), err
}

func (c *Client) SandboxPage(ctx context.Context, after string, limit int) ([]projections.Sandbox, error) {
	q := url.Values{"after": {after}, "limit": {strconv.Itoa(limit)}}
	var list []wire.Sandbox
	err := c.getJSON(ctx, wire.PathSandboxes+"?"+q.Encode(), &list)
	return wire.Views(list), err
}

func (c *Client) ListJSON(ctx context.Context, w io.Writer, after string, limit int) error {
	q := url.Values{"after": {after}, "limit": {strconv.Itoa(limit)}}
	body, err := c.get(ctx, wire.PathListJSON+"?"+q.Encode())
	if err != nil {
		return err
	}
	defer body.Close()
	if _, err := io.Copy(w, body); err != nil {
		return fmt.Errorf("daemon: %s: %w", wire.PathListJSON, err)
	}
	return nil
}

func (c *Client) WithProcesses(ctx context.Context) ([]projections.Sandbox, error) {
	var list []wire.Sandbox
	err := c.getJSON(ctx, wire.PathWithProcesses, &list)
	return wire.Views(list), err
}

func (c *Client) Sandbox(ctx context.Context, ref string) (projections.Sandbox, bool, error) {
	var out wire.SandboxAnswer
	err := c.getJSON(ctx, wire.PathSandbox+"?ref="+url.QueryEscape(ref), &out)
	return out.Sandbox.View(), out.Found, err
}

func (c *Client) Named(ctx context.Context, ref string) ([]projections.Ref, error) {
	var out []projections.Ref
	err := c.getJSON(ctx, wire.PathNamed+"?ref="+url.QueryEscape(ref), &out)
	return out, err
}

func (c *Client) OwnerOf(ctx context.Context, paths []string, except string) (string, string, bool, error) {
	q := url.Values{"path": paths, "except": {except}}
	var out wire.OwnerAnswer
	err := c.getJSON(ctx, wire.PathOwner+"?"+q.Encode(), &out)
	return out.Sandbox, out.Path, out.Found, err
}

// PathOwners asks the daemon in batches of wire.PathOwnersBatch, each a
// POST of the paths as they are (wire.AppendPaths) answered one owner a
// line.
func (c *Client) PathOwners(ctx context.Context, paths []string) ([]string, error) {
	out := make([]string, 0, len(paths))
	for len(paths) > 0 {
		chunk := paths[:min(wire.PathOwnersBatch, len(paths))]
		paths = paths[len(chunk):]
		// A body of its own: the transport may still hold the last one.
		size := len(chunk)
		for _, p := range chunk {
			size += len(p)
		}
		body, err := wire.AppendPaths(make([]byte, 0, size), chunk)
		if err != nil {
			return nil, err
		}
		answer, err := c.postRead(ctx, wire.PathPathOwners, body)
		if err != nil {
			return nil, err
		}
		got, err := wire.SplitOwners(answer, len(chunk))
		if err != nil {
			return nil, fmt.Errorf("daemon: %s: %w", wire.PathPathOwners, err)
		}
		out = append(out, got...)
	}
	return out, nil
}

// postRead posts body to path and is the answer of a daemon that
// answered 200 OK; another status is an error naming the daemon's
// ErrorAnswer.
func (c *Client) postRead(ctx context.Context, path string, body []byte) (string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+path, bytes.NewReader(body))
	if err != nil {
		return "", err
	}
	resp, err := c.do(req)
	if final(err) {
		return "", err
	}
	if err != nil {
		return "", fmt.Errorf("daemon: %w", err)
	}
	defer resp.Body.Close()
	var answer strings.Builder
	if resp.ContentLength > 0 {
		answer.Grow(int(resp.ContentLength))
	}
	if _, err := io.Copy(&answer, resp.Body); err != nil {
		return "", fmt.Errorf("daemon: %s: %w", path, err)
	}
	if resp.StatusCode != http.StatusOK {
		var e wire.ErrorAnswer
		if json.Unmarshal([]byte(answer.String()), &e) == nil && e.Error != "" {
			return "", fmt.Errorf("daemon: %s: %s: %s", path, resp.Status, e.Error)
		}
		return "", fmt.Errorf("daemon: %s: %s", path, resp.Status)
	}
	return answer.String(), nil
}

func (c *Client) SnapshotOwner(ctx context.Context, snap string) (projections.Sandbox, bool, error) {
	var out wire.SandboxAnswer
	err := c.getJSON(ctx, wire.PathSnapshotOwner+"?snap="+url.QueryEscape(snap), &out)
	return out.Sandbox.View(), out.Found, err
}

func (c *Client) SnapshotsNamed(ctx context.Context, ref string) ([]projections.SnapshotRef, error) {
	var out []projections.SnapshotRef
	err := c.getJSON(ctx, wire.PathSnapshotsNamed+"?ref="+url.QueryEscape(ref), &out)
	return out, err
}

func (c *Client) OpenSagas(ctx context.Context) ([]projections.OpenSaga, error) {
	var list []projections.OpenSaga
	err := c.getJSON(ctx, wire.PathSagas, &list)
	return list, err
}

func (c *Client) Volumes(ctx context.Context) ([]projections.Volume, error) {
	var list []projections.Volume
	err := c.getJSON(ctx, wire.PathVolumes, &list)
	return list, err
}

func (c *Client) ImageCache(ctx context.Context) (projections.ImageCacheState, error) {
	var st projections.ImageCacheState
	err := c.getJSON(ctx, wire.PathImageCache, &st)
	return st, err
}

func (c *Client) Bootstrap(ctx context.Context, id string) (events.Bootstrap, error) {
	var b events.Bootstrap
	err := c.getJSON(ctx, wire.PathBootstrap+"?id="+url.QueryEscape(id), &b)
	return b, err
}

func (c *Client) Rev(ctx context.Context, entity core.Entity) (uint64, error) {
	var out wire.RevAnswer
	err := c.getJSON(ctx, wire.PathRev+"?entity="+url.QueryEscape(string(entity)), &out)
	return out.Rev, err
}

func (c *Client) Append(ctx context.Context, evs ...events.Event) ([]uint64, error) {
	return c.AppendExpect(ctx, nil, evs...)
}

func (c *Client) AppendExpect(ctx context.Context, expect []core.Expect, evs ...events.Event) ([]uint64, error) {
	req := wire.AppendRequest{Events: make([][]byte, 0, len(evs))}
	for _, e := range evs {
		data, err := events.Encode(e)
		if err != nil {
			return nil, err
		}
		req.Events = append(req.Events, data)
	}
	req.Expect = expect
	resp, err := c.appendOnce(ctx, &req)
	if errors.Is(err, errStreamBroken) && c.ensure != nil && ctx.Err() == nil {
		// The daemon went away (retired, idled out or killed) with the
		// append unanswered: send it once more, through a daemon that
		// answers. It may have been stored; its events' ids make the
		// journal store it once.
		if err = c.afterBreak(ctx); err == nil {
			resp, err = c.appendOnce(ctx, &req)
		}
	}
	if err != nil {
		return nil, fmt.Errorf("daemon: %w", err)
	}
	return resp.Result()
}

// appendOnce sends req on the client's append stream, opening one if there
// is none or the last one broke.
func (c *Client) appendOnce(ctx context.Context, req *wire.AppendRequest) (*wire.AppendResponse, error) {
	c.smu.Lock()
	s := c.stream
	if s == nil || s.broken() {
		var err error
		if s != nil {
			err = c.afterBreak(ctx)
		}
		if err == nil {
			s, err = dialAppendStream(ctx, c.dial)
		}
		if err != nil {
			c.smu.Unlock()
			if ctx.Err() != nil {
				return nil, notAwaited{cause: context.Cause(ctx), ctxErr: ctx.Err()}
			}
			return nil, err
		}
		c.stream = s
	}
	c.smu.Unlock()
	return s.call(ctx, req)
}

func (c *Client) Events(ctx context.Context, q events.Query, fn func(events.Record) error) error {
	if !q.Follow || c.ensure == nil {
		_, err := c.events(ctx, q, fn)
		return err
	}
	// A follower of a daemon started on demand outlives that daemon: when
	// the stream breaks (the daemon retired or was killed) it resumes after
	// the last event it delivered, through the next daemon.
	backoff := 50 * time.Millisecond
	for {
		var last uint64
		broken, err := c.events(ctx, q, func(r events.Record) error {
			last = r.Seq
			return fn(r)
		})
		if !broken || ctx.Err() != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			return err
		}
		if re := (*replacedError)(nil); errors.As(err, &re) {
			// Another build serves the root now: following it would
			// be using it silently (autostart.go, redial).
			return re
		}
		if err := c.afterBreak(ctx); err != nil {
			if re := (*replacedError)(nil); errors.As(err, &re) || ctx.Err() != nil {
				return err
			}
			// No daemon could be made to answer yet: the next
			// attempt's dial tries again, as before.
		}
		if last > 0 {
			// Resume by position: the tail and start time were spent.
			q.Since, q.SinceTime, q.Tail = last+1, time.Time{}, 0
			backoff = 50 * time.Millisecond
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(backoff):
		}
		backoff = min(backoff*2, time.Second)
	}
}

// events runs one events request; broken reports a stream that ended
// without the journal's say (connection lost, or a follow cut short).
func (c *Client) events(ctx context.Context, q events.Query, fn func(events.Record) error) (broken bool, err error) {
	v := wire.QueryValues(q)
	hreq, err := http.NewRequestWithContext(ctx, http.MethodGet, base+wire.PathEvents+"?"+v.Encode(), nil)
	if err != nil {
		return false, err
	}
	resp, err := c.do(hreq)
	if err != nil {
		if ctx.Err() != nil {
			return false, ctx.Err()
		}
		if final(err) {
			return false, err
		}
		return true, fmt.Errorf("daemon: %w", err)
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 16<<20)
	for sc.Scan() {
		var rec wire.Record
		if err := json.Unmarshal(sc.Bytes(), &rec); err != nil {
			return false, fmt.Errorf("daemon: events: %w", err)
		}
		if rec.Error != "" {
			return false, errors.New(rec.Error)
		}
		e, err := events.Decode(rec.Data)
		if err != nil {
			return false, fmt.Errorf("journal event %d: %w", rec.Seq, err)
		}
		if err := fn(events.Record{Seq: rec.Seq, Event: e}); err != nil {
			return false, err
		}
	}
	if ctx.Err() != nil {
		return false, ctx.Err()
	}
	if err := sc.Err(); err != nil {
		return true, err
	}
	return q.Follow, nil
}

func (c *Client) getJSON(ctx context.Context, path string, v any) error {
	body, err := c.get(ctx, path)
	if err != nil {
		return err
	}
	defer body.Close()
	return json.NewDecoder(body).Decode(v)
}

// get is the body of a GET of path that the daemon answered 200 OK.
func (c *Client) get(ctx context.Context, path string) (io.ReadCloser, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+path, nil)
	if err != nil {
		return nil, err
	}
	resp, err := c.do(req)
	if final(err) {
		return nil, err
	}
	if err != nil {
		return nil, fmt.Errorf("daemon: %w", err)
	}
	if resp.StatusCode != http.StatusOK {
		resp.Body.Close()
		name, _, _ := strings.Cut(path, "?")
		return nil, fmt.Errorf("daemon: %s: %s", name, resp.Status)
	}
	return resp.Body, nil
}
