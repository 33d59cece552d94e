package lease

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/nexus-sandbox/nexus/host/proc"
)

// AcquireShared takes a shared flock on path (created 0600 if missing),
// waiting while an exclusive holder has it, until ctx is done. Many shared
// holders may hold it at once; an exclusive TryAcquire fails while any does.
func AcquireShared(ctx context.Context, path string) (*Lease, error) {
	f, err := openLeaseFile(path)
	if err != nil {
		return nil, err
	}
	backoff := 2 * time.Millisecond
	for {
		err := unix.Flock(int(f.Fd()), unix.LOCK_SH|unix.LOCK_NB)
		if err == nil {
			return &Lease{f: f}, nil
		}
		if !errors.Is(err, unix.EWOULDBLOCK) {
			f.Close()
			return nil, fmt.Errorf("flock %s: %w", path, err)
		}
		// Polling rather than a blocking flock keeps the wait cancellable;
		// the exclusive holder (a prune) is short-lived.
		select {
		case <-ctx.Done():
			f.Close()
			return nil, fmt.Errorf("%s: %w%s: %w", path, ErrHeld, holdersSuffix(path), ctx.Err())
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 100*time.Millisecond)
	}
}

// LockHolder describes one process holding a flock, from the kernel's table.
type LockHolder struct {
	Pid       int
	Exclusive bool
	Command   string // argv joined by spaces, "" if unreadable
	// State is the process's state letter from /proc/<pid>/stat ('R',
	// 'S', 'D', 'T' stopped by a signal, ...), 0 if it no longer runs: the
	// kernel names the process that took a flock, and a descendant that
	// inherited the descriptor keeps it held after that process is gone.
	State byte
}

func (h LockHolder) String() string {
	mode := "shared"
	if h.Exclusive {
		mode = "exclusive"
	}
	if h.Command == "" {
		return fmt.Sprintf("pid %d (%s)", h.Pid, mode)
	}
	return fmt.Sprintf("pid %d (%s: %s)", h.Pid, mode, h.Command)
}

// Holders lists the processes the kernel says hold a flock on path, read
// from /proc/locks. Unlike a pid written into the file it covers every
// shared holder and can never name a process that already died.
func Holders(path string) ([]LockHolder, error) {
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		return nil, err
	}
	f, err := os.Open("/proc/locks")
	if err != nil {
		return nil, err
	}
	defer f.Close()
	// /proc/locks names the file as MAJOR:MINOR:INODE, the device in hex.
	want := fmt.Sprintf("%02x:%02x:%d", unix.Major(st.Dev), unix.Minor(st.Dev), st.Ino)
	var out []LockHolder
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		// "N: FLOCK ADVISORY READ|WRITE PID MAJ:MIN:INO 0 EOF"; waiters
		// carry "->" after the index and hold nothing.
		if len(fields) < 6 || fields[1] != "FLOCK" || fields[5] != want {
			continue
		}
		pid, err := strconv.Atoi(fields[4])
		if err != nil || pid <= 0 {
			continue
		}
		out = append(out, LockHolder{Pid: pid, Exclusive: fields[3] == "WRITE", Command: command(pid), State: state(pid)})
	}
	return out, sc.Err()
}

func command(pid int) string {
	argv, err := proc.Args(pid)
	if err != nil {
		return ""
	}
	return strings.TrimSpace(strings.Join(argv, " "))
}

// state is pid's state letter, 0 if it is gone or unreadable.
func state(pid int) byte {
	s, err := proc.State(pid)
	if err != nil {
		return 0
	}
	return s
}

// Holding is what a process waiting for a flock can learn of who holds it.
type Holding struct {
	// Holders is the kernel's answer (/proc/locks), nil with HoldersErr
	// set if it could not be read. Empty without an error, the lock was
	// released meanwhile or its holder is in a pid namespace this process
	// cannot see (the kernel then hides it).
	Holders    []LockHolder
	HoldersErr error
	// Recorded is the pid the last holder wrote into the file, with its
	// command and state now (Pid 0 if none). It is only a claim: the
	// holder writes it just after taking the flock, and nothing erases it
	// when the flock is dropped, so it may name an earlier holder or a
	// process that reused the pid.
	Recorded LockHolder
}

// Who reads who holds path's flock, for a message to a person waiting.
func Who(path string) Holding {
	var h Holding
	h.Holders, h.HoldersErr = Holders(path)
	if pid := Holder(path); pid > 0 {
		h.Recorded = LockHolder{Pid: pid, Command: command(pid), State: state(pid)}
	}
	return h
}

func holdersSuffix(path string) string {
	hs, err := Holders(path)
	if err != nil || len(hs) == 0 {
		return holderSuffix(path)
	}
	names := make([]string, len(hs))
	for i, h := range hs {
		names[i] = h.String()
	}
	return " (by " + strings.Join(names, ", ") + ")"
}

// TryAcquireNaming is TryAcquire whose refusal names every holder the
// kernel knows of, shared holders included.
func TryAcquireNaming(path string) (*Lease, error) {
	l, err := TryAcquire(path)
	if errors.Is(err, ErrHeld) {
		return nil, fmt.Errorf("%s: %w%s", path, ErrHeld, holdersSuffix(path))
	}
	return l, err
}
