package wire

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"

	"github.com/vmihailenco/msgpack/v5"

	"github.com/nexus-sandbox/nexus/core"
	"github.com/nexus-sandbox/nexus/events"
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
	AppendStreamProto = "nexus-append/2"
	// maxFrame bounds a frame a peer announces, so a garbled length is an
	// error, not an allocation of gigabytes.
	maxFrame = 64 << 20
)

// AppendOverHTTPRefusal answers a client that still posts appends as
// JSON: it is older than the daemon.
const AppendOverHTTPRefusal = "this nexus daemon takes appends only on its append stream (" + AppendStreamProto + "); the command is from an older nexus: use the nexus binary the daemon runs, or stop the daemon"

// AppendRequest is one append: its events and the expectations it was
// decided on. ID is the client's, unique on its stream.
type AppendRequest struct {
	ID     uint64
	Events [][]byte // each event's journal bytes (events.Encode)
	Expect []core.Expect
}

// AppendResponse answers the request of the same ID: the sequences
// stored, or the refusal, with what callers branch on kept typed.
type AppendResponse struct {
	ID         uint64
	Seqs       []uint64
	Error      string
	Conflict   bool
	SagaClosed bool
	Stale      *core.StaleError
	Held       *core.HandleHeld
}

// A frame is a 4-byte big-endian length, then one msgpack array: a
// request [id, [event bytes...], [[entity, seq]...]], a response [id,
// [seq...], error, conflict, saga closed, nil or [entity, expected,
// actual, latest type], nil or [handle, holder, sandbox]]. They are
// written and read field by field, not by reflection: on a busy daemon a frame's cost is what the stream saves.

// FrameWriter encodes frames onto one connection; the caller serialises.
type FrameWriter struct {
	buf bytes.Buffer
	enc *msgpack.Encoder
}

// NewFrameWriter returns a writer with an empty frame.
func NewFrameWriter() *FrameWriter {
	fw := &FrameWriter{}
	fw.enc = msgpack.NewEncoder(&fw.buf)
	return fw
}

func (fw *FrameWriter) begin() {
	fw.buf.Reset()
	fw.buf.Write([]byte{0, 0, 0, 0})
}

// Send writes the frame last encoded to w.
func (fw *FrameWriter) Send(w io.Writer) error {
	b := fw.buf.Bytes()
	binary.BigEndian.PutUint32(b, uint32(len(b)-4))
	_, err := w.Write(b)
	return err
}

// Request encodes req as the next frame.
func (fw *FrameWriter) Request(req *AppendRequest) error {
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

// Response encodes resp as the next frame.
func (fw *FrameWriter) Response(resp *AppendResponse) error {
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

// FrameReader decodes frames from one connection, from one goroutine.
type FrameReader struct {
	r    io.Reader
	body []byte
	br   bytes.Reader
	dec  *msgpack.Decoder
}

// NewFrameReader reads frames from r.
func NewFrameReader(r io.Reader) *FrameReader {
	fr := &FrameReader{r: r}
	fr.dec = msgpack.NewDecoder(&fr.br)
	return fr
}

// next reads the next frame's body; the decoder reads from it.
func (fr *FrameReader) next() error {
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
func (fr *FrameReader) arrayLen(what string, want int) (int, error) {
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
func (fr *FrameReader) bytes(what string) ([]byte, error) {
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

func (fr *FrameReader) string(what string) (string, error) {
	b, err := fr.bytes(what)
	return string(b), err
}

// Request reads the next frame as a request.
func (fr *FrameReader) Request() (*AppendRequest, error) {
	if err := fr.next(); err != nil {
		return nil, err
	}
	d := fr.dec
	req := &AppendRequest{}
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
		req.Expect = append(req.Expect, core.Expect{Entity: core.Entity(entity), Seq: seq})
	}
	return req, nil
}

// Response reads the next frame as a response.
func (fr *FrameReader) Response() (*AppendResponse, error) {
	if err := fr.next(); err != nil {
		return nil, err
	}
	d := fr.dec
	resp := &AppendResponse{}
	bad := func(what string, err error) (*AppendResponse, error) {
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
		st := &core.StaleError{}
		entity, err := fr.string("stale entity")
		if err == nil {
			st.Entity = core.Entity(entity)
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
	h := &core.HandleHeld{}
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

// ErrConflict is the journal's refusal of an append whose expected last
// sequence lost a race, as the client sees it; the daemon marks an error
// that is the journal's own (Answer's conflict).
var ErrConflict = errors.New("journal moved on: expected last sequence does not match")

// Answer is the response to request id, whose append returned seqs, err;
// conflict says err is the journal's ErrConflict, which this package, on
// the client's side of the socket, does not link.
func Answer(id uint64, seqs []uint64, err error, conflict bool) *AppendResponse {
	resp := &AppendResponse{ID: id, Seqs: seqs}
	if err != nil {
		resp.Error = err.Error()
		resp.Conflict = conflict || errors.Is(err, ErrConflict)
		resp.SagaClosed = errors.Is(err, core.ErrSagaClosed)
		errors.As(err, &resp.Stale)
		errors.As(err, &resp.Held)
	}
	return resp
}

// Result turns an answer back into the error the daemon's append
// returned, as far as callers branch on it: a stale expectation, a closed
// saga, a journal conflict.
func (resp *AppendResponse) Result() ([]uint64, error) {
	switch {
	case resp.Stale != nil:
		return resp.Seqs, resp.Stale
	case resp.Held != nil:
		return resp.Seqs, resp.Held
	case resp.SagaClosed:
		return resp.Seqs, fmt.Errorf("daemon: %w: %s", core.ErrSagaClosed, resp.Error)
	case resp.Conflict:
		return resp.Seqs, fmt.Errorf("daemon: %w: %s", ErrConflict, resp.Error)
	case resp.Error != "":
		return resp.Seqs, fmt.Errorf("daemon: %s", resp.Error)
	}
	return resp.Seqs, nil
}
