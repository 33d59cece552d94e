package proc

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// Running reads pid's identity and whether it still runs (not a zombie) in
// one read of /proc/<pid>/stat, for callers that judge many pids at once
// (the ledger sweep). A pid nobody has is (zero, false, nil).
func Running(pid int) (Identity, bool, error) {
	if pid <= 0 {
		return Identity{}, false, fmt.Errorf("invalid pid %d", pid)
	}
	// Raw open/read/close: os.ReadFile's extra fstat, poller registration
	// and second read double the syscalls, which is the whole cost of a
	// sweep over many live runs.
	var buf [1024]byte
	fd, err := unix.Open("/proc/"+strconv.Itoa(pid)+"/stat", unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if errors.Is(err, unix.ENOENT) || errors.Is(err, unix.ESRCH) {
		return Identity{}, false, nil
	}
	if err != nil {
		return Identity{}, false, fmt.Errorf("/proc/%d/stat: %w", pid, err)
	}
	n, err := unix.Read(fd, buf[:])
	unix.Close(fd)
	if errors.Is(err, unix.ESRCH) {
		return Identity{}, false, nil // exited between open and read
	}
	if err != nil {
		return Identity{}, false, fmt.Errorf("/proc/%d/stat: %w", pid, err)
	}
	st, err := parseStat(buf[:n])
	if err != nil {
		return Identity{}, false, fmt.Errorf("/proc/%d/stat: %w", pid, err)
	}
	return Identity{Pid: pid, StartTicks: st.startTicks}, st.state != 'Z' && st.state != 'X', nil
}

// WithArgs lists the processes whose command line (after argv[0]) starts
// with args: how a process this code spawned is found before it has said
// anything about itself. Processes that exit or cannot be read mid-scan
// are left out.
func WithArgs(args ...string) []int {
	names, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	var out []int
	for _, e := range names {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		data, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil {
			continue
		}
		argv := strings.Split(strings.TrimSuffix(string(data), "\x00"), "\x00")
		if len(argv) > len(args) && slices.Equal(argv[1:1+len(args)], args) {
			out = append(out, pid)
		}
	}
	return out
}
