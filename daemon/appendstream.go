package daemon

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/nexus-sandbox/nexus/control/wire"
	"github.com/nexus-sandbox/nexus/events"
	"github.com/nexus-sandbox/nexus/host/journal"
	"github.com/nexus-sandbox/nexus/store"
)

// serveAppendStream upgrades r's connection to an append stream and
// serves it until the client closes it or the daemon stops. Each request
// runs on its own goroutine, so a client's concurrent appends join one
// group; answers are written as they come.
func serveAppendStream(n *store.Store, cl *clients, streams *streamSet, w http.ResponseWriter, r *http.Request) {
	if got := r.Header.Get("Upgrade"); !strings.EqualFold(got, wire.AppendStreamProto) {
		http.Error(w, fmt.Sprintf("append stream: this daemon speaks %s, the client asked for %q: use the nexus binary the daemon runs", wire.AppendStreamProto, got), http.StatusUpgradeRequired)
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
	rw.WriteString("HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: " + wire.AppendStreamProto + "\r\n\r\n")
	if err := rw.Flush(); err != nil {
		return
	}
	var wmu sync.Mutex
	fw := wire.NewFrameWriter()
	answer := func(resp *wire.AppendResponse) {
		wmu.Lock()
		defer wmu.Unlock()
		err := fw.Response(resp)
		if err == nil {
			err = fw.Send(conn)
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
	fr := wire.NewFrameReader(rw.Reader)
	var start func()
	start = func() {
		workers.Add(1)
		idle.Add(1)
		go func() {
			defer workers.Done()
			for {
				readMu.Lock()
				var req *wire.AppendRequest
				err := net.ErrClosed
				if !readErr.Load() {
					req, err = fr.Request()
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

func appendOverStream(ctx context.Context, n *store.Store, req *wire.AppendRequest) *wire.AppendResponse {
	evs := make([]events.Event, 0, len(req.Events))
	for _, data := range req.Events {
		e, err := events.Decode(data)
		if err != nil {
			return wire.Answer(req.ID, nil, err, false)
		}
		evs = append(evs, e)
	}
	seqs, err := n.AppendDecoded(ctx, req.Expect, evs, req.Events)
	return wire.Answer(req.ID, seqs, err, errors.Is(err, journal.ErrConflict))
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
