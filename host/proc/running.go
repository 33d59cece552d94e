package proc

import (
	"errors"
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
