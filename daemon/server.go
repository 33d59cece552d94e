package daemon

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nexus-sandbox/nexus/control"
	"github.com/nexus-sandbox/nexus/control/local"
	"github.com/nexus-sandbox/nexus/control/wire"
	"github.com/nexus-sandbox/nexus/core"
	"github.com/nexus-sandbox/nexus/host/fleet"
	"github.com/nexus-sandbox/nexus/host/fsx"
	"github.com/nexus-sandbox/nexus/host/unixsock"
	"github.com/nexus-sandbox/nexus/projections"
	"github.com/nexus-sandbox/nexus/store"
)

// buildRef is this process's build for a Status: nil if it cannot be
// known.
func buildRef() *wire.Build {
	b, err := control.SelfBuild()
	if err != nil {
		return nil
	}
	return &b
}

// Serve answers control requests for n on <root>/nexus.sock (mode 0600)
// until ctx is done. The caller owns n's journal lock, so any socket file
// already there is a dead daemon's and is replaced.
func Serve(ctx context.Context, n *store.Store) error {
	return serve(ctx, n, serveOptions{})
}

type serveOptions struct {
	// idle > 0: stop once no client has been connected for this long.
	idle time.Duration
	// auto: started on demand (reported in Status; may be retired).
	auto bool
	// mirror is the journal's fleet mirror (nil: none).
	mirror *fleet.Mirror
	// log says why serving ended (nil: not said).
	log *slog.Logger
	// metrics are served at wire.PathMetrics (nil: not served).
	metrics *metrics
	// opening, if set, is the journal's open behind a store that opened
	// early: until it is done only earlyPaths answer.
	opening *opening
}

// earlyPaths answer while the journal opens behind a store that was left
// current with it (store.Options.Early): who the daemon is, how to stop
// it, and the reads of the sandbox store alone. Everything else (appends,
// events, sagas, rev, owners, volumes) waits for the journal.
var earlyPaths = map[string]bool{
	"GET " + wire.PathIdentity: true, "GET " + wire.PathStatus: true, "GET " + wire.PathStats: true,
	"POST " + wire.PathRetire: true, "POST " + wire.PathStop: true,
	"GET " + wire.PathSandboxes: true, "GET " + wire.PathListJSON: true, "GET " + wire.PathSandbox: true,
	"GET " + wire.PathNamed: true, "GET " + wire.PathSnapshotOwner: true, "GET " + wire.PathSnapshotsNamed: true,
}

// opening is the journal's open behind the early reads. It ends opened
// (ready: the journal is open and the sagas a dead runner left are
// finished) or failed (err): a daemon whose open failed has nothing to
// serve, and it answers every request, those waiting and those still to
// come, with the open's error, the one a command opening the root itself
// fails with, so no command loses its connection without an answer.
type opening struct {
	ready  chan struct{}
	failed chan struct{}
	err    error // set before failed is closed
}

func newOpening() *opening {
	return &opening{ready: make(chan struct{}), failed: make(chan struct{})}
}

func (op *opening) opened() { close(op.ready) }

func (op *opening) fail(err error) {
	op.err = err
	close(op.failed)
}

// isOpen says whether the journal is open (nil: opened before serving).
func (op *opening) isOpen() bool {
	if op == nil {
		return true
	}
	select {
	case <-op.ready:
		return true
	default:
		return false
	}
}

// failure is the open's error once it failed, else nil.
func (op *opening) failure() error {
	if op == nil {
		return nil
	}
	select {
	case <-op.failed:
		return op.err
	default:
		return nil
	}
}

// failedC is closed if the open fails (nil: never).
func (op *opening) failedC() <-chan struct{} {
	if op == nil {
		return nil
	}
	return op.failed
}

// gated holds every request but earlyPaths' until the journal is open,
// and answers every request with the open's error once it failed.
func gated(h http.Handler, op *opening) http.Handler {
	if op == nil {
		return h
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !earlyPaths[r.Method+" "+r.URL.Path] {
			select {
			case <-op.ready:
			case <-op.failed:
			case <-r.Context().Done():
				return
			}
		}
		if err := op.failure(); err != nil {
			w.Header().Set(wire.OpenFailedHeader, "1")
			writeJSON(w, http.StatusServiceUnavailable, wire.ErrorAnswer{Error: err.Error()})
			return
		}
		h.ServeHTTP(w, r)
	})
}

// failedOpenGrace bounds how long a daemon whose open failed, accepting no
// more, waits for the commands still connected to ask and be told: a
// command keeps its connection between its requests.
const failedOpenGrace = 10 * time.Second

// clients counts the open connections. A command keeps its connection for
// its whole run (between requests too, as HTTP keep-alive), and a follower
// holds one while it follows, so "no connection" is "no client".
type clients struct {
	mu       sync.Mutex
	open     int
	since    time.Time // when open last fell to 0
	stopping bool      // finishing: idle (accepting stopped) or retiring
	retiring bool      // still accepting, for the clients it has
	none     chan struct{}
	noneDone bool // none is closed
}

func (cl *clients) track(_ net.Conn, st http.ConnState) {
	switch st {
	case http.StateNew:
		cl.hold()
	case http.StateClosed, http.StateHijacked:
		cl.release()
	}
}

// hold counts a client; release uncounts it. An append stream holds its
// connection again before hijacking it (StateHijacked releases it).
func (cl *clients) hold() {
	cl.mu.Lock()
	defer cl.mu.Unlock()
	cl.open++
}

func (cl *clients) release() {
	cl.mu.Lock()
	defer cl.mu.Unlock()
	cl.open--
	if cl.open == 0 {
		cl.since = time.Now()
		if cl.stopping {
			cl.closeNone()
		}
	}
}

// closeNone says no client is left. A retiring daemon still accepts, so
// its count can fall to 0 more than once.
func (cl *clients) closeNone() {
	if !cl.noneDone {
		cl.noneDone = true
		close(cl.none)
	}
}

// drain retires the daemon without closing its listener: a command that
// was talking to it and opens another connection (its append stream, a
// second request at once) is still served, instead of finding no daemon
// and waiting on a new one that waits for this one's journal. Other
// clients see Retiring and go elsewhere. It exits when no client is left.
func (cl *clients) drain() {
	cl.mu.Lock()
	defer cl.mu.Unlock()
	if cl.stopping {
		return
	}
	cl.stopping, cl.retiring = true, true
	if cl.open == 0 {
		cl.closeNone()
	}
}

func (cl *clients) isRetiring() bool {
	cl.mu.Lock()
	defer cl.mu.Unlock()
	return cl.retiring
}

// stop stops accepting (closing the listener unlinks the socket) if ifIdle
// is 0 or nobody has been connected for ifIdle. It runs under the lock the
// connection hook takes, so a connection is either counted before the
// decision or never accepted; a connection still in the listen backlog is
// reset, its request never read, and the client sends it again through
// a daemon that answers (Client.do).
func (cl *clients) stop(ln net.Listener, ifIdle time.Duration) bool {
	cl.mu.Lock()
	defer cl.mu.Unlock()
	if cl.stopping {
		return true
	}
	if ifIdle > 0 && (cl.open > 0 || time.Since(cl.since) < ifIdle) {
		return false
	}
	cl.stopping = true
	ln.Close()
	if cl.open == 0 {
		cl.closeNone()
	}
	return true
}

// listen takes the socket a service manager passed (socket activation),
// or else binds its own.
func listen(path string) (*unixsock.Listener, error) {
	if ln, err := unixsock.Passed(path); ln != nil || err != nil {
		return ln, err
	}
	return unixsock.Listen(path)
}

func serve(ctx context.Context, n *store.Store, o serveOptions) error {
	// Holding the journal lock, we know any socket file there is a dead
	// daemon's; Listen replaces it because it refuses connections.
	self, err := fsx.RootID(n.Root())
	if err != nil {
		return fmt.Errorf("control socket: %w", err)
	}
	ln, err := listen(filepath.Join(n.Root(), wire.SocketName))
	if err != nil {
		return fmt.Errorf("control socket: %w", err)
	}
	cl := &clients{since: time.Now(), none: make(chan struct{})}
	// retire carries why the daemon is asked to finish.
	retire := make(chan string, 1)
	stopping := func(reason string) {
		if o.log != nil {
			o.log.Info("stopping", "reason", reason)
		}
	}
	fs := &followers{m: map[int]context.CancelFunc{}}
	streams := &streamSet{}
	defer streams.closeAll()
	srv := &http.Server{
		Handler:     gated(handler(n, self, o.auto, o.mirror, o.metrics, retire, fs, cl, streams, o.opening), o.opening),
		BaseContext: func(net.Listener) context.Context { return ctx },
		ConnState:   cl.track,
	}
	stop := context.AfterFunc(ctx, func() { srv.Close() })
	defer stop()
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	var tick <-chan time.Time
	if o.idle > 0 {
		t := time.NewTicker(min(max(o.idle/10, 10*time.Millisecond), time.Second))
		defer t.Stop()
		tick = t.C
	}
	for {
		select {
		case err := <-served:
			ln.Close()
			if errors.Is(err, http.ErrServerClosed) || errors.Is(err, net.ErrClosed) && ctx.Err() != nil {
				stopping(fmt.Sprint(context.Cause(ctx)))
				return nil
			}
			if cl.isStopping() {
				return finish(ctx, srv, cl)
			}
			return err
		case <-tick:
			if cl.stop(ln, o.idle) {
				stopping(fmt.Sprintf("no command for %s", o.idle))
				return finish(ctx, srv, cl)
			}
		case <-o.opening.failedC():
			stopping("the journal did not open: " + o.opening.err.Error())
			cl.stop(ln, 0)
			fctx, cancel := context.WithTimeout(ctx, failedOpenGrace)
			defer cancel()
			return finish(fctx, srv, cl)
		case reason := <-retire:
			stopping(reason)
			cl.drain()
			// Followers would keep a retiring daemon forever; they resume
			// from their last sequence through the next daemon.
			fs.end()
			return finish(ctx, srv, cl)
		}
	}
}

func (cl *clients) isStopping() bool {
	cl.mu.Lock()
	defer cl.mu.Unlock()
	return cl.stopping
}

// finish waits, with accepting stopped, until every client has closed its
// connection (or ctx is done), then closes the server.
func finish(ctx context.Context, srv *http.Server, cl *clients) error {
	select {
	case <-cl.none:
	case <-ctx.Done():
	}
	srv.Close()
	return nil
}

// followers are the open follow streams, ended when the daemon retires.
type followers struct {
	mu    sync.Mutex
	m     map[int]context.CancelFunc
	next  int
	ended bool
}

// add returns a context for one follow stream and its release.
func (f *followers) add(parent context.Context) (context.Context, func()) {
	ctx, cancel := context.WithCancel(parent)
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.ended {
		cancel()
		return ctx, cancel
	}
	id := f.next
	f.next++
	f.m[id] = cancel
	return ctx, func() {
		f.mu.Lock()
		delete(f.m, id)
		f.mu.Unlock()
		cancel()
	}
}

func (f *followers) end() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.ended = true
	for _, cancel := range f.m {
		cancel()
	}
}

func handler(n *store.Store, self fsx.DirID, auto bool, mirror *fleet.Mirror, m *metrics, retire chan<- string, fs *followers, cl *clients, streams *streamSet, op *opening) http.Handler {
	mux := http.NewServeMux()
	if m != nil {
		mux.Handle("GET "+wire.PathMetrics, m.handler())
	}
	local := local.Backend{Store: n}
	var served, most atomic.Int64
	count := func(n int) {
		served.Add(int64(n))
		for m := most.Load(); int64(n) > m && !most.CompareAndSwap(m, int64(n)); m = most.Load() {
		}
	}
	mux.HandleFunc("GET "+wire.PathStats, func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, wire.Stats{Sandboxes: served.Load(), MostInOneAnswer: most.Load(), Decoded: n.Decoded()})
	})
	// A client asks on each connection which root this daemon serves (a
	// hard link or bind mount can put another root's socket at its path):
	// the directory as the daemon opened it.
	// The answer carries the daemon's status too: a client decides on
	// that first exchange whether this daemon serves it.
	fleetPrint := mirror.Fingerprint()
	status := func() wire.Status {
		url := "" // a daemon serving early has no listener (store.Options.Early)
		if op.isOpen() {
			url = n.Journal().ClientURL()
		}
		return wire.Status{Pid: os.Getpid(), Root: n.Root(), SubscriberURL: url, Auto: auto, Build: buildRef(), Retiring: cl.isRetiring(), Fleet: fleetPrint}
	}
	mux.HandleFunc("GET "+wire.PathIdentity, func(w http.ResponseWriter, r *http.Request) {
		st := status()
		writeJSON(w, http.StatusOK, wire.RootIdentity{Root: n.Root(), Dev: self.Dev, Ino: self.Ino, Pid: os.Getpid(), Status: &st})
	})
	mux.HandleFunc("GET "+wire.PathStatus, func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, status())
	})
	mux.HandleFunc("GET "+wire.PathMirror, func(w http.ResponseWriter, r *http.Request) {
		var st *fleet.MirrorState
		if mirror != nil {
			st = mirror.State(r.Context())
		}
		writeJSON(w, http.StatusOK, wire.MirrorAnswer{Mirror: st})
	})
	// A command that must own the journal in its own process (a ledger
	// sweep that removes) retires a daemon started on demand; one started
	// by hand serves until it is stopped.
	mux.HandleFunc("POST "+wire.PathRetire, func(w http.ResponseWriter, r *http.Request) {
		if !auto {
			writeJSON(w, http.StatusConflict, wire.ErrorAnswer{Error: "a daemon started by hand does not retire"})
			return
		}
		select {
		case retire <- "retired for a command that owns the journal itself":
		default:
		}
		writeJSON(w, http.StatusOK, struct{}{})
	})
	// `nexus daemon stop`: however the daemon was started, it finishes
	// with the commands it has and exits.
	mux.HandleFunc("POST "+wire.PathStop, func(w http.ResponseWriter, r *http.Request) {
		var req wire.StopRequest
		if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
			writeJSON(w, http.StatusBadRequest, wire.ErrorAnswer{Error: err.Error()})
			return
		}
		select {
		case retire <- fmt.Sprintf("asked to stop by `nexus daemon stop` (pid %d)", req.Pid):
		default:
		}
		writeJSON(w, http.StatusOK, struct{}{})
	})
	mux.HandleFunc("POST "+wire.PathAppendStream, func(w http.ResponseWriter, r *http.Request) {
		serveAppendStream(n, cl, streams, w, r)
	})
	// An older client posts each append as JSON: refuse it in the answer
	// it decodes, so it prints why instead of misreading the reply.
	mux.HandleFunc("POST "+wire.PathAppendJSON, func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusUpgradeRequired, wire.ErrorAnswer{Error: wire.AppendOverHTTPRefusal})
	})
	mux.HandleFunc("GET "+wire.PathEvents, func(w http.ResponseWriter, r *http.Request) {
		q, err := wire.ParseQuery(r.URL.Query())
		if err != nil {
			writeJSON(w, http.StatusBadRequest, wire.Record{Error: err.Error()})
			return
		}
		w.Header().Set("Content-Type", "application/x-ndjson")
		ctx := r.Context()
		if q.Follow {
			// A follow stream is the connection's last request: a stream
			// ended by a retiring daemon must not leave the client a
			// keep-alive connection to it.
			w.Header().Set("Connection", "close")
			var release func()
			ctx, release = fs.add(ctx)
			defer release()
		}
		enc := json.NewEncoder(w)
		flusher, _ := w.(http.Flusher)
		err = n.EventsRaw(ctx, q, func(seq uint64, data []byte) error {
			if err := enc.Encode(wire.Record{Seq: seq, Data: data}); err != nil {
				return err
			}
			if q.Follow && flusher != nil {
				flusher.Flush()
			}
			return nil
		})
		if err != nil && ctx.Err() == nil {
			enc.Encode(wire.Record{Error: err.Error()})
		}
	})
	mux.HandleFunc("GET "+wire.PathSandboxes, func(w http.ResponseWriter, r *http.Request) {
		var list []projections.Sandbox
		if s := r.URL.Query().Get("limit"); s != "" {
			limit, err := strconv.Atoi(s)
			if err != nil || limit < 0 {
				writeJSON(w, http.StatusBadRequest, wire.ErrorAnswer{Error: fmt.Sprintf("limit %q: not a count", s)})
				return
			}
			list, _ = local.SandboxPage(r.Context(), r.URL.Query().Get("after"), limit)
		} else {
			list, _ = local.Sandboxes(r.Context())
		}
		count(len(list))
		writeJSON(w, http.StatusOK, wire.SandboxesOf(list))
	})
	// ls --json: the store's listing bytes streamed as read. A failure
	// after the first byte aborts the answer, so the client sees a cut
	// stream, never a short list.
	mux.HandleFunc("GET "+wire.PathListJSON, func(w http.ResponseWriter, r *http.Request) {
		limit, err := strconv.Atoi(r.URL.Query().Get("limit"))
		if err != nil || limit < 0 {
			writeJSON(w, http.StatusBadRequest, wire.ErrorAnswer{Error: fmt.Sprintf("limit %q: not a count", r.URL.Query().Get("limit"))})
			return
		}
		w.Header().Set("Content-Type", "application/json")
		if err := local.ListJSON(r.Context(), w, r.URL.Query().Get("after"), limit); err != nil {
			panic(http.ErrAbortHandler)
		}
	})
	mux.HandleFunc("GET "+wire.PathWithProcesses, func(w http.ResponseWriter, r *http.Request) {
		list, err := local.WithProcesses(r.Context())
		if err != nil {
			writeJSON(w, http.StatusInternalServerError, wire.ErrorAnswer{Error: err.Error()})
			return
		}
		count(len(list))
		writeJSON(w, http.StatusOK, wire.SandboxesOf(list))
	})
	mux.HandleFunc("GET "+wire.PathSandbox, func(w http.ResponseWriter, r *http.Request) {
		sb, found, _ := local.Sandbox(r.Context(), r.URL.Query().Get("ref"))
		if found {
			count(1)
		}
		writeJSON(w, http.StatusOK, wire.SandboxAnswer{Found: found, Sandbox: wire.SandboxOf(sb)})
	})
	mux.HandleFunc("GET "+wire.PathNamed, func(w http.ResponseWriter, r *http.Request) {
		refs, err := local.Named(r.Context(), r.URL.Query().Get("ref"))
		if err != nil {
			writeJSON(w, http.StatusInternalServerError, wire.ErrorAnswer{Error: err.Error()})
			return
		}
		writeJSON(w, http.StatusOK, refs)
	})
	mux.HandleFunc("GET "+wire.PathOwner, func(w http.ResponseWriter, r *http.Request) {
		q := r.URL.Query()
		id, path, found, _ := local.OwnerOf(r.Context(), q["path"], q.Get("except"))
		writeJSON(w, http.StatusOK, wire.OwnerAnswer{Found: found, Sandbox: id, Path: path})
	})
	mux.HandleFunc("POST "+wire.PathPathOwners, func(w http.ResponseWriter, r *http.Request) {
		servePathOwners(n, w, r)
	})
	// An older client asks in the URL's query: refuse it in the answer it
	// decodes.
	mux.HandleFunc("GET "+wire.PathPathOwners, func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusUpgradeRequired, wire.ErrorAnswer{Error: wire.PathOwnersOverGETRefusal})
	})
	mux.HandleFunc("GET "+wire.PathSnapshotOwner, func(w http.ResponseWriter, r *http.Request) {
		sb, found, _ := local.SnapshotOwner(r.Context(), r.URL.Query().Get("snap"))
		if found {
			count(1)
		}
		writeJSON(w, http.StatusOK, wire.SandboxAnswer{Found: found, Sandbox: wire.SandboxOf(sb)})
	})
	mux.HandleFunc("GET "+wire.PathSnapshotsNamed, func(w http.ResponseWriter, r *http.Request) {
		refs, err := local.SnapshotsNamed(r.Context(), r.URL.Query().Get("ref"))
		if err != nil {
			writeJSON(w, http.StatusInternalServerError, wire.ErrorAnswer{Error: err.Error()})
			return
		}
		writeJSON(w, http.StatusOK, refs)
	})
	mux.HandleFunc("GET "+wire.PathVolumes, func(w http.ResponseWriter, r *http.Request) {
		list, _ := local.Volumes(r.Context())
		writeJSON(w, http.StatusOK, list)
	})
	mux.HandleFunc("GET "+wire.PathImageCache, func(w http.ResponseWriter, r *http.Request) {
		st, _ := local.ImageCache(r.Context())
		count(len(st.Users))
		writeJSON(w, http.StatusOK, st)
	})
	mux.HandleFunc("GET "+wire.PathBootstrap, func(w http.ResponseWriter, r *http.Request) {
		b, _ := local.Bootstrap(r.Context(), r.URL.Query().Get("id"))
		writeJSON(w, http.StatusOK, b)
	})
	mux.HandleFunc("GET "+wire.PathRev, func(w http.ResponseWriter, r *http.Request) {
		rev, err := local.Rev(r.Context(), core.Entity(r.URL.Query().Get("entity")))
		if err != nil {
			writeJSON(w, http.StatusInternalServerError, wire.ErrorAnswer{Error: err.Error()})
			return
		}
		writeJSON(w, http.StatusOK, wire.RevAnswer{Rev: rev})
	})
	mux.HandleFunc("GET "+wire.PathSagas, func(w http.ResponseWriter, r *http.Request) {
		list, _ := local.OpenSagas(r.Context())
		writeJSON(w, http.StatusOK, list)
	})
	return mux
}

// servePathOwners answers one batch of path-owner lookups (the paths a
// reap scanned) with what a batch needs and nothing per path: the body
// read into one string the paths are slices of, one slice of them, and
// the answer written into one buffer as the store's one read transaction
// finds each owner.
func servePathOwners(n *store.Store, w http.ResponseWriter, r *http.Request) {
	var body strings.Builder
	if r.ContentLength > 0 && r.ContentLength <= wire.PathOwnersMaxBody {
		body.Grow(int(r.ContentLength))
	}
	if _, err := io.Copy(&body, http.MaxBytesReader(w, r.Body, wire.PathOwnersMaxBody)); err != nil {
		writeJSON(w, http.StatusBadRequest, wire.ErrorAnswer{Error: err.Error()})
		return
	}
	paths, err := wire.SplitPaths(body.String())
	if err != nil {
		writeJSON(w, http.StatusBadRequest, wire.ErrorAnswer{Error: err.Error()})
		return
	}
	answer := make([]byte, 0, len(paths)*(ulidLen+1))
	err = n.EachPathOwner(r.Context(), paths, func(_ int, owner []byte) {
		answer = append(append(answer, owner...), '\n')
	})
	if err != nil {
		writeJSON(w, http.StatusInternalServerError, wire.ErrorAnswer{Error: err.Error()})
		return
	}
	w.Header().Set("Content-Type", wire.PathOwnersType)
	w.Header().Set("Content-Length", strconv.Itoa(len(answer)))
	w.Write(answer)
}

// ulidLen is the length of a sandbox's ID, what an owner's line holds.
const ulidLen = 26

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	json.NewEncoder(w).Encode(v)
}
