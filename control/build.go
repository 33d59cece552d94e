package control

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime/debug"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/nexus-sandbox/nexus/control/wire"
)

// selfExe is the executable whose build this process speaks for: its own
// (/proc/self/exe), or the daemon binary a command starts (IdentifyAs).
var selfExe = "/proc/self/exe"

// IdentifyAs makes this process's build the build of the executable at
// exe: a command that starts its daemon from another binary matches a
// daemon by that binary. Called before any connection.
func IdentifyAs(exe string) { selfExe = exe }

// selfBuild is computed once per process. /proc/self/exe is the file this
// process was executed from, even after it was renamed over or deleted, so
// a daemon that outlived an upgrade still reports the build it runs.
var selfBuild = sync.OnceValues(func() (wire.Build, error) {
	var st unix.Stat_t
	if err := unix.Stat(selfExe, &st); err != nil {
		return wire.Build{}, fmt.Errorf("identify this executable: %w", err)
	}
	b := wire.Build{Dev: st.Dev, Ino: st.Ino, Size: st.Size, MtimeNs: st.Mtim.Nano()}
	b.Path = selfExe
	if selfExe == "/proc/self/exe" {
		b.Path, _ = os.Readlink(selfExe)
	}
	if bi, ok := debug.ReadBuildInfo(); ok {
		st := wire.StampOf(bi)
		b.Version, b.Revision, b.Modified = st.Version, st.Revision, st.Modified
	}
	return b, nil
})

// SelfBuild is this process's build.
func SelfBuild() (wire.Build, error) { return selfBuild() }

// sameBuild is whether a daemon reporting st runs this process's build. A
// daemon that reports none is older than build identities, so another
// build. A process that cannot identify itself (no /proc) cannot tell, and
// keeps the behaviour from before builds were compared.
func sameBuild(st wire.Status) bool {
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
	Daemon *wire.Build // nil: a daemon too old to say
	Self   wire.Build
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
func otherBuild(root string, st wire.Status) error {
	self, _ := selfBuild()
	return &OtherBuildError{Root: root, Pid: st.Pid, Daemon: st.Build, Self: self}
}

// ErrNoDaemon is a state root no daemon answers for.
var ErrNoDaemon = errors.New("no daemon serves")

// DaemonStatus asks root's daemon who it is (a retiring one too), without
// starting one.
func DaemonStatus(ctx context.Context, root string) (wire.Status, error) {
	abs, err := filepath.Abs(root)
	if err != nil {
		return wire.Status{}, err
	}
	sock := filepath.Join(abs, wire.SocketName)
	if _, err := os.Lstat(sock); err != nil {
		return wire.Status{}, fmt.Errorf("%w %s", ErrNoDaemon, abs)
	}
	c := NewClient(sock)
	defer c.Close()
	sctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	st, err := c.Status(sctx)
	if err != nil {
		return wire.Status{}, fmt.Errorf("%w %s: %v", ErrNoDaemon, abs, err)
	}
	return st, nil
}

// DaemonMetrics copies root's daemon's Prometheus metrics (the text
// exposition of wire.PathMetrics) to w.
func DaemonMetrics(ctx context.Context, root string, w io.Writer) error {
	st, err := DaemonStatus(ctx, root)
	if err != nil {
		return err
	}
	c := NewClient(filepath.Join(st.Root, wire.SocketName))
	defer c.Close()
	return c.Metrics(ctx, w)
}

// StopDaemon asks root's daemon, however it was started, to finish with
// the commands it has and exit, and waits until it no longer answers (or
// ctx ends). It returns the daemon's status from before the request.
func StopDaemon(ctx context.Context, root string) (wire.Status, error) {
	st, err := DaemonStatus(ctx, root)
	if err != nil {
		return st, err
	}
	c := NewClient(filepath.Join(st.Root, wire.SocketName))
	err = c.Stop(ctx)
	c.Close()
	if err != nil {
		return st, fmt.Errorf("daemon pid %d: %w", st.Pid, err)
	}
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		if _, err := DaemonStatus(ctx, root); errors.Is(err, ErrNoDaemon) {
			return st, nil
		}
		select {
		case <-ctx.Done():
			return st, fmt.Errorf("the daemon (pid %d) is still finishing its commands and exits once they end (kill %d stops it now): %w", st.Pid, st.Pid, context.Cause(ctx))
		case <-tick.C:
		}
	}
}
