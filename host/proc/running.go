package proc

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
)

// Running reads pid's identity and whether it still runs (not a zombie) in
// one read of /proc/<pid>/stat, for callers that judge many pids at once
// (the ledger sweep). A pid nobody has is (zero, false, nil).
func Running(pid int) (Identity, bool, error) {
	st, err := readStat(pid)
	if errors.Is(err, ErrGone) {
		return Identity{}, false, nil
	}
	if err != nil {
		return Identity{}, false, err
	}
	return Identity{Pid: pid, StartTicks: st.startTicks}, st.state != 'Z' && st.state != 'X', nil
}

// State is pid's state letter ('R', 'S', 'D', 'T' stopped by a signal,
// 'Z' exited but not reaped, ...), for a message to a person; a pid nobody
// has is ErrGone.
func State(pid int) (byte, error) {
	st, err := readStat(pid)
	if err != nil {
		return 0, err
	}
	return st.state, nil
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
