package fsx

import (
	"errors"
	"fmt"
	"os"

	"golang.org/x/sys/unix"
)

// ErrNotSocket means something other than a unix socket sits where nexus
// expects one of its own sockets.
var ErrNotSocket = errors.New("not a socket")

// OpenSocket opens the unix socket name beneath root as an O_PATH
// descriptor, under the rules of every other open: no symlink at any
// component (ErrSymlink), nothing but a socket (ErrNotSocket). Connecting
// to /proc/self/fd/<fd> then reaches the socket the descriptor names and
// no other, whatever is renamed over the path meanwhile.
func OpenSocket(root, name string) (*os.File, error) {
	fd, full, err := openat2Beneath(root, name, &unix.OpenHow{Flags: unix.O_PATH | unix.O_CLOEXEC})
	if err != nil {
		return nil, err
	}
	if err := wantType(fd, full, unix.S_IFSOCK, ErrNotSocket); err != nil {
		return nil, err
	}
	return os.NewFile(uintptr(fd), full), nil
}

// DirID is a directory's identity on this host: its device and inode.
type DirID struct{ Dev, Ino uint64 }

// RootID is the identity of the state root itself, opened as every open
// beneath it opens it (a symlinked root is refused).
func RootID(root string) (DirID, error) {
	fd, err := openRoot(root)
	if err != nil {
		return DirID{}, err
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return DirID{}, fmt.Errorf("stat %s: %w", root, err)
	}
	return DirID{Dev: uint64(st.Dev), Ino: st.Ino}, nil
}
