package control

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/nexus-sandbox/nexus/control/wire"
)

// appendStream is a client's end of the append stream.
type appendStream struct {
	conn net.Conn
	wmu  sync.Mutex
	fw   *wire.FrameWriter // under wmu

	// turn is held (full) by the one call reading answers off the stream.
	// A call waiting for its answer takes it when it is free, so the
	// answer is usually read by its own caller, not handed over by a
	// reader goroutine (a wake-up per append).
	turn chan struct{}
	fr   *wire.FrameReader // read by the turn's holder only

	mu      sync.Mutex
	next    uint64
	pending map[uint64]chan *wire.AppendResponse
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
	req, err := http.NewRequest(http.MethodPost, base+wire.PathAppendStream, nil)
	if err != nil {
		conn.Close()
		return nil, err
	}
	req.Header.Set("Connection", "Upgrade")
	req.Header.Set("Upgrade", wire.AppendStreamProto)
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
		if err := openFailed(resp, msg); err != nil {
			return nil, err
		}
		text := strings.TrimSpace(string(msg))
		if resp.StatusCode == http.StatusNotFound || resp.StatusCode == http.StatusMethodNotAllowed {
			text = "the daemon has no append stream: it runs an older nexus; stop it and retry"
		}
		return nil, &streamRefused{status: resp.Status, text: text}
	}
	conn.SetDeadline(time.Time{})
	return &appendStream{conn: conn, fw: wire.NewFrameWriter(), turn: make(chan struct{}, 1), fr: wire.NewFrameReader(br),
		pending: map[uint64]chan *wire.AppendResponse{}}, nil
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
func (s *appendStream) call(ctx context.Context, req *wire.AppendRequest) (*wire.AppendResponse, error) {
	ch := make(chan *wire.AppendResponse, 1)
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
	err := s.fw.Request(req)
	if err == nil {
		err = s.fw.Send(s.conn)
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
func (s *appendStream) readUntil(ctx context.Context, id uint64) (*wire.AppendResponse, error) {
	stop := context.AfterFunc(ctx, func() { s.conn.SetReadDeadline(time.Now()) })
	defer stop()
	for {
		resp, err := s.fr.Response()
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
