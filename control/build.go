package control

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime/debug"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// Build identifies the nexus executable a process runs. A daemon and a
// command agree only if they run the same file: replacing the binary (an
// upgrade) gives the new one another inode, size or mtime, even when the
// version stamped in it is the same (a local build, a rebuilt tag). The
// version and revision are for people; Same never looks at them.
type Build struct {
	Dev     uint64 `json:"dev"`
	Ino     uint64 `json:"inode"`
	Size    int64  `json:"size_bytes"`
	MtimeNs int64  `json:"mtime_ns"`
	// Path is where the executable was when the process started; an
	// upgraded binary shows " (deleted)" after it.
	Path     string `json:"path,omitempty"`
	Version  string `json:"version,omitempty"`
	Revision string `json:"revision,omitempty"`
	Modified bool   `json:"modified,omitempty"`
}

// Same is whether b and o are the same executable file.
func (b Build) Same(o Build) bool {
	return b.Dev == o.Dev && b.Ino == o.Ino && b.Size == o.Size && b.MtimeNs == o.MtimeNs
}

// String is the one-line form: "devel rev 0123abcd4567 (/usr/bin/nexus,
// inode 1234, 5678 bytes, 2026-12-04T21:55:54Z)".
func (b Build) String() string {
	var s strings.Builder
	s.WriteString(cmp.Or(b.Version, "unknown"))
	if b.Revision != "" {
		fmt.Fprintf(&s, " rev %.12s", b.Revision)
		if b.Modified {
			s.WriteString("+")
		}
	}
	fmt.Fprintf(&s, " (%s, inode %d, %d bytes, %s)", cmp.Or(b.Path, "?"), b.Ino, b.Size,
		time.Unix(0, b.MtimeNs).UTC().Format(time.RFC3339))
	return s.String()
}

// selfBuild is computed once per process. /proc/self/exe is the file this
// process was executed from, even after it was renamed over or deleted, so
// a daemon that outlived an upgrade still reports the build it runs.
var selfBuild = sync.OnceValues(func() (Build, error) {
	var st unix.Stat_t
	if err := unix.Stat("/proc/self/exe", &st); err != nil {
		return Build{}, fmt.Errorf("identify this executable: %w", err)
	}
	b := Build{Dev: st.Dev, Ino: st.Ino, Size: st.Size, MtimeNs: st.Mtim.Nano()}
	b.Path, _ = os.Readlink("/proc/self/exe")
	if bi, ok := debug.ReadBuildInfo(); ok {
		b.Version = bi.Main.Version
		if b.Version == "(devel)" {
			b.Version = "devel"
		}
		for _, kv := range bi.Settings {
			switch kv.Key {
			case "vcs.revision":
				b.Revision = kv.Value
			case "vcs.modified":
				b.Modified = kv.Value == "true"
			}
		}
	}
	return b, nil
})

// SelfBuild is this process's build.
func SelfBuild() (Build, error) { return selfBuild() }

// selfBuildRef is SelfBuild for a Status: nil if it cannot be known.
func selfBuildRef() *Build {
	b, err := selfBuild()
	if err != nil {
		return nil
	}
	return &b
}

// sameBuild is whether a daemon reporting st runs this process's build. A
// daemon that reports none is older than build identities, so another
// build. A process that cannot identify itself (no /proc) cannot tell, and
// keeps the behaviour from before builds were compared.
func sameBuild(st Status) bool {
	self, err := selfBuild()
	if err != nil {
		return true
	}
	return st.Build != nil && st.Build.Same(self)
}

// OtherBuildError is a daemon started by hand that runs another build than
// the command: it is never used silently and never retired by a command.
type OtherBuildError struct {
	Root   string
	Pid    int
	Daemon *Build // nil: a daemon too old to say
	Self   Build
}

func (e *OtherBuildError) Error() string {
	d := "an older nexus that does not report its build"
	if e.Daemon != nil {
		d = e.Daemon.String()
	}
	return fmt.Sprintf("the daemon on %s (pid %d) runs another nexus build (daemon: %s; this command: %s); restart it: stop it (kill %d) and start `nexus daemon` again with this nexus",
		e.Root, e.Pid, d, e.Self, e.Pid)
}

// otherBuild is the refusal for a hand-started daemon reporting st.
func otherBuild(root string, st Status) error {
	self, _ := selfBuild()
	return &OtherBuildError{Root: root, Pid: st.Pid, Daemon: st.Build, Self: self}
}

// ErrNoDaemon is a state root no daemon answers for.
var ErrNoDaemon = errors.New("no daemon serves")

// DaemonStatus asks root's daemon who it is (a retiring one too), without
// starting one.
func DaemonStatus(ctx context.Context, root string) (Status, error) {
	abs, err := filepath.Abs(root)
	if err != nil {
		return Status{}, err
	}
	sock := filepath.Join(abs, SocketName)
	if _, err := os.Lstat(sock); err != nil {
		return Status{}, fmt.Errorf("%w %s", ErrNoDaemon, abs)
	}
	c := NewClient(sock)
	defer c.Close()
	sctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	st, err := c.Status(sctx)
	if err != nil {
		return Status{}, fmt.Errorf("%w %s: %v", ErrNoDaemon, abs, err)
	}
	return st, nil
}
