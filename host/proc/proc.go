// Package proc names processes in a way that survives pid reuse: a pid
// together with the process's start time (clock ticks since boot) denotes at
// most one process ever, for the life of the boot.
package proc

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"strconv"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// ErrGone means the process no longer exists (or is a zombie, or its pid now
// belongs to another process).
var ErrGone = errors.New("process is gone")

// Identity is one process for the life of the boot. A bare pid is not enough:
// the kernel hands pids out again once a process is reaped.
type Identity struct {
	Pid        int
	StartTicks uint64
}

func (id Identity) String() string {
	return fmt.Sprintf("pid %d (start %d)", id.Pid, id.StartTicks)
}

// killWait bounds the wait after SIGKILL: a process stuck in uninterruptible
// sleep (dead NFS, wedged device) does not die, and the caller must hear so
// rather than hang.
const killWait = 10 * time.Second

// Self is the calling process's identity.
func Self() (Identity, error) { return Of(os.Getpid()) }

// Of reads the identity of the process that now has pid. A zombie still has
// an identity (its start ticks are still readable); Alive tells it apart.
func Of(pid int) (Identity, error) {
	st, err := readStat(pid)
	if err != nil {
		return Identity{}, err
	}
	return Identity{Pid: pid, StartTicks: st.startTicks}, nil
}

// Alive reports whether id's process still runs. A different start time under
// the same pid is another process, so false; a zombie has finished running, so
// false too (its parent merely has not reaped it yet).
func Alive(id Identity) (bool, error) {
	st, err := readStat(id.Pid)
	if errors.Is(err, ErrGone) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	if st.startTicks != id.StartTicks {
		return false, nil
	}
	return st.state != 'Z' && st.state != 'X', nil
}

// Terminate asks id's process to stop with SIGTERM, gives it grace, then
// SIGKILLs it. It never signals a process other than id's: a process that is
// already gone, or whose pid now names another process, is success.
func Terminate(id Identity, grace time.Duration) error {
	// A pidfd pins the process it was opened on, so once we have checked that
	// the pidfd's process is id's, no later reuse of the pid can redirect our
	// signals. Exit also makes the pidfd readable, for children and
	// non-children alike, which is a real signal to wait on.
	pfd, err := unix.PidfdOpen(id.Pid, 0)
	switch {
	case errors.Is(err, unix.ESRCH):
		return nil
	case errors.Is(err, unix.ENOSYS), errors.Is(err, unix.EPERM), errors.Is(err, unix.EINVAL):
		// Old kernel, seccomp filter, or a pid that is not a thread-group
		// leader: fall back to /proc, which has a small reuse window.
		return terminateByProc(id, grace)
	case err != nil:
		return fmt.Errorf("pidfd_open %d: %w", id.Pid, err)
	}
	defer unix.Close(pfd)

	// Checked after opening the pidfd: if /proc still shows id's start ticks
	// now, the pid has belonged to id's process since before the open, so the
	// pidfd is that process.
	if alive, err := Alive(id); err != nil || !alive {
		return err
	}
	if err := unix.PidfdSendSignal(pfd, unix.SIGTERM, nil, 0); err != nil {
		if errors.Is(err, unix.ESRCH) {
			return nil
		}
		return fmt.Errorf("SIGTERM %v: %w", id, err)
	}
	gone, err := waitPidfd(pfd, grace)
	if err != nil || gone {
		return err
	}
	if err := unix.PidfdSendSignal(pfd, unix.SIGKILL, nil, 0); err != nil {
		if errors.Is(err, unix.ESRCH) {
			return nil
		}
		return fmt.Errorf("SIGKILL %v: %w", id, err)
	}
	gone, err = waitPidfd(pfd, killWait)
	if err != nil {
		return err
	}
	if !gone {
		return fmt.Errorf("%v survived SIGKILL for %v", id, killWait)
	}
	return nil
}

// waitPidfd waits up to d for the pidfd's process to exit (a zombie counts).
func waitPidfd(pfd int, d time.Duration) (bool, error) {
	deadline := time.Now().Add(d)
	for {
		left := time.Until(deadline)
		if left < 0 {
			left = 0
		}
		// Round up so a sub-millisecond remainder still waits rather than
		// spinning on zero-timeout polls.
		ms := int((left + time.Millisecond - 1) / time.Millisecond)
		fds := []unix.PollFd{{Fd: int32(pfd), Events: unix.POLLIN}}
		n, err := unix.Poll(fds, ms)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return false, fmt.Errorf("poll pidfd: %w", err)
		}
		if n > 0 {
			return true, nil
		}
		if left == 0 {
			return false, nil
		}
	}
}

func terminateByProc(id Identity, grace time.Duration) error {
	for _, step := range []struct {
		sig  syscall.Signal
		wait time.Duration
	}{{unix.SIGTERM, grace}, {unix.SIGKILL, killWait}} {
		// The check and the kill are two steps; the pid could be reused in
		// between. Without pidfds that window cannot be closed, only kept short.
		if alive, err := Alive(id); err != nil || !alive {
			return err
		}
		if err := unix.Kill(id.Pid, step.sig); err != nil {
			if errors.Is(err, unix.ESRCH) {
				return nil
			}
			return fmt.Errorf("%v %v: %w", step.sig, id, err)
		}
		gone, err := pollGone(id, step.wait)
		if err != nil || gone {
			return err
		}
	}
	return fmt.Errorf("%v survived SIGKILL for %v", id, killWait)
}

// pollGone polls /proc because a non-child's exit sends us nothing.
func pollGone(id Identity, d time.Duration) (bool, error) {
	deadline := time.Now().Add(d)
	for {
		alive, err := Alive(id)
		if err != nil {
			return false, err
		}
		if !alive {
			return true, nil
		}
		if time.Now().After(deadline) {
			return false, nil
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// SpawnDetached starts argv in a session of its own, so that neither our exit
// nor a hangup or ^C on our terminal reaches it. Its stdin is /dev/null and its
// stdout and stderr append to logPath (created 0600). env nil means our
// environment, as with exec.Cmd. While we live, a goroutine reaps it, so it
// never lingers as a zombie that would hold its pid.
func SpawnDetached(argv []string, env []string, logPath string) (Identity, error) {
	if len(argv) == 0 {
		return Identity{}, errors.New("spawn: empty argv")
	}
	logf, err := os.OpenFile(logPath, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600)
	if err != nil {
		return Identity{}, fmt.Errorf("spawn %s: log: %w", argv[0], err)
	}
	// The child has its own copy of the descriptor after Start.
	defer logf.Close()
	return SpawnDetachedTo(argv, env, logf)
}

// SpawnDetachedTo is SpawnDetached with stdout and stderr going to logf,
// which the caller opened (nexus opens its own logs through fsx, so a
// planted link or FIFO is refused) and still owns.
func SpawnDetachedTo(argv []string, env []string, logf *os.File) (Identity, error) {
	if len(argv) == 0 {
		return Identity{}, errors.New("spawn: empty argv")
	}
	return spawn(argv, env, logf, nil, nil)
}

type stat struct {
	state      byte
	startTicks uint64
}

// readStat is the one reader of /proc/<pid>/stat: every identity, liveness
// and state answer of this package comes from it. A pid nobody has (or
// whose process exits mid-read) is ErrGone. It is a raw open/read/close:
// os.ReadFile's extra fstat, poller registration and second read would
// double the syscalls, which is the whole cost of judging many pids at
// once; fields 3 and 22 always lie within the buffer.
func readStat(pid int) (stat, error) {
	if pid <= 0 {
		return stat{}, fmt.Errorf("invalid pid %d", pid)
	}
	var buf [1024]byte
	fd, err := unix.Open("/proc/"+strconv.Itoa(pid)+"/stat", unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if errors.Is(err, unix.ENOENT) || errors.Is(err, unix.ESRCH) {
		return stat{}, fmt.Errorf("pid %d: %w", pid, ErrGone)
	}
	if err != nil {
		return stat{}, fmt.Errorf("/proc/%d/stat: %w", pid, err)
	}
	n, err := unix.Read(fd, buf[:])
	unix.Close(fd)
	if errors.Is(err, unix.ESRCH) {
		// The process exited between open and read.
		return stat{}, fmt.Errorf("pid %d: %w", pid, ErrGone)
	}
	if err != nil {
		return stat{}, fmt.Errorf("/proc/%d/stat: %w", pid, err)
	}
	st, err := parseStat(buf[:n])
	if err != nil {
		return stat{}, fmt.Errorf("/proc/%d/stat: %w", pid, err)
	}
	return st, nil
}

// parseStat reads state (field 3) and starttime (field 22). The comm field
// (2) is the executable's name in parentheses, unescaped: it may hold spaces,
// ')' and even newlines, so only the last ')' reliably ends it.
func parseStat(data []byte) (stat, error) {
	end := bytes.LastIndexByte(data, ')')
	if end < 0 {
		return stat{}, errors.New("no ')' after comm")
	}
	fields := bytes.Fields(data[end+1:])
	// fields[0] is field 3 (state), so field 22 is fields[19].
	if len(fields) < 20 {
		return stat{}, fmt.Errorf("%d fields after comm, want at least 20", len(fields))
	}
	if len(fields[0]) != 1 {
		return stat{}, fmt.Errorf("bad state %q", fields[0])
	}
	ticks, err := strconv.ParseUint(string(fields[19]), 10, 64)
	if err != nil {
		return stat{}, fmt.Errorf("bad starttime: %w", err)
	}
	return stat{state: fields[0][0], startTicks: ticks}, nil
}
