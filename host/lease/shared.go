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
		out = append(out, LockHolder{Pid: pid, Exclusive: fields[3] == "WRITE", Command: command(pid)})
	}
	return out, sc.Err()
}

func command(pid int) string {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	if err != nil {
		return ""
	}
	return strings.TrimSpace(strings.ReplaceAll(string(data), "\x00", " "))
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
