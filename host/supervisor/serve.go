package supervisor

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/nexus-sandbox/nexus/host/lease"
)

// ErrSocketInUse means something live accepts connections on a socket path
// Serve was asked to own. Serve refuses rather than unlinking it, which
// would silently orphan that listener.
var ErrSocketInUse = errors.New("a live process answers on the socket")

// ServeOptions configures one supervisor process.
type ServeOptions struct {
	SandboxID string
	StateDir  string
	// IIDSocket is the instance-identity socket path; its directory must
	// already exist.
	IIDSocket string
	Now       func() time.Time
	Log       io.Writer
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

	ctl, err := listenUnix(filepath.Join(o.StateDir, SocketName))
	if err != nil {
		return err
	}
	defer ctl.remove()
	iid, err := listenUnix(o.IIDSocket)
	if err != nil {
		return err
	}
	defer iid.remove()

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
	listeners := []*unixListener{ctl, iid}
	errc := make(chan error, len(servers))
	for i, srv := range servers {
		go func() { errc <- srv.Serve(listeners[i].ln) }()
	}
	logf("serving pid=%d ca_sha256=%s control=%s identity=%s", pid, fp, ctl.path, iid.path)

	var serveErr error
	select {
	case <-ctx.Done():
	case serveErr = <-errc:
	}
	// Unlink first so no new client finds the path while we drain.
	ctl.remove()
	iid.remove()
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

// unixListener remembers which inode it bound so that removal never unlinks
// a socket some other process has since put at the same path.
type unixListener struct {
	ln       net.Listener
	path     string
	dev, ino uint64
	once     sync.Once
}

func (u *unixListener) remove() {
	u.once.Do(func() {
		var st unix.Stat_t
		if unix.Lstat(u.path, &st) == nil && uint64(st.Dev) == u.dev && st.Ino == u.ino {
			os.Remove(u.path)
		}
		u.ln.Close()
	})
}

// listenUnix binds a 0600 unix socket at path, first clearing a stale socket
// left by a dead process.
func listenUnix(path string) (*unixListener, error) {
	if len(path) >= len(unix.RawSockaddrUnix{}.Path) {
		return nil, fmt.Errorf("supervisor: socket path %s is too long (%d bytes)", path, len(path))
	}
	if err := clearStaleSocket(path); err != nil {
		return nil, err
	}
	fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("supervisor: socket %s: %w", path, err)
	}
	closeFD := true
	defer func() {
		if closeFD {
			unix.Close(fd)
		}
	}()
	// Linux creates the socket file with the socket inode's mode (minus
	// umask), so fchmod before bind means the path is never reachable with a
	// looser mode, not even for the instant before a chmod; a process-wide
	// umask change would race with other goroutines.
	if err := unix.Fchmod(fd, uint32(fileMode)); err != nil {
		return nil, fmt.Errorf("supervisor: fchmod socket %s: %w", path, err)
	}
	if err := unix.Bind(fd, &unix.SockaddrUnix{Name: path}); err != nil {
		if errors.Is(err, unix.EADDRINUSE) {
			// Someone bound it between our probe and our bind.
			return nil, fmt.Errorf("supervisor: %s: %w", path, ErrSocketInUse)
		}
		return nil, fmt.Errorf("supervisor: bind %s: %w", path, err)
	}
	// From here on every failure must also unlink the file bind created.
	defer func() {
		if closeFD {
			os.Remove(path)
		}
	}()
	var st unix.Stat_t
	if err := unix.Lstat(path, &st); err != nil {
		return nil, fmt.Errorf("supervisor: stat %s: %w", path, err)
	}
	// A restrictive umask may have stripped owner bits clients need;
	// restoring them never makes the file looser than 0600.
	if fs.FileMode(st.Mode&0o777) != fileMode {
		if err := os.Chmod(path, fileMode); err != nil {
			return nil, fmt.Errorf("supervisor: chmod %s: %w", path, err)
		}
	}
	if err := unix.Listen(fd, 128); err != nil {
		return nil, fmt.Errorf("supervisor: listen %s: %w", path, err)
	}
	f := os.NewFile(uintptr(fd), path)
	closeFD = false
	ln, err := net.FileListener(f)
	f.Close()
	if err != nil {
		os.Remove(path)
		return nil, fmt.Errorf("supervisor: listen %s: %w", path, err)
	}
	return &unixListener{ln: ln, path: path, dev: uint64(st.Dev), ino: st.Ino}, nil
}

// clearStaleSocket removes a socket file nobody listens on, which is what a
// SIGKILLed supervisor leaves behind; bind would fail on it forever. A live
// listener, or anything that is not a socket, is left alone and refused.
func clearStaleSocket(path string) error {
	fi, err := os.Lstat(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("supervisor: stat %s: %w", path, err)
	}
	if fi.Mode().Type() != fs.ModeSocket {
		return fmt.Errorf("supervisor: %s exists and is not a socket (%s); refusing to replace it", path, fi.Mode().Type())
	}
	c, err := net.DialTimeout("unix", path, 2*time.Second)
	if err == nil {
		c.Close()
		return fmt.Errorf("supervisor: %s: %w", path, ErrSocketInUse)
	}
	// Only ECONNREFUSED proves nobody is listening. Anything else (EAGAIN
	// from a full backlog, EACCES, a timeout) may hide a live listener.
	if !errors.Is(err, unix.ECONNREFUSED) {
		return fmt.Errorf("supervisor: probe %s: %w", path, err)
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("supervisor: remove stale socket %s: %w", path, err)
	}
	return nil
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
