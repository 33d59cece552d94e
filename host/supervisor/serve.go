package supervisor

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log"
	"net/http"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/nexus-sandbox/nexus/host/lease"
	"github.com/nexus-sandbox/nexus/host/logindex"
	"github.com/nexus-sandbox/nexus/host/unixsock"
)

// ErrSocketInUse means something live accepts connections on a socket path
// Serve was asked to own. Serve refuses rather than unlinking it, which
// would silently orphan that listener.
var ErrSocketInUse = unixsock.ErrInUse

// ServeOptions configures one supervisor process.
type ServeOptions struct {
	SandboxID string
	StateDir  string
	// IIDSocket is the instance-identity socket path; its directory must
	// already exist.
	IIDSocket string
	Now       func() time.Time
	Log       io.Writer
	// Ready, if set, is called once both sockets accept connections.
	Ready func()
	// ConsoleLog and ConsoleIndex, when both are set, are the sandbox's
	// console log and its time index, which the supervisor keeps while it
	// runs (host/logindex).
	ConsoleLog, ConsoleIndex string
}

// PingInfo is the reply to GET /ping on supervisor.sock.
type PingInfo struct {
	Sandbox  string `json:"sandbox"`
	CASHA256 string `json:"ca_sha256"`
	PID      int    `json:"pid"`
}

// Identity is the reply to GET /identity on the IID socket.
type Identity struct {
	Sandbox string `json:"sandbox"`
}

// shutdownGrace bounds how long in-flight requests may delay exit; the
// requests are tiny, so anything slower is a stuck client.
const shutdownGrace = 5 * time.Second

// Serve is the supervisor process body. It holds the state dir's lease,
// seeds (or re-mints) the CA, serves both sockets until ctx is done, then
// removes the sockets it created and returns nil. The state dir is kept: it
// is what a replacement re-seeds from after this process dies abnormally.
func Serve(ctx context.Context, o ServeOptions) error {
	if o.SandboxID == "" || o.StateDir == "" || o.IIDSocket == "" {
		return errors.New("supervisor: SandboxID, StateDir and IIDSocket are required")
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	logw := &syncWriter{w: o.Log}
	if o.Log == nil {
		logw.w = io.Discard
	}
	logf := func(format string, a ...any) {
		fmt.Fprintf(logw, "supervisor %s: "+format+"\n", append([]any{o.SandboxID}, a...)...)
	}

	if err := EnsureStateDir(o.StateDir); err != nil {
		return err
	}
	// Take the lease before touching the CA: two starters racing on one dir
	// could otherwise each mint a CA, and the one whose rename lost would
	// serve a CA that is not on disk.
	l, err := lease.TryAcquire(filepath.Join(o.StateDir, lockName))
	if err != nil {
		if errors.Is(err, lease.ErrHeld) {
			return fmt.Errorf("supervisor: %w: %v", ErrAlreadyRunning, err)
		}
		return fmt.Errorf("supervisor: lease: %w", err)
	}
	defer l.Release()
	removeStaleTemps(o.StateDir)

	ca, lost, err := SeedOrMint(o.StateDir, o.SandboxID, o.Now())
	if err != nil {
		return err
	}
	fp := ca.Fingerprint()
	if lost != nil {
		logf("CALost: %v; minted a fresh CA ca_sha256=%s", lost, fp)
	}

	// The IID socket is bound before the control socket: whoever sees the
	// supervisor answer a ping (its starter, recover) may rely on both.
	iid, err := unixsock.Listen(o.IIDSocket)
	if err != nil {
		return fmt.Errorf("supervisor: %w", err)
	}
	defer iid.Close()
	ctl, err := unixsock.Listen(filepath.Join(o.StateDir, SocketName))
	if err != nil {
		return fmt.Errorf("supervisor: %w", err)
	}
	defer ctl.Close()

	pid := os.Getpid()
	ctlMux := http.NewServeMux()
	ctlMux.HandleFunc("GET /ping", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, PingInfo{Sandbox: o.SandboxID, CASHA256: fp, PID: pid})
	})
	iidMux := http.NewServeMux()
	iidMux.HandleFunc("GET /identity", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, Identity{Sandbox: o.SandboxID})
	})
	errLog := log.New(logw, "supervisor "+o.SandboxID+": http: ", 0)
	servers := []*http.Server{
		{Handler: ctlMux, ReadHeaderTimeout: 5 * time.Second, ErrorLog: errLog},
		{Handler: iidMux, ReadHeaderTimeout: 5 * time.Second, ErrorLog: errLog},
	}
	listeners := []*unixsock.Listener{ctl, iid}
	errc := make(chan error, len(servers))
	for i, srv := range servers {
		go func() { errc <- srv.Serve(listeners[i]) }()
	}
	logf("serving pid=%d ca_sha256=%s control=%s identity=%s", pid, fp, ctl.Path(), iid.Path())
	watchCtx, stopWatch := context.WithCancel(context.Background())
	watched := make(chan struct{})
	if o.ConsoleLog != "" && o.ConsoleIndex != "" {
		// The first look comes before the supervisor says it serves, so
		// before its boot's VMM writes the console anew.
		w := &logindex.Watcher{Log: o.ConsoleLog, Index: o.ConsoleIndex, Now: o.Now, Logf: logf}
		w.Look()
		go func() { defer close(watched); w.Run(watchCtx) }()
	} else {
		close(watched)
	}
	// The index's last look is taken as the supervisor stops, after the
	// VMM it outlives has written its last lines.
	defer func() { stopWatch(); <-watched }()
	if o.Ready != nil {
		o.Ready()
	}

	var serveErr error
	select {
	case <-ctx.Done():
	case serveErr = <-errc:
	}
	// Unlink first so no new client finds the path while we drain.
	ctl.Close()
	iid.Close()
	sctx, cancel := context.WithTimeout(context.Background(), shutdownGrace)
	defer cancel()
	for _, srv := range servers {
		if err := srv.Shutdown(sctx); err != nil {
			srv.Close()
		}
	}
	if serveErr != nil && !errors.Is(serveErr, http.ErrServerClosed) {
		return fmt.Errorf("supervisor: serve: %w", serveErr)
	}
	logf("stopped")
	return nil
}

func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(v)
}

// syncWriter serialises log lines from the HTTP servers and Serve itself.
type syncWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (s *syncWriter) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.w.Write(p)
}
