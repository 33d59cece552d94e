package control

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/vmihailenco/msgpack/v5"

	"github.com/nexus-sandbox/nexus/events"
	"github.com/nexus-sandbox/nexus/guard"
	"github.com/nexus-sandbox/nexus/host/journal"
	"github.com/nexus-sandbox/nexus/node"
)

// The append stream: appends travel on one connection per client, upgraded
// from an HTTP request on the daemon's socket, as length-prefixed msgpack
// frames that the client pipelines (several in flight, answered by id).
// Each append over HTTP cost a request, a JSON body with the event
// base64-encoded and a JSON answer, and that round trip kept a writer out
// of the committer's next group (docs/benchmarks.md, section 5). The rest
// of the daemon's API stays HTTP.
//
// The client and the daemon ship together; the version is the upgrade
// token, so a client and a daemon of different wire versions refuse each
// other with a message instead of misreading frames.
const (
	appendStreamPath  = "/v1/append-stream"
	appendStreamProto = "nexus-append/1"
	// maxFrame bounds a frame a peer announces, so a garbled length is an
	// error, not an allocation of gigabytes.
	maxFrame = 64 << 20
)

// errAppendOverHTTP answers a client that still posts appends as JSON: it
// is older than this daemon.
const errAppendOverHTTP = "this nexus daemon takes appends only on its append stream (" + appendStreamProto + "); the command is from an older nexus: use the nexus binary the daemon runs, or stop the daemon"

type streamRequest struct {
	_msgpack struct{} `msgpack:",as_array"`
	ID       uint64
	Events   [][]byte // each event's journal bytes (events.Encode)
	Expect   []streamExpect
}

type streamExpect struct {
	_msgpack struct{} `msgpack:",as_array"`
	Entity   string
	Seq      uint64
}

type streamResponse struct {
	_msgpack   struct{} `msgpack:",as_array"`
	ID         uint64
	Seqs       []uint64
	Error      string
	Conflict   bool
	SagaClosed bool
	Stale      *streamStale
}

type streamStale struct {
	_msgpack struct{} `msgpack:",as_array"`
	Entity   string
	Expected uint64
	Actual   uint64
	Latest   string
}

func writeFrame(w io.Writer, v any) error {
	body, err := msgpack.Marshal(v)
	if err != nil {
		return err
	}
	frame := make([]byte, 4, 4+len(body))
	binary.BigEndian.PutUint32(frame, uint32(len(body)))
	_, err = w.Write(append(frame, body...))
	return err
}

func readFrame(r io.Reader, v any) error {
	var hdr [4]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		return err
	}
	size := binary.BigEndian.Uint32(hdr[:])
	if size > maxFrame {
		return fmt.Errorf("append stream: frame of %d bytes announced (at most %d)", size, maxFrame)
	}
	body := make([]byte, size)
	if _, err := io.ReadFull(r, body); err != nil {
		return fmt.Errorf("append stream: %w", noEOF(err))
	}
	if err := msgpack.Unmarshal(body, v); err != nil {
		return fmt.Errorf("append stream: bad frame: %w", err)
	}
	return nil
}

func noEOF(err error) error {
	if err == io.EOF {
		return io.ErrUnexpectedEOF
	}
	return err
}

// serveAppendStream upgrades r's connection to an append stream and
// serves it until the client closes it or the daemon stops. Each request
// runs on its own goroutine, so a client's concurrent appends join one
// group; answers are written as they come.
func serveAppendStream(n *node.Node, cl *clients, streams *streamSet, w http.ResponseWriter, r *http.Request) {
	if got := r.Header.Get("Upgrade"); !strings.EqualFold(got, appendStreamProto) {
		http.Error(w, fmt.Sprintf("append stream: this daemon speaks %s, the client asked for %q: use the nexus binary the daemon runs", appendStreamProto, got), http.StatusUpgradeRequired)
		return
	}
	hj, ok := w.(http.Hijacker)
	if !ok {
		http.Error(w, "append stream: connection cannot be upgraded", http.StatusInternalServerError)
		return
	}
	// Hijacking takes the connection out of the server's count; hold it as
	// a client until the stream ends, so an idle daemon does not exit under
	// a command that is still appending.
	cl.hold()
	defer cl.release()
	conn, rw, err := hj.Hijack()
	if err != nil {
		return
	}
	if !streams.add(conn) {
		conn.Close()
		return
	}
	defer streams.remove(conn)
	defer conn.Close()
	rw.WriteString("HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: " + appendStreamProto + "\r\n\r\n")
	if err := rw.Flush(); err != nil {
		return
	}
	var (
		wmu      sync.Mutex
		inflight sync.WaitGroup
	)
	// Answers still owed are written before the connection closes: a
	// client that closes its side after its last answer gets every one.
	defer inflight.Wait()
	ctx := r.Context()
	for {
		var req streamRequest
		if err := readFrame(rw.Reader, &req); err != nil {
			return
		}
		inflight.Add(1)
		go func() {
			defer inflight.Done()
			resp := appendOverStream(ctx, n, &req)
			wmu.Lock()
			defer wmu.Unlock()
			if err := writeFrame(conn, resp); err != nil {
				conn.Close() // the reader sees it and ends the stream
			}
		}()
	}
}

func appendOverStream(ctx context.Context, n *node.Node, req *streamRequest) streamResponse {
	resp := streamResponse{ID: req.ID}
	evs := make([]events.Event, 0, len(req.Events))
	for _, data := range req.Events {
		e, err := events.Decode(data)
		if err != nil {
			resp.Error = err.Error()
			return resp
		}
		evs = append(evs, e)
	}
	var expect []guard.Expect
	for _, x := range req.Expect {
		expect = append(expect, guard.Expect{Entity: guard.Entity(x.Entity), Seq: x.Seq})
	}
	seqs, err := n.AppendExpect(ctx, expect, evs...)
	resp.Seqs = seqs
	if err != nil {
		resp.Error = err.Error()
		resp.Conflict = errors.Is(err, journal.ErrConflict)
		resp.SagaClosed = errors.Is(err, guard.ErrSagaClosed)
		var stale *guard.StaleError
		if errors.As(err, &stale) {
			resp.Stale = &streamStale{Entity: string(stale.Entity), Expected: stale.Expected, Actual: stale.Actual, Latest: string(stale.Latest)}
		}
	}
	return resp
}

// streamSet is the open append streams, closed when the daemon stops: the
// HTTP server no longer owns a hijacked connection.
type streamSet struct {
	mu     sync.Mutex
	m      map[net.Conn]bool
	closed bool
}

func (s *streamSet) add(c net.Conn) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return false
	}
	if s.m == nil {
		s.m = map[net.Conn]bool{}
	}
	s.m[c] = true
	return true
}

func (s *streamSet) remove(c net.Conn) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.m, c)
}

func (s *streamSet) closeAll() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.closed = true
	for c := range s.m {
		c.Close()
	}
}

// appendStream is a client's end of the append stream.
type appendStream struct {
	conn net.Conn
	wmu  sync.Mutex

	mu      sync.Mutex
	next    uint64
	pending map[uint64]chan streamResponse
	err     error // set once the stream broke; every later call fails
}

// errStreamBroken is an append whose answer never came: the connection
// broke (the daemon retired or died) after the request may have been read.
var errStreamBroken = errors.New("the append stream to the daemon broke before the answer")

// dialAppendStream opens an append stream on a new connection.
func dialAppendStream(ctx context.Context, dial func(context.Context) (net.Conn, error)) (*appendStream, error) {
	conn, err := dial(ctx)
	if err != nil {
		return nil, err
	}
	if d, ok := ctx.Deadline(); ok {
		conn.SetDeadline(d)
	}
	req, err := http.NewRequest(http.MethodPost, base+appendStreamPath, nil)
	if err != nil {
		conn.Close()
		return nil, err
	}
	req.Header.Set("Connection", "Upgrade")
	req.Header.Set("Upgrade", appendStreamProto)
	br := bufio.NewReader(conn)
	err = req.Write(conn)
	var resp *http.Response
	if err == nil {
		resp, err = http.ReadResponse(br, req)
	}
	if err != nil {
		conn.Close()
		return nil, err
	}
	if resp.StatusCode != http.StatusSwitchingProtocols {
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		resp.Body.Close()
		conn.Close()
		text := strings.TrimSpace(string(msg))
		if resp.StatusCode == http.StatusNotFound || resp.StatusCode == http.StatusMethodNotAllowed {
			text = "the daemon has no append stream: it runs an older nexus; stop it and retry"
		}
		return nil, &streamRefused{status: resp.Status, text: text}
	}
	conn.SetDeadline(time.Time{})
	s := &appendStream{conn: conn, pending: map[uint64]chan streamResponse{}}
	go s.readLoop(br)
	return s, nil
}

// streamRefused is a daemon that answered the upgrade with a refusal: a
// different wire version, not a broken connection, so it is not retried.
type streamRefused struct{ status, text string }

func (e *streamRefused) Error() string {
	return fmt.Sprintf("append stream refused (%s): %s", e.status, e.text)
}

func (s *appendStream) readLoop(r *bufio.Reader) {
	for {
		var resp streamResponse
		if err := readFrame(r, &resp); err != nil {
			s.fail(errStreamBroken)
			return
		}
		s.mu.Lock()
		ch := s.pending[resp.ID]
		delete(s.pending, resp.ID)
		s.mu.Unlock()
		if ch != nil {
			ch <- resp
		}
	}
}

// fail ends the stream: every pending call learns it got no answer.
func (s *appendStream) fail(err error) {
	s.conn.Close()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.err == nil {
		s.err = err
	}
	for id, ch := range s.pending {
		delete(s.pending, id)
		close(ch)
	}
}

// call sends one append and waits for its answer. A nil response with
// errStreamBroken is no answer: the append may or may not be stored.
func (s *appendStream) call(ctx context.Context, req *streamRequest) (*streamResponse, error) {
	ch := make(chan streamResponse, 1)
	s.mu.Lock()
	if s.err != nil {
		s.mu.Unlock()
		return nil, s.err
	}
	s.next++
	req.ID = s.next
	s.pending[req.ID] = ch
	s.mu.Unlock()
	s.wmu.Lock()
	err := writeFrame(s.conn, req)
	s.wmu.Unlock()
	if err != nil {
		s.fail(errStreamBroken)
	}
	select {
	case resp, ok := <-ch:
		if !ok {
			return nil, errStreamBroken
		}
		return &resp, nil
	case <-ctx.Done():
		s.mu.Lock()
		delete(s.pending, req.ID)
		s.mu.Unlock()
		return nil, notAwaited{cause: context.Cause(ctx), ctxErr: ctx.Err()}
	}
}

func (s *appendStream) broken() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.err != nil
}

func (s *appendStream) close() { s.fail(net.ErrClosed) }

// result turns an answer into AppendExpect's results.
func (resp *streamResponse) result() ([]uint64, error) {
	switch {
	case resp.Stale != nil:
		return resp.Seqs, &guard.StaleError{Entity: guard.Entity(resp.Stale.Entity), Expected: resp.Stale.Expected, Actual: resp.Stale.Actual, Latest: events.Type(resp.Stale.Latest)}
	case resp.SagaClosed:
		return resp.Seqs, fmt.Errorf("daemon: %w: %s", guard.ErrSagaClosed, resp.Error)
	case resp.Conflict:
		return resp.Seqs, fmt.Errorf("daemon: %w: %s", journal.ErrConflict, resp.Error)
	case resp.Error != "":
		return resp.Seqs, fmt.Errorf("daemon: %s", resp.Error)
	}
	return resp.Seqs, nil
}
