package agent

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// FIFREEZE and FITHAW are _IOWR('X', 119, int) and _IOWR('X', 120, int)
// from linux/fs.h; x/sys/unix does not define them.
const (
	ioctlFIFREEZE = 0xC0045877
	ioctlFITHAW   = 0xC0045878
)

// frozenFS is one filesystem this agent froze, held by a descriptor of its
// mount point so that thaw reaches the same filesystem whatever the mount
// table says by then.
type frozenFS struct {
	path string
	f    *os.File
}

// freezer owns the frozen state, which is the guest's, not a session's.
type freezer struct {
	mounts func() ([]string, error) // what to freeze

	mu     sync.Mutex
	frozen []frozenFS
	timer  *time.Timer
	gen    uint64 // which freeze the running timer belongs to
}

// Freeze syncs, then freezes every target (or, when already frozen, moves
// the deadline). A failure thaws what this call froze.
func (z *freezer) Freeze(deadline time.Duration) ([]string, error) {
	z.mu.Lock()
	defer z.mu.Unlock()
	if len(z.frozen) == 0 {
		targets, err := z.mounts()
		if err != nil {
			return nil, err
		}
		unix.Sync()
		seen := map[uint64]bool{}
		for _, p := range targets {
			f, err := os.Open(p)
			if err != nil {
				z.thawLocked()
				return nil, fmt.Errorf("freeze %s: %w", p, err)
			}
			var st unix.Stat_t
			if err := unix.Fstat(int(f.Fd()), &st); err != nil {
				f.Close()
				z.thawLocked()
				return nil, fmt.Errorf("freeze %s: %w", p, err)
			}
			// One filesystem mounted twice is frozen once: a second
			// FIFREEZE would fail with EBUSY.
			if seen[st.Dev] {
				f.Close()
				continue
			}
			seen[st.Dev] = true
			if err := ioctl(f, ioctlFIFREEZE); err != nil {
				f.Close()
				z.thawLocked()
				return nil, fmt.Errorf("freeze %s: FIFREEZE: %w", p, err)
			}
			z.frozen = append(z.frozen, frozenFS{path: p, f: f})
		}
	}
	z.gen++
	gen := z.gen
	if z.timer != nil {
		z.timer.Stop()
	}
	z.timer = time.AfterFunc(deadline, func() {
		z.mu.Lock()
		defer z.mu.Unlock()
		if z.gen == gen {
			z.thawLocked()
		}
	})
	return z.paths(), nil
}

func (z *freezer) paths() []string {
	out := make([]string, len(z.frozen))
	for i, f := range z.frozen {
		out[i] = f.path
	}
	return out
}

// Thaw thaws everything frozen and returns the mount points.
func (z *freezer) Thaw() ([]string, error) {
	z.mu.Lock()
	defer z.mu.Unlock()
	return z.thawLocked()
}

func (z *freezer) thawLocked() ([]string, error) {
	z.gen++
	if z.timer != nil {
		z.timer.Stop()
		z.timer = nil
	}
	paths := z.paths()
	var errs []error
	// Newest first, the reverse of freezing.
	for i := len(z.frozen) - 1; i >= 0; i-- {
		fs := z.frozen[i]
		// EINVAL: not frozen (someone else thawed it); nothing is held.
		if err := ioctl(fs.f, ioctlFITHAW); err != nil && !errors.Is(err, unix.EINVAL) {
			errs = append(errs, fmt.Errorf("thaw %s: %w", fs.path, err))
		}
		fs.f.Close()
	}
	z.frozen = nil
	return paths, errors.Join(errs...)
}

func ioctl(f *os.File, req uintptr) error {
	c, err := f.SyscallConn()
	if err != nil {
		return err
	}
	var errno unix.Errno
	if err := c.Control(func(fd uintptr) {
		_, _, errno = unix.Syscall(unix.SYS_IOCTL, fd, req, 0)
	}); err != nil {
		return err
	}
	if errno != 0 {
		return errno
	}
	return nil
}

// NexusMounts lists the mount points of writable filesystems on disks
// whose serial starts "nexus-", from /proc/self/mountinfo, in mount order.
func NexusMounts() ([]string, error) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		// id parent major:minor root mountpoint options ... - fstype source super
		fields := strings.Fields(sc.Text())
		if len(fields) < 6 {
			continue
		}
		if !hasOpt(fields[5], "rw") {
			continue
		}
		serial, err := os.ReadFile("/sys/dev/block/" + fields[2] + "/serial")
		if err != nil {
			// A partition's serial is its disk's.
			serial, err = os.ReadFile("/sys/dev/block/" + fields[2] + "/../serial")
		}
		if err != nil || !strings.HasPrefix(strings.TrimSpace(string(serial)), "nexus-") {
			continue
		}
		out = append(out, unescapeMount(fields[4]))
	}
	return out, sc.Err()
}

func hasOpt(opts, want string) bool {
	for _, o := range strings.Split(opts, ",") {
		if o == want {
			return true
		}
	}
	return false
}

// unescapeMount undoes mountinfo's octal escapes (\040 for a space).
func unescapeMount(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			var v int
			if _, err := fmt.Sscanf(s[i+1:i+4], "%03o", &v); err == nil {
				b.WriteByte(byte(v))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}
