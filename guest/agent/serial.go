package agent

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"io"
	"os"
	"sync"
	"time"

	"github.com/nexus-sandbox/nexus/agentproto"
)

// ServeSerial serves sessions one after another on a stream that has no
// connections (a virtio-serial port), held open for the agent's life.
//
// Closing and reopening the port between sessions is what made sessions
// unreliable: the guest discards what the host already sent when it
// closes, a reopen races the host's next connection, and a write while
// no host is attached blocks until the next host comes and then reaches
// it. Instead the port stays open, and a session ends on either of two
// boundaries the guest can see: end-of-file (the port reads it while no
// host is attached) or a reset frame (agentproto.TReset), which the
// host side sends when one of its sessions ends or starts. A reset ends
// the session in progress (its processes are killed, its writes
// abandoned, as when a connection closes), and after its last frame the
// agent echoes the reset, nonce and all; the host drops everything it
// reads before the echo. A frame that does not decode (the stream cut
// inside a frame) ends the session too, and the agent then skips bytes
// until a reset's beginning, so the stream is never misaligned for good.
//
// idle is the pause between reads while no host is attached.
func (a *Agent) ServeSerial(ctx context.Context, port io.ReadWriter, idle time.Duration) error {
	out := &portWriter{w: port}
	br := bufio.NewReaderSize(port, 64<<10)
	var cur *serialSession
	end := func() {
		if cur != nil {
			cur.end()
			cur = nil
		}
	}
	defer end()
	resync := false
	for ctx.Err() == nil {
		var frame []byte
		var err error
		if resync {
			frame, err = skipToReset(br)
		} else {
			frame, err = agentproto.ReadRawFrame(br)
		}
		if err == io.EOF {
			// No host attached (or none yet): whatever session there was
			// has lost its host.
			end()
			sleep(ctx, idle)
			continue
		}
		if err != nil && !errors.Is(err, agentproto.ErrProtocol) && !errors.Is(err, io.ErrUnexpectedEOF) {
			return err
		}
		var m *agentproto.Message
		if err == nil {
			m, err = agentproto.Decode(frame[4:])
			if errors.Is(err, agentproto.ErrUnknownType) {
				err = nil // the session answers it
			}
		}
		if err != nil {
			a.cfg.Log.Printf("serial: %v; skipping to the next reset", err)
			end()
			resync = true
			continue
		}
		resync = false
		if m.Type == agentproto.TReset {
			end()
			out.frame(&agentproto.Message{Type: agentproto.TReset, ID: m.ID, Nonce: m.Nonce})
			continue
		}
		if cur == nil {
			cur = a.startSerialSession(out)
		}
		if _, err := cur.in.Write(frame); err != nil {
			// The session ended on its own (a protocol error): the
			// next frame starts another.
			end()
		}
	}
	return nil
}

func sleep(ctx context.Context, d time.Duration) {
	select {
	case <-ctx.Done():
	case <-time.After(d):
	}
}

// resetPrefix is how every encoded reset's body begins: a map of its
// three fields whose first is the type.
var resetPrefix = func() []byte {
	b, err := agentproto.Encode(&agentproto.Message{Type: agentproto.TReset, ID: 1, Nonce: 1})
	if err != nil {
		panic(err)
	}
	return b[4 : 4+1+5+6] // map header, "type", "reset"
}()

// skipToReset reads bytes until a reset frame, and returns it.
func skipToReset(br *bufio.Reader) ([]byte, error) {
	var win []byte
	for {
		c, err := br.ReadByte()
		if err != nil {
			return nil, err
		}
		win = append(win, c)
		if len(win) > 4+len(resetPrefix) {
			win = win[1:]
		}
		if len(win) < 4+len(resetPrefix) || !bytes.Equal(win[4:], resetPrefix) {
			continue
		}
		n := binary.BigEndian.Uint32(win)
		if n < uint32(len(resetPrefix)) || n > 64 {
			continue
		}
		frame := make([]byte, 4+n)
		copy(frame, win)
		if _, err := io.ReadFull(br, frame[len(win):]); err != nil {
			return nil, err
		}
		if m, err := agentproto.Decode(frame[4:]); err == nil && m.Type == agentproto.TReset {
			return frame, nil
		}
		win = win[:0]
	}
}

// portWriter is the port's write side, shared by every session and the
// reset echoes: one frame at a time, whole.
type portWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (p *portWriter) frame(m *agentproto.Message) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return agentproto.Write(p.w, m)
}

// serialSession is one session on the port: its frames in through a
// pipe, its answers out through a gate that closes when it ends, so no
// frame of it can follow the reset's echo.
type serialSession struct {
	in   *io.PipeWriter
	gate *gate
}

func (a *Agent) startSerialSession(out *portWriter) *serialSession {
	pr, pw := io.Pipe()
	g := &gate{out: out}
	go func() {
		if err := a.Serve(&sessionStream{r: pr, g: g}); err != nil {
			a.cfg.Log.Printf("serial session: %v", err)
		}
	}()
	return &serialSession{in: pw, gate: g}
}

// end closes the session's input (it ends as on a closed connection) and
// its gate; it does not wait for the session's processes to be reaped.
func (s *serialSession) end() {
	s.in.Close()
	s.gate.close()
}

type gate struct {
	out    *portWriter
	closed bool // under out.mu
}

func (g *gate) Write(p []byte) (int, error) {
	g.out.mu.Lock()
	defer g.out.mu.Unlock()
	if g.closed {
		return 0, os.ErrClosed
	}
	return g.out.w.Write(p)
}

func (g *gate) close() {
	g.out.mu.Lock()
	g.closed = true
	g.out.mu.Unlock()
}

type sessionStream struct {
	r *io.PipeReader
	g *gate
}

func (s *sessionStream) Read(p []byte) (int, error)  { return s.r.Read(p) }
func (s *sessionStream) Write(p []byte) (int, error) { return s.g.Write(p) }
func (s *sessionStream) Close() error {
	s.r.Close()
	s.g.close()
	return nil
}
