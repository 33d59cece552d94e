package vmm

import (
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"time"
)

// sunPathMax is the room in sockaddr_un.sun_path for a path and its NUL.
const sunPathMax = 108

// unixListener is a listening socket at a path we own: mode 0600 from the
// first moment, and removed at close only if the path still names our socket.
type unixListener struct {
	*net.UnixListener
	path     string
	dev, ino uint64
	once     sync.Once
	err      error
}

// listenUnix listens on path. A leftover socket file that refuses connections
// (its VMM died) is replaced; a path where something answers, or that is not
// a socket at all, is refused. Two servers starting on one path at once can
// still both pass the check; the caller must serialize per path.
func listenUnix(path string) (*unixListener, error) {
	if err := checkStale(path); err != nil {
		return nil, err
	}
	l, err := bindPrivate(path)
	if err != nil {
		return nil, err
	}
	fi, err := os.Lstat(path)
	if err != nil {
		l.Close()
		return nil, err
	}
	st := fi.Sys().(*syscall.Stat_t)
	return &unixListener{UnixListener: l, path: path, dev: uint64(st.Dev), ino: st.Ino}, nil
}

func checkStale(path string) error {
	fi, err := os.Lstat(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	if fi.Mode().Type() != fs.ModeSocket {
		return fmt.Errorf("%s exists and is not a socket", path)
	}
	c, err := net.DialTimeout("unix", path, time.Second)
	if err == nil {
		c.Close()
		return fmt.Errorf("%s: something already answers on it", path)
	}
	// Only a refusal proves nobody listens; EAGAIN (full backlog) or a
	// timeout means a live but busy listener.
	if !errors.Is(err, syscall.ECONNREFUSED) {
		return fmt.Errorf("%s: probing for a live listener: %w", path, err)
	}
	return nil
}

// bindPrivate binds in a fresh 0700 directory beside path, sets the socket
// to 0600 and renames it into place: bind honours only the umask, so binding
// at path directly would leave it connectable by others for a moment, and the
// rename also replaces a stale socket atomically.
func bindPrivate(path string) (*net.UnixListener, error) {
	dir, err := os.MkdirTemp(filepath.Dir(path), ".vmm")
	if err != nil {
		return nil, err
	}
	defer os.Remove(dir)
	tmp := filepath.Join(dir, "s")
	if len(tmp) >= sunPathMax {
		return bindDirect(path)
	}
	l, err := net.ListenUnix("unix", &net.UnixAddr{Name: tmp, Net: "unix"})
	if err != nil {
		return nil, err
	}
	// We remove the path ourselves, and only while it is still ours.
	l.SetUnlinkOnClose(false)
	if err := os.Chmod(tmp, 0o600); err != nil {
		l.Close()
		os.Remove(tmp)
		return nil, err
	}
	if err := os.Rename(tmp, path); err != nil {
		l.Close()
		os.Remove(tmp)
		return nil, err
	}
	return l, nil
}

// bindDirect is for a path so close to sun_path's limit that the private
// directory's name does not fit; the parent directory's mode must then keep
// others out during the moment before chmod.
func bindDirect(path string) (*net.UnixListener, error) {
	if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return nil, err
	}
	l, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		return nil, err
	}
	l.SetUnlinkOnClose(false)
	if err := os.Chmod(path, 0o600); err != nil {
		l.Close()
		os.Remove(path)
		return nil, err
	}
	return l, nil
}

// Close stops listening and removes the socket file unless another server
// has since put its own socket there.
func (u *unixListener) Close() error {
	u.once.Do(func() {
		u.err = u.UnixListener.Close()
		if fi, err := os.Lstat(u.path); err == nil {
			if st := fi.Sys().(*syscall.Stat_t); uint64(st.Dev) == u.dev && st.Ino == u.ino {
				if err := os.Remove(u.path); err != nil && u.err == nil {
					u.err = err
				}
			}
		}
	})
	return u.err
}
