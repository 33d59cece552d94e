// Package agentproto is the guest agent's wire protocol (docs/guest-agent.md):
// length-prefixed MessagePack frames, the message types both ends send, and
// the disk serials both ends agree on. It does no I/O of its own beyond the
// reader or writer it is handed.
package agentproto

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"

	"github.com/vmihailenco/msgpack/v5"
)

// Version is the newest protocol version this build speaks.
const Version = 1

// Port is the guest vsock port the agent listens on.
const Port = 1024

// CmdlineVsockOnly, on the guest kernel's command line, tells the agent
// that the VMM gives it a vsock device and no virtio-serial port (Cloud
// Hypervisor), so it serves vsock at once instead of waiting for a port
// that never comes (QEMU's adapter gives one).
const CmdlineVsockOnly = "nexus.agent=vsock"

// MaxData bounds the bytes one data-carrying frame holds; MaxFrame is the
// largest frame either end accepts (MaxData plus room for the other fields),
// refused before its body is read.
const (
	MaxData  = 1 << 20
	MaxFrame = MaxData + 4<<10
)

// Message types.
const (
	// Requests (host → agent).
	THello  = "hello"
	TPing   = "ping"
	TFreeze = "freeze"
	TThaw   = "thaw"
	TFlush  = "flush"
	TExec   = "exec"
	TSignal = "signal"
	TRead   = "read"
	TWrite  = "write"
	// TReset is a transport frame, not a session request: on a stream
	// without connections (a virtio-serial port) it ends the session in
	// progress and starts a fresh one; the agent echoes it, nonce and
	// all, after the last frame of the old session.
	TReset = "reset"
	// Stream frames (both ways) and answers (agent → host).
	TData   = "data"
	TStdout = "stdout"
	TStderr = "stderr"
	TExit   = "exit"
	TOK     = "ok"
	TError  = "error"
)

// Message is every frame's body. Fields a type does not use stay zero and
// are left out on the wire.
type Message struct {
	Type string `msgpack:"type"`
	ID   uint32 `msgpack:"id"`

	Version    int      `msgpack:"version,omitempty"`     // hello
	Agent      string   `msgpack:"agent,omitempty"`       // hello answer
	DeadlineMs int64    `msgpack:"deadline_ms,omitempty"` // freeze, flush
	Paths      []string `msgpack:"paths,omitempty"`       // freeze, thaw, flush answers

	Argv  []string `msgpack:"argv,omitempty"`  // exec
	Env   []string `msgpack:"env,omitempty"`   // exec
	Cwd   string   `msgpack:"cwd,omitempty"`   // exec
	Stdin bool     `msgpack:"stdin,omitempty"` // exec: data frames follow
	TTY   bool     `msgpack:"tty,omitempty"`   // exec: on a terminal (output on stdout only)

	Ref    uint32 `msgpack:"ref,omitempty"`    // signal, data: the request they belong to
	Signal int    `msgpack:"signal,omitempty"` // signal; exit when killed
	Code   int    `msgpack:"code,omitempty"`   // exit
	Data   Bytes  `msgpack:"data,omitempty"`   // data, stdout, stderr
	EOF    bool   `msgpack:"eof,omitempty"`    // data

	Path string `msgpack:"path,omitempty"` // read, write
	Mode uint32 `msgpack:"mode,omitempty"` // write
	Size int64  `msgpack:"size,omitempty"` // read, write answers

	Error string `msgpack:"error,omitempty"` // error

	Nonce uint64 `msgpack:"nonce,omitempty"` // reset and its echo
}

// Bytes is a frame's payload. It decodes bounded by MaxData before it
// allocates: a length in a bin header is the peer's claim, and msgpack
// allocates whatever the header says (up to 4 GiB) before it finds the
// frame shorter.
type Bytes []byte

// DecodeMsgpack implements msgpack.CustomDecoder.
func (b *Bytes) DecodeMsgpack(d *msgpack.Decoder) error {
	n, err := d.DecodeBytesLen()
	if err != nil {
		return err
	}
	if n < 0 {
		*b = nil
		return nil
	}
	if n > MaxData {
		return protoErr("data of %d bytes, more than %d", n, MaxData)
	}
	var buf []byte
	if n > pooledData {
		buf = (*dataBufs.Get().(*[]byte))[:n]
	} else {
		buf = make([]byte, n)
	}
	if err := d.ReadFull(buf); err != nil {
		ReleaseData(buf)
		return err
	}
	*b = buf
	return nil
}

// pooledData is the size above which a frame's data is read into a
// recycled buffer of MaxData: a receiver with a small heap (the agent,
// the stand-in guest's VMM) that allocated 1 MiB per frame ran the
// collector every few frames, which made a cp into the guest 1.6-1.8x
// cat; with the buffers recycled (or the collector held off) it was
// 1.0-1.2x.
const pooledData = 64 << 10

var dataBufs = sync.Pool{New: func() any {
	b := make([]byte, MaxData)
	return &b
}}

// ReleaseData hands back a decoded message's data for the next frame to
// be read into, once the caller is done with it (written it on: an
// io.Writer keeps no reference). Nothing may use b afterwards. Data that
// did not come from a recycled buffer is left to the collector.
func ReleaseData(b []byte) {
	if cap(b) != MaxData {
		return
	}
	b = b[:cap(b)]
	dataBufs.Put(&b)
}

// ErrProtocol marks a frame or message the protocol does not allow; a
// session that reads one ends.
var ErrProtocol = errors.New("agent protocol")

// ErrUnknownType marks a well-formed frame of a type this build does not
// know (a newer peer's request): Read returns the message with it, and the
// agent answers it with an error instead of ending the session.
var ErrUnknownType = errors.New("unknown message type")

func protoErr(format string, a ...any) error {
	return fmt.Errorf("%w: %s", ErrProtocol, fmt.Sprintf(format, a...))
}

// Validate refuses a message whose type is unknown or whose required
// fields are missing or out of range.
func (m *Message) Validate() error {
	if m.ID == 0 {
		return protoErr("%s without an id", m.Type)
	}
	if m.Type == "" {
		return protoErr("message without a type")
	}
	if len(m.Data) > MaxData {
		return protoErr("%s carries %d bytes, more than %d", m.Type, len(m.Data), MaxData)
	}
	switch m.Type {
	case THello:
		if m.Version < 1 {
			return protoErr("hello without a version")
		}
	case TPing, TThaw, TOK, TStdout, TStderr, TExit:
	case TFreeze, TFlush:
		if m.DeadlineMs < 0 {
			return protoErr("%s with a negative deadline", m.Type)
		}
	case TExec:
		if len(m.Argv) == 0 || m.Argv[0] == "" {
			return protoErr("exec without argv")
		}
	case TSignal:
		if m.Ref == 0 || m.Signal <= 0 {
			return protoErr("signal needs ref and a positive signal")
		}
	case TData:
		if m.Ref == 0 {
			return protoErr("data without ref")
		}
	case TRead, TWrite:
		if m.Path == "" {
			return protoErr("%s without a path", m.Type)
		}
		if m.Mode > 0o7777 {
			return protoErr("%s mode %o is not permission bits", m.Type, m.Mode)
		}
	case TReset:
		if m.Nonce == 0 {
			return protoErr("reset without a nonce")
		}
	case TError:
		if m.Error == "" {
			return protoErr("error without a reason")
		}
	default:
		return fmt.Errorf("%w %q", ErrUnknownType, m.Type)
	}
	return nil
}

// Encode returns m as one frame: its length, then its MessagePack body.
func Encode(m *Message) ([]byte, error) {
	b, err := appendFrame(nil, m)
	if err != nil {
		return nil, err
	}
	return b, nil
}

// appendFrame appends m's frame to dst. A frame carrying data is sized
// before encoding so its payload is copied once, not regrown.
func appendFrame(dst []byte, m *Message) ([]byte, error) {
	if err := m.Validate(); err != nil {
		return dst, err
	}
	start := len(dst)
	b := bytes.NewBuffer(dst)
	b.Grow(4 + len(m.Data) + 512)
	b.Write([]byte{0, 0, 0, 0})
	enc := msgpack.NewEncoder(b)
	enc.UseCompactInts(true)
	if err := enc.Encode(m); err != nil {
		return dst, err
	}
	out := b.Bytes()
	n := len(out) - start - 4
	if n > MaxFrame {
		return dst, protoErr("frame of %d bytes, more than %d", n, MaxFrame)
	}
	binary.BigEndian.PutUint32(out[start:], uint32(n))
	return out, nil
}

// Write sends m as one frame. Concurrent writers must serialise calls. A
// stream that carries many frames keeps a FrameWriter instead.
func Write(w io.Writer, m *Message) error {
	return (&FrameWriter{w: w}).Write(m)
}

// Read reads one frame and decodes it. io.EOF means the stream ended
// between frames; a stream that ends inside one is io.ErrUnexpectedEOF. A
// frame of an unknown type comes back with ErrUnknownType and the message
// (its id), so it can be answered. A stream that carries many frames keeps
// a FrameReader instead.
func Read(r io.Reader) (*Message, error) {
	return NewFrameReader(r).Read()
}

// FrameWriter writes frames to one stream through one buffer, reused, and
// writes a frame's data from the caller's slice instead of copying it into
// the frame: a cp is a hundred frames of MaxData per 100 MiB, and
// allocating, zeroing and filling a growing buffer for each was most of
// its CPU. Not safe for concurrent use.
type FrameWriter struct {
	w   io.Writer
	buf []byte
}

// NewFrameWriter writes frames to w.
func NewFrameWriter(w io.Writer) *FrameWriter { return &FrameWriter{w: w} }

// inlineData is the most data a frame copies into its buffer; more is
// written from where it is (writev on a socket).
const inlineData = 16 << 10

// Write sends m as one frame, in one call of the writer's Write, which
// callers rely on (a writer that interleaves frames from several sessions
// keeps each whole). On a socket the frame is one writev of the encoded
// fields and the data instead: the socket's write lock keeps it whole
// against every other writer of the connection.
func (fw *FrameWriter) Write(m *Message) error {
	if len(m.Data) > inlineData && isSocket(fw.w) {
		if err := m.Validate(); err != nil {
			return err
		}
		rest := *m
		rest.Data = nil
		b, err := appendFrame(fw.buf[:0], &rest)
		fw.buf = b[:0]
		if err != nil {
			return err
		}
		if b, ok := appendDataField(b, len(m.Data)); ok {
			fw.buf = b[:0]
			bufs := net.Buffers{b, m.Data}
			_, err := bufs.WriteTo(fw.w)
			return err
		}
	}
	b, err := appendFrame(fw.buf[:0], m)
	fw.buf = b[:0]
	if err != nil {
		return err
	}
	_, err = fw.w.Write(b)
	return err
}

// isSocket says whether net.Buffers writes to w with one writev under
// the connection's write lock.
func isSocket(w io.Writer) bool {
	switch w.(type) {
	case *net.UnixConn, *net.TCPConn:
		return true
	}
	return false
}

// appendDataField turns frame, a message encoded without data, into the
// head of the same message with n bytes of data following it: one more
// entry in its map, the key "data" and a bin 32 header. The map is the
// same message either way (MessagePack maps are unordered, and the decoder
// reads by key). ok is false for a map header this does not patch.
func appendDataField(frame []byte, n int) ([]byte, bool) {
	switch c := frame[4]; {
	case c >= 0x80 && c < 0x8f: // fixmap of fewer than 15 entries
		frame[4]++
	case c == 0xde && binary.BigEndian.Uint16(frame[5:]) < 0xffff: // map 16
		binary.BigEndian.PutUint16(frame[5:], binary.BigEndian.Uint16(frame[5:])+1)
	default:
		return frame, false
	}
	frame = append(frame, 0xa4, 'd', 'a', 't', 'a', 0xc6, 0, 0, 0, 0)
	binary.BigEndian.PutUint32(frame[len(frame)-4:], uint32(n))
	size := len(frame) - 4 + n
	if size > MaxFrame {
		return frame, false
	}
	binary.BigEndian.PutUint32(frame, uint32(size))
	return frame, true
}

// FrameReader reads frames from one stream, decoding each straight from
// the stream: a frame's data is read once, into the slice the message
// keeps, with no frame buffer in between. The messages it returns own
// their fields. Not safe for concurrent use.
type FrameReader struct {
	r   io.Reader
	lr  io.LimitedReader // the current frame's body
	br  *bufio.Reader
	dec *msgpack.Decoder
}

// NewFrameReader reads frames from r.
func NewFrameReader(r io.Reader) *FrameReader {
	fr := &FrameReader{r: r}
	fr.lr.R = r
	fr.br = bufio.NewReaderSize(&fr.lr, 4<<10)
	fr.dec = msgpack.NewDecoder(fr.br)
	return fr
}

// Read reads one frame and decodes it; see the package-level Read.
func (fr *FrameReader) Read() (*Message, error) {
	var hdr [4]byte
	if _, err := io.ReadFull(fr.r, hdr[:]); err != nil {
		return nil, err
	}
	n := binary.BigEndian.Uint32(hdr[:])
	if n > MaxFrame {
		return nil, protoErr("frame of %d bytes, more than %d", n, MaxFrame)
	}
	fr.lr.N = int64(n)
	fr.br.Reset(&fr.lr)
	fr.dec.Reset(fr.br)
	m, err := decodeFrom(fr.dec)
	if err == nil || errors.Is(err, ErrUnknownType) {
		// The body's end is the frame's: a stream that ended before it
		// is a frame cut short.
		if fr.lr.N > 0 || fr.br.Buffered() > 0 {
			return nil, io.ErrUnexpectedEOF
		}
		return m, err
	}
	// Whether the body was bad or the stream ended inside it.
	if _, cerr := io.Copy(io.Discard, fr.br); cerr != nil {
		return nil, cerr
	}
	if fr.lr.N > 0 {
		return nil, io.ErrUnexpectedEOF
	}
	return nil, err
}

// Decode decodes and validates one frame's body; see Read for
// ErrUnknownType.
func Decode(body []byte) (*Message, error) {
	return decodeFrom(msgpack.NewDecoder(bytes.NewReader(body)))
}

// decodeFrom decodes one message from d, which must hold exactly one.
func decodeFrom(d *msgpack.Decoder) (*Message, error) {
	var m Message
	if err := d.Decode(&m); err != nil {
		return nil, protoErr("decode: %v", err)
	}
	// One frame is one message: trailing bytes mean the peer and we
	// disagree about framing, which no later frame can recover from.
	if _, err := d.PeekCode(); err != io.EOF {
		return nil, protoErr("trailing bytes after the message")
	}
	if err := m.Validate(); err != nil {
		if errors.Is(err, ErrUnknownType) {
			return &m, err
		}
		return nil, err
	}
	return &m, nil
}

// Errorf builds an error answer to request id.
func Errorf(id uint32, format string, a ...any) *Message {
	return &Message{Type: TError, ID: id, Error: fmt.Sprintf(format, a...)}
}

// Disk serial prefixes; docs/guest-agent.md.
const (
	SerialOS        = "nexus-os"
	SerialWorkspace = "nexus-workspace"
	SerialShadow    = "nexus-shadow-"
	SerialVolume    = "nexus-vol-"
	// SerialBytes is what a virtio-blk serial can hold (VIRTIO_BLK_ID_BYTES).
	SerialBytes = 20
)

// CmdlineRootOverlay on the guest kernel's command line tells the agent as
// PID 1 that the OS disk (SerialOS) is shared and read-only: it mounts
// the guest's root as an overlay over it, upper layer on the workspace
// disk (docs/guest-agent.md).
const CmdlineRootOverlay = "nexus.root=overlay"

// DiskSerial is the serial of a named disk (prefix SerialShadow or
// SerialVolume). One that fits in SerialBytes-1 bytes is the prefix and the
// name; a longer one is the prefix and the SHA-256 of the name in hex, cut to
// exactly SerialBytes, so the two forms never collide.
func DiskSerial(prefix, name string) string {
	s := prefix + name
	if len(s) < SerialBytes {
		return s
	}
	sum := sha256.Sum256([]byte(name))
	return (prefix + hex.EncodeToString(sum[:]))[:SerialBytes]
}

// ReadRawFrame reads one whole frame from r as bytes, its length prefix
// included, without decoding it: for the relays that pass frames on and
// need only their boundaries. A length above MaxFrame is ErrProtocol; a
// frame cut short is io.ErrUnexpectedEOF, and io.EOF only between frames.
func ReadRawFrame(r io.Reader) ([]byte, error) {
	var hdr [4]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		return nil, err
	}
	n := binary.BigEndian.Uint32(hdr[:])
	if n > MaxFrame {
		return nil, fmt.Errorf("%w: frame of %d bytes", ErrProtocol, n)
	}
	frame := make([]byte, 4+n)
	copy(frame, hdr[:])
	if _, err := io.ReadFull(r, frame[4:]); err != nil {
		if err == io.EOF {
			err = io.ErrUnexpectedEOF
		}
		return nil, err
	}
	return frame, nil
}
