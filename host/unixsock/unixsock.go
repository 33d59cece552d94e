// Package unixsock listens on and dials unix sockets at paths nexus owns:
// sockets that are 0600 from their first moment, replace a dead
// predecessor's file but never a live listener, are unlinked at close only
// while the path still names them, and work at any path length.
//
// sockaddr_un holds 108 bytes, so a state root a little over 60 bytes deep
// cannot hold run/sb-<ULID>.sock by name. A path that does not fit is reached
// through its directory instead: the directory is opened O_PATH and the
// socket is bound or dialled as /proc/self/fd/<dirfd>/<name>, which the
// kernel resolves like any other path.
package unixsock

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"time"

	"github.com/coreos/go-systemd/v22/activation"
	"golang.org/x/sys/unix"
)

// ErrInUse means a live process accepts connections on the path. Listen
// refuses rather than unlinking it, which would silently orphan that
// listener.
var ErrInUse = errors.New("a live process answers on the socket")

// sunPathMax is the room in sockaddr_un.sun_path for a path and its NUL.
const sunPathMax = len(unix.RawSockaddrUnix{}.Path)

const socketMode fs.FileMode = 0o600

// probeTimeout bounds the stale-socket probe. A listener that takes longer
// to accept is live but busy, and is refused.
const probeTimeout = 2 * time.Second

// Listener is a listening socket at a path this process bound.
type Listener struct {
	net.Listener
	path string
	// id is the socket file this listener bound, unlinked at close while
	// the path still names it; zero for a socket passed in, whose file is
	// the service manager's.
	id   fileID
	once sync.Once
	err  error
}

// Path is the socket's path as the caller named it.
func (l *Listener) Path() string { return l.path }

// Listen binds a 0600 socket at path. A socket file there that refuses
// connections (its owner died) is replaced; a path where something answers,
// or that is not a socket, is refused. Two listeners starting on one path at
// once can both pass the probe; bind then fails for the second with ErrInUse.
func Listen(path string) (*Listener, error) {
	if err := clearStale(path); err != nil {
		return nil, err
	}
	fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("socket %s: %w", path, err)
	}
	keepFD := false
	defer func() {
		if !keepFD {
			unix.Close(fd)
		}
	}()
	// Linux gives the socket file the socket inode's mode (minus umask), so
	// fchmod before bind means the path is never reachable with a looser
	// mode, not even for the instant before a chmod.
	if err := unix.Fchmod(fd, uint32(socketMode)); err != nil {
		return nil, fmt.Errorf("fchmod socket %s: %w", path, err)
	}
	err = withAddr(path, func(addr string) error { return unix.Bind(fd, &unix.SockaddrUnix{Name: addr}) })
	if errors.Is(err, unix.EADDRINUSE) {
		return nil, fmt.Errorf("%s: %w", path, ErrInUse) // bound by someone between probe and bind
	}
	if err != nil {
		return nil, fmt.Errorf("bind %s: %w", path, err)
	}
	bound := true
	defer func() {
		if bound && !keepFD {
			os.Remove(path)
		}
	}()
	// A restrictive umask may have stripped bits the owner needs; restoring
	// them never makes the file looser than 0600.
	if err := os.Chmod(path, socketMode); err != nil {
		return nil, fmt.Errorf("chmod %s: %w", path, err)
	}
	id, err := identify(path)
	if err != nil {
		return nil, err
	}
	if err := unix.Listen(fd, 128); err != nil {
		return nil, fmt.Errorf("listen %s: %w", path, err)
	}
	f := os.NewFile(uintptr(fd), path)
	ln, err := net.FileListener(f) // dups fd
	f.Close()
	keepFD = true // f.Close closed it
	if err != nil {
		os.Remove(path)
		return nil, fmt.Errorf("listen %s: %w", path, err)
	}
	return &Listener{Listener: ln, path: path, id: id}, nil
}

// Passed is the listening socket a service manager handed this process
// (systemd's socket activation: LISTEN_PID and LISTEN_FDS), or nil if it
// was handed none. A socket bound anywhere but path is refused: the
// manager's unit and the command line name different places. The
// variables are cleared so no child takes the socket for its own.
func Passed(path string) (*Listener, error) {
	lns, err := activation.Listeners()
	if err != nil {
		return nil, fmt.Errorf("socket passed by the service manager: %w", err)
	}
	var ln net.Listener
	for _, l := range lns {
		if l == nil {
			continue
		}
		if ln != nil {
			l.Close()
			ln.Close()
			return nil, fmt.Errorf("the service manager passed more than one socket; %s takes one", path)
		}
		ln = l
	}
	if ln == nil {
		return nil, nil
	}
	abs, err := filepath.Abs(path)
	if err != nil {
		ln.Close()
		return nil, err
	}
	if got := ln.Addr().String(); ln.Addr().Network() != "unix" || filepath.Clean(got) != abs {
		ln.Close()
		return nil, fmt.Errorf("the service manager passed a socket bound at %s (%s), not at %s: its unit's ListenStream must name this root's socket", got, ln.Addr().Network(), abs)
	}
	return &Listener{Listener: ln, path: path}, nil
}

// Close stops listening and removes the socket file, unless another
// listener has since put its own socket at the path. A socket passed in
// stays: the service manager keeps listening on it.
func (l *Listener) Close() error {
	l.once.Do(func() {
		// Unlink first, so no new client finds the path while we close.
		if id, err := identify(l.path); err == nil && id == l.id {
			if err := os.Remove(l.path); err != nil && !errors.Is(err, fs.ErrNotExist) {
				l.err = err
			}
		}
		if err := l.Listener.Close(); err != nil && l.err == nil && !errors.Is(err, net.ErrClosed) {
			l.err = err
		}
	})
	return l.err
}

// fileID tells our socket file from a successor's. The inode number alone
// does not: a file system reuses a freed inode at once, so the socket that
// replaced ours after a stale-file removal often has our number.
type fileID struct {
	dev, ino uint64
	ctime    unix.Timespec
}

func identify(path string) (fileID, error) {
	var st unix.Stat_t
	if err := unix.Lstat(path, &st); err != nil {
		return fileID{}, fmt.Errorf("stat %s: %w", path, err)
	}
	return fileID{dev: uint64(st.Dev), ino: st.Ino, ctime: st.Ctim}, nil
}

// Dial connects to the socket at path, of any length.
func Dial(ctx context.Context, path string) (net.Conn, error) {
	var conn net.Conn
	err := withAddr(path, func(addr string) error {
		var d net.Dialer
		c, err := d.DialContext(ctx, "unix", addr)
		conn = c
		return err
	})
	return conn, err
}

// DialFile connects to the socket an O_PATH descriptor names (one
// fsx.OpenSocket opened), through /proc/self/fd: the kernel resolves that
// magic link to the socket itself, so a link or rename at the socket's
// path after the open cannot send the connection elsewhere.
func DialFile(ctx context.Context, f *os.File) (net.Conn, error) {
	var d net.Dialer
	c, err := d.DialContext(ctx, "unix", "/proc/self/fd/"+strconv.Itoa(int(f.Fd())))
	if err != nil {
		return nil, fmt.Errorf("dial %s: %w", f.Name(), err)
	}
	return c, nil
}

// clearStale removes a socket file nobody listens on, which is what a
// SIGKILLed server leaves behind; bind would fail on it forever.
func clearStale(path string) error {
	fi, err := os.Lstat(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	if fi.Mode().Type() != fs.ModeSocket {
		return fmt.Errorf("%s exists and is not a socket (%v); refusing to replace it", path, fi.Mode().Type())
	}
	ctx, cancel := context.WithTimeout(context.Background(), probeTimeout)
	defer cancel()
	c, err := Dial(ctx, path)
	if err == nil {
		c.Close()
		return fmt.Errorf("%s: %w", path, ErrInUse)
	}
	// Only a refusal proves nobody listens. EAGAIN (a full backlog), EACCES
	// or a timeout may hide a live listener.
	if !errors.Is(err, unix.ECONNREFUSED) {
		return fmt.Errorf("%s: probing for a live listener: %w", path, err)
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("remove stale socket %s: %w", path, err)
	}
	return nil
}

// withAddr calls use with an address that names path and fits sun_path:
// path itself, or the path through an O_PATH descriptor of its directory,
// held open until use returns.
func withAddr(path string, use func(addr string) error) error {
	if len(path) < sunPathMax {
		return use(path)
	}
	dir, name := filepath.Split(path)
	dfd, err := unix.Open(dir, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return &os.PathError{Op: "open", Path: dir, Err: err}
	}
	defer unix.Close(dfd)
	addr := "/proc/self/fd/" + strconv.Itoa(dfd) + "/" + name
	if len(addr) >= sunPathMax {
		return fmt.Errorf("socket name %q is too long for sun_path even relative to its directory", name)
	}
	return use(addr)
}
