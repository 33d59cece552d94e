package proc

import (
	"context"
	"errors"
	"fmt"
	"os"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Exit is how a process ended, as far as the watching process can know.
// Only a parent learns the exit status; for anyone else Known is false.
type Exit struct {
	Known  bool
	Code   int            // exit code, when it exited (Signal == 0)
	Signal syscall.Signal // the signal that ended it, or 0
}

func (x Exit) String() string {
	switch {
	case !x.Known:
		return "status unknown"
	case x.Signal != 0:
		return "killed by " + unix.SignalName(x.Signal)
	default:
		return fmt.Sprintf("exit status %d", x.Code)
	}
}

// WaitExit returns once id's process has ended (a zombie has ended), or
// with ctx's error when ctx is done first. A pid that is gone already, or
// that now names a process with another start time, has ended: the
// process id named is gone. It waits on a pidfd through Go's netpoller, so
// any number of waits cost no thread each; the exit status is read
// (without reaping) only when the caller is the parent.
func WaitExit(ctx context.Context, id Identity) (Exit, error) {
	pfd, err := unix.PidfdOpen(id.Pid, unix.PIDFD_NONBLOCK)
	switch {
	case errors.Is(err, unix.ESRCH):
		return Exit{}, nil
	case errors.Is(err, unix.ENOSYS), errors.Is(err, unix.EPERM), errors.Is(err, unix.EINVAL):
		// Old kernel, seccomp filter, or not a thread-group leader.
		return Exit{}, waitByProc(ctx, id)
	case err != nil:
		return Exit{}, fmt.Errorf("pidfd_open %d: %w", id.Pid, err)
	}
	// A non-blocking descriptor handed to os.NewFile is registered with
	// the netpoller; the pidfd turns readable when its process exits.
	f := os.NewFile(uintptr(pfd), "pidfd")
	defer f.Close()
	// Checked after the open, as in Terminate: if /proc shows id's start
	// time now, the pidfd is id's process.
	st, err := readStat(id.Pid)
	if errors.Is(err, ErrGone) || (err == nil && st.startTicks != id.StartTicks) {
		return Exit{}, nil
	}
	if err != nil {
		return Exit{}, err
	}
	rc, err := f.SyscallConn()
	if err != nil {
		return Exit{}, err
	}
	stop := context.AfterFunc(ctx, func() { f.SetReadDeadline(time.Now()) })
	defer stop()
	var x Exit
	err = rc.Read(func(fd uintptr) bool {
		fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
		if n, err := unix.Poll(fds, 0); err != nil || n == 0 {
			return false // not yet: wait for the netpoller
		}
		x = statusOf(int(fd))
		return true
	})
	switch {
	case err == nil:
		return x, nil
	case ctx.Err() != nil:
		return Exit{}, ctx.Err()
	default:
		// The descriptor could not be polled: fall back to /proc.
		return Exit{}, waitByProc(ctx, id)
	}
}

// sigchld is the SIGCHLD layout of siginfo_t on 64-bit Linux (the union
// starts 8-aligned, after signo, errno and code).
type sigchld struct {
	signo, errno, code int32
	_                  int32
	pid                int32
	uid                uint32
	status             int32
	_                  [100]byte
}

// si_code values of SIGCHLD.
const (
	cldExited = 1
	cldKilled = 2
	cldDumped = 3
)

// statusOf reads the exit status of the pidfd's process without reaping
// it (WNOWAIT), which the kernel allows only its parent; anyone else, or a
// parent whose child was reaped already, gets ECHILD and an unknown status.
func statusOf(pfd int) Exit {
	if unsafe.Sizeof(uintptr(0)) != 8 {
		return Exit{}
	}
	var info sigchld
	err := unix.Waitid(unix.P_PIDFD, pfd, (*unix.Siginfo)(unsafe.Pointer(&info)), unix.WEXITED|unix.WNOHANG|unix.WNOWAIT, nil)
	if err != nil || info.pid == 0 {
		return Exit{}
	}
	switch info.code {
	case cldExited:
		return Exit{Known: true, Code: int(info.status)}
	case cldKilled, cldDumped:
		return Exit{Known: true, Signal: syscall.Signal(info.status)}
	}
	return Exit{}
}

// waitByProc polls /proc: without a pidfd, a non-child's exit sends us
// nothing. It backs off to one read a second.
func waitByProc(ctx context.Context, id Identity) error {
	for delay := 10 * time.Millisecond; ; delay = min(2*delay, time.Second) {
		alive, err := Alive(id)
		if err != nil {
			return err
		}
		if !alive {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(delay):
		}
	}
}
