package control

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
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
	appendStreamProto = "nexus-append/2"
	// maxFrame bounds a frame a peer announces, so a garbled length is an
	// error, not an allocation of gigabytes.
	maxFrame = 64 << 20
)

// errAppendOverHTTP answers a client that still posts appends as JSON: it
// is older than this daemon.
const errAppendOverHTTP = "this nexus daemon takes appends only on its append stream (" + appendStreamProto + "); the command is from an older nexus: use the nexus binary the daemon runs, or stop the daemon"

type streamRequest struct {
	ID     uint64
	Events [][]byte // each event's journal bytes (events.Encode)
	Expect []guard.Expect
}

type streamResponse struct {
	ID         uint64
	Seqs       []uint64
	Error      string
	Conflict   bool
	SagaClosed bool
	Stale      *guard.StaleError
	Held       *guard.HandleHeld
}

// A frame is a 4-byte big-endian length, then one msgpack array: a
// request [id, [event bytes...], [[entity, seq]...]], a response [id,
// [seq...], error, conflict, saga closed, nil or [entity, expected,
// actual, latest type], nil or [handle, holder, sandbox]]. They are written and read field by field, not by
// reflection: on a busy daemon a frame's cost is what the stream saves.

// frameWriter encodes frames onto one connection; the caller serialises.
type frameWriter struct {
	buf bytes.Buffer
	enc *msgpack.Encoder
}

func newFrameWriter() *frameWriter {
	fw := &frameWriter{}
	fw.enc = msgpack.NewEncoder(&fw.buf)
	return fw
}

func (fw *frameWriter) begin() {
	fw.buf.Reset()
	fw.buf.Write([]byte{0, 0, 0, 0})
}

func (fw *frameWriter) send(w io.Writer) error {
	b := fw.buf.Bytes()
	binary.BigEndian.PutUint32(b, uint32(len(b)-4))
	_, err := w.Write(b)
	return err
}

func (fw *frameWriter) request(req *streamRequest) error {
	fw.begin()
	e := fw.enc
	err := errors.Join(e.EncodeArrayLen(3), e.EncodeUint(req.ID), e.EncodeArrayLen(len(req.Events)))
	for _, data := range req.Events {
		err = errors.Join(err, e.EncodeBytes(data))
	}
	err = errors.Join(err, e.EncodeArrayLen(len(req.Expect)))
	for _, x := range req.Expect {
		err = errors.Join(err, e.EncodeArrayLen(2), e.EncodeString(string(x.Entity)), e.EncodeUint(x.Seq))
	}
	return err
}

func (fw *frameWriter) response(resp *streamResponse) error {
	fw.begin()
	e := fw.enc
	err := errors.Join(e.EncodeArrayLen(7), e.EncodeUint(resp.ID), e.EncodeArrayLen(len(resp.Seqs)))
	for _, seq := range resp.Seqs {
		err = errors.Join(err, e.EncodeUint(seq))
	}
	err = errors.Join(err, e.EncodeString(resp.Error), e.EncodeBool(resp.Conflict), e.EncodeBool(resp.SagaClosed))
	if st := resp.Stale; st != nil {
		err = errors.Join(err, e.EncodeArrayLen(4), e.EncodeString(string(st.Entity)), e.EncodeUint(st.Expected), e.EncodeUint(st.Actual), e.EncodeString(string(st.Latest)))
	} else {
		err = errors.Join(err, e.EncodeNil())
	}
	if h := resp.Held; h != nil {
		err = errors.Join(err, e.EncodeArrayLen(3), e.EncodeString(h.Handle), e.EncodeString(h.Holder), e.EncodeString(h.Sandbox))
	} else {
		err = errors.Join(err, e.EncodeNil())
	}
	return err
}

// frameReader decodes frames from one connection, from one goroutine.
type frameReader struct {
	r    io.Reader
	body []byte
	br   bytes.Reader
	dec  *msgpack.Decoder
}

func newFrameReader(r io.Reader) *frameReader {
	fr := &frameReader{r: r}
	fr.dec = msgpack.NewDecoder(&fr.br)
	return fr
}

// next reads the next frame's body; the decoder reads from it.
func (fr *frameReader) next() error {
	var hdr [4]byte
	if _, err := io.ReadFull(fr.r, hdr[:]); err != nil {
		return err
	}
	size := binary.BigEndian.Uint32(hdr[:])
	if size > maxFrame {
		return fmt.Errorf("append stream: frame of %d bytes announced (at most %d)", size, maxFrame)
	}
	if cap(fr.body) < int(size) {
		fr.body = make([]byte, size)
	}
	fr.body = fr.body[:size]
	if _, err := io.ReadFull(fr.r, fr.body); err != nil {
		return fmt.Errorf("append stream: %w", noEOF(err))
	}
	fr.br.Reset(fr.body)
	fr.dec.Reset(&fr.br)
	return nil
}

// arrayLen reads an array header and checks its length is want (any if
// want < 0). A length is bounded by the bytes left in the frame (each
// element takes at least one), so a garbled one allocates nothing.
func (fr *frameReader) arrayLen(what string, want int) (int, error) {
	n, err := fr.dec.DecodeArrayLen()
	if err != nil {
		return 0, fmt.Errorf("append stream: bad frame: %s: %w", what, err)
	}
	if want >= 0 && n != want || n < 0 || n > fr.br.Len() {
		return 0, fmt.Errorf("append stream: bad frame: %s of %d fields", what, n)
	}
	return n, nil
}

// bytes reads a bin or str field, bounded by the bytes left in the frame.
func (fr *frameReader) bytes(what string) ([]byte, error) {
	n, err := fr.dec.DecodeBytesLen()
	if err == nil && (n < 0 || n > fr.br.Len()) {
		err = fmt.Errorf("%d bytes announced, %d left", n, fr.br.Len())
	}
	if err != nil {
		return nil, fmt.Errorf("append stream: bad frame: %s: %w", what, err)
	}
	b := make([]byte, n)
	if err := fr.dec.ReadFull(b); err != nil {
		return nil, fmt.Errorf("append stream: bad frame: %s: %w", what, err)
	}
	return b, nil
}

func (fr *frameReader) string(what string) (string, error) {
	b, err := fr.bytes(what)
	return string(b), err
}

func (fr *frameReader) request() (*streamRequest, error) {
	if err := fr.next(); err != nil {
		return nil, err
	}
	d := fr.dec
	req := &streamRequest{}
	if _, err := fr.arrayLen("request", 3); err != nil {
		return nil, err
	}
	var err error
	if req.ID, err = d.DecodeUint64(); err != nil {
		return nil, fmt.Errorf("append stream: bad frame: id: %w", err)
	}
	n, err := fr.arrayLen("events", -1)
	if err != nil {
		return nil, err
	}
	req.Events = make([][]byte, n)
	for i := range req.Events {
		if req.Events[i], err = fr.bytes("event"); err != nil {
			return nil, err
		}
	}
	if n, err = fr.arrayLen("expectations", -1); err != nil {
		return nil, err
	}
	for i := 0; i < n; i++ {
		if _, err := fr.arrayLen("expectation", 2); err != nil {
			return nil, err
		}
		entity, err := fr.string("expectation")
		if err != nil {
			return nil, err
		}
		seq, err := d.DecodeUint64()
		if err != nil {
			return nil, fmt.Errorf("append stream: bad frame: expectation %d: %w", i, err)
		}
		req.Expect = append(req.Expect, guard.Expect{Entity: guard.Entity(entity), Seq: seq})
	}
	return req, nil
}

func (fr *frameReader) response() (*streamResponse, error) {
	if err := fr.next(); err != nil {
		return nil, err
	}
	d := fr.dec
	resp := &streamResponse{}
	bad := func(what string, err error) (*streamResponse, error) {
		return nil, fmt.Errorf("append stream: bad frame: %s: %w", what, err)
	}
	if _, err := fr.arrayLen("response", 7); err != nil {
		return nil, err
	}
	var err error
	if resp.ID, err = d.DecodeUint64(); err != nil {
		return bad("id", err)
	}
	n, err := fr.arrayLen("seqs", -1)
	if err != nil {
		return nil, err
	}
	for i := 0; i < n; i++ {
		seq, err := d.DecodeUint64()
		if err != nil {
			return bad("seq", err)
		}
		resp.Seqs = append(resp.Seqs, seq)
	}
	if resp.Error, err = fr.string("error"); err != nil {
		return nil, err
	}
	if resp.Conflict, err = d.DecodeBool(); err != nil {
		return bad("conflict", err)
	}
	if resp.SagaClosed, err = d.DecodeBool(); err != nil {
		return bad("saga closed", err)
	}
	if n, err = d.DecodeArrayLen(); err != nil {
		return bad("stale", err)
	}
	if n != -1 { // nil: not a stale refusal
		if n != 4 {
			return bad("stale", fmt.Errorf("%d fields", n))
		}
		st := &guard.StaleError{}
		entity, err := fr.string("stale entity")
		if err == nil {
			st.Entity = guard.Entity(entity)
			st.Expected, err = d.DecodeUint64()
		}
		if err == nil {
			st.Actual, err = d.DecodeUint64()
		}
		var latest string
		if err == nil {
			latest, err = fr.string("stale type")
		}
		if err != nil {
			return bad("stale", err)
		}
		st.Latest = events.Type(latest)
		resp.Stale = st
	}
	if n, err = d.DecodeArrayLen(); err != nil {
		return bad("held", err)
	}
	if n == -1 { // nil: not a taken handle
		return resp, nil
	}
	if n != 3 {
		return bad("held", fmt.Errorf("%d fields", n))
	}
	h := &guard.HandleHeld{}
	if h.Handle, err = fr.string("held handle"); err == nil {
		if h.Holder, err = fr.string("held holder"); err == nil {
			h.Sandbox, err = fr.string("held sandbox")
		}
	}
	if err != nil {
		return bad("held", err)
	}
	resp.Held = h
	return resp, nil
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
	var wmu sync.Mutex
	fw := newFrameWriter()
	answer := func(resp *streamResponse) {
		wmu.Lock()
		defer wmu.Unlock()
		err := fw.response(resp)
		if err == nil {
			err = fw.send(conn)
		}
		if err != nil {
			conn.Close() // the reader sees it and ends the stream
		}
	}
	// Workers take turns reading: the one that read a request serves it
	// itself, and another reads the next meanwhile, so a request reaches
	// the committer without a hand-off from reader to worker (one wake-up
	// less per append), and a client's pipelined requests are still served
	// at once. A worker is started when none is left to read, and workers
	// are kept while the stream lasts, their stacks grown once.
	var (
		readMu  sync.Mutex
		readErr atomic.Bool
		idle    atomic.Int32 // workers not serving a request
		workers sync.WaitGroup
	)
	ctx := r.Context()
	fr := newFrameReader(rw.Reader)
	var start func()
	start = func() {
		workers.Add(1)
		idle.Add(1)
		go func() {
			defer workers.Done()
			for {
				readMu.Lock()
				var req *streamRequest
				err := net.ErrClosed
				if !readErr.Load() {
					req, err = fr.request()
				}
				if err != nil {
					readErr.Store(true)
					readMu.Unlock()
					return
				}
				readMu.Unlock()
				if idle.Add(-1) == 0 {
					start()
				}
				answer(appendOverStream(ctx, n, req))
				idle.Add(1)
			}
		}()
	}
	start()
	// Answers still owed are written before the connection closes: a
	// client that closes its side after its last answer gets every one.
	workers.Wait()
}

func appendOverStream(ctx context.Context, n *node.Node, req *streamRequest) *streamResponse {
	resp := &streamResponse{ID: req.ID}
	evs := make([]events.Event, 0, len(req.Events))
	for _, data := range req.Events {
		e, err := events.Decode(data)
		if err != nil {
			resp.Error = err.Error()
			return resp
		}
		evs = append(evs, e)
	}
	seqs, err := n.AppendDecoded(ctx, req.Expect, evs, req.Events)
	resp.Seqs = seqs
	if err != nil {
		resp.Error = err.Error()
		resp.Conflict = errors.Is(err, journal.ErrConflict)
		resp.SagaClosed = errors.Is(err, guard.ErrSagaClosed)
		errors.As(err, &resp.Stale)
		errors.As(err, &resp.Held)
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
	fw   *frameWriter // under wmu

	// turn is held (full) by the one call reading answers off the stream.
	// A call waiting for its answer takes it when it is free, so the
	// answer is usually read by its own caller, not handed over by a
	// reader goroutine (a wake-up per append).
	turn chan struct{}
	fr   *frameReader // read by the turn's holder only

	mu      sync.Mutex
	next    uint64
	pending map[uint64]chan *streamResponse
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
	return &appendStream{conn: conn, fw: newFrameWriter(), turn: make(chan struct{}, 1), fr: newFrameReader(br),
		pending: map[uint64]chan *streamResponse{}}, nil
}

// streamRefused is a daemon that answered the upgrade with a refusal: a
// different wire version, not a broken connection, so it is not retried.
type streamRefused struct{ status, text string }

func (e *streamRefused) Error() string {
	return fmt.Sprintf("append stream refused (%s): %s", e.status, e.text)
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
	ch := make(chan *streamResponse, 1)
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
	err := s.fw.request(req)
	if err == nil {
		err = s.fw.send(s.conn)
	}
	s.wmu.Unlock()
	if err != nil {
		s.fail(errStreamBroken)
	}
	for {
		select {
		case resp, ok := <-ch:
			if !ok {
				return nil, errStreamBroken
			}
			return resp, nil
		case <-ctx.Done():
			s.mu.Lock()
			delete(s.pending, req.ID)
			s.mu.Unlock()
			return nil, notAwaited{cause: context.Cause(ctx), ctxErr: ctx.Err()}
		case s.turn <- struct{}{}:
			// Only the turn's holder delivers answers: one delivered to
			// us before we took it is in ch already.
			select {
			case resp, ok := <-ch:
				<-s.turn
				if !ok {
					return nil, errStreamBroken
				}
				return resp, nil
			default:
			}
			resp, err := s.readUntil(ctx, req.ID)
			<-s.turn
			return resp, err
		}
	}
}

// readUntil reads answers, handing each to its caller, until the one to
// id. Called with the turn held. A context ended while reading breaks the
// stream: a frame read halfway cannot be resumed.
func (s *appendStream) readUntil(ctx context.Context, id uint64) (*streamResponse, error) {
	stop := context.AfterFunc(ctx, func() { s.conn.SetReadDeadline(time.Now()) })
	defer stop()
	for {
		resp, err := s.fr.response()
		if err != nil {
			s.fail(errStreamBroken)
			if ctx.Err() != nil {
				return nil, notAwaited{cause: context.Cause(ctx), ctxErr: ctx.Err()}
			}
			return nil, errStreamBroken
		}
		s.mu.Lock()
		ch := s.pending[resp.ID]
		delete(s.pending, resp.ID)
		s.mu.Unlock()
		if resp.ID == id {
			return resp, nil
		}
		if ch != nil {
			ch <- resp
		}
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
		return resp.Seqs, resp.Stale
	case resp.Held != nil:
		return resp.Seqs, resp.Held
	case resp.SagaClosed:
		return resp.Seqs, fmt.Errorf("daemon: %w: %s", guard.ErrSagaClosed, resp.Error)
	case resp.Conflict:
		return resp.Seqs, fmt.Errorf("daemon: %w: %s", journal.ErrConflict, resp.Error)
	case resp.Error != "":
		return resp.Seqs, fmt.Errorf("daemon: %s", resp.Error)
	}
	return resp.Seqs, nil
}
