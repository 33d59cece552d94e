package lifecycle

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/nexus-sandbox/nexus/host/driver"
	"github.com/nexus-sandbox/nexus/host/fsx"
	"github.com/nexus-sandbox/nexus/host/proc"
	"github.com/nexus-sandbox/nexus/host/supervisor"
	"github.com/nexus-sandbox/nexus/oneline"
)

// Launcher starts a sandbox's processes: its perimeter supervisor and its
// VMM. It is the one host operation of the flows that needs the nexus
// binary (both are subcommands of it) or a hypervisor; everything else
// they do is files beneath the state root, journal appends through the
// Backend and calls on the processes' sockets. Declaring it here lets the
// flows' tests start processes of their own, or fail a start on purpose.
// Spawner is the production one.
type Launcher interface {
	// Launch starts l.Argv and returns once it serves: once it says so
	// on its readiness pipe (l.Signals), else once l.Ready answers. It returns
	// the identity of the process it started (zero if none started) even
	// with an error: what to do with a process that did not answer is
	// the flow's decision.
	Launch(ctx context.Context, l Launch) (proc.Identity, error)
}

// Launch is one process a flow starts.
type Launch struct {
	// What names it in messages ("supervisor", "VMM").
	What string
	Argv []string
	// Root is the state root, and Log the log beneath it (absolute) that
	// its output is appended to.
	Root, Log string
	// Timeout bounds how long it may take to answer.
	Timeout time.Duration
	// Signals says the process is nexus's own and says when it serves on
	// the readiness pipe it inherits (proc.SpawnReady); Ready is then not
	// asked.
	Signals bool
	// Ready succeeds once the process serves (a socket answering): how a
	// process that does not signal (cloud-hypervisor) is waited for.
	Ready func(ctx context.Context) error
}

// ShimCommands are the commands of nexus-shim that run a sandbox's own
// processes (the supervisor and the process and qemu drivers' VMMs);
// nexusd serves the same ones, for a process started by hand.
var ShimCommands = []string{supervisor.Command, driver.ProcessCommand, driver.QEMUCommand}

// ErrNoLauncher refuses a flow that would start a process on a Manager
// built without a Launcher.
var ErrNoLauncher = errors.New("lifecycle: the manager has no Launcher to start processes with")

// Spawner launches the process itself: detached, in a session of its own,
// its output appended to its log.
type Spawner struct{}

// Launch implements Launcher.
func (Spawner) Launch(ctx context.Context, l Launch) (proc.Identity, error) {
	logf, err := openLog(l.Root, l.Log)
	if err != nil {
		return proc.Identity{}, fmt.Errorf("spawn %s: %w", l.What, err)
	}
	defer logf.Close() // the child holds its own copy
	// What the log holds already is earlier processes' output.
	var before int64
	if fi, err := logf.Stat(); err == nil {
		before = fi.Size()
	}
	if !l.Signals {
		who, err := proc.SpawnDetachedTo(l.Argv, os.Environ(), logf)
		if err != nil {
			return proc.Identity{}, fmt.Errorf("spawn %s: %w", l.What, err)
		}
		if err := waitFor(ctx, who, l.Timeout, l.What, l.Ready); err != nil {
			if ctx.Err() != nil {
				return who, err
			}
			return who, fmt.Errorf("%w: %s", err, logTail(l.Root, l.Log, before))
		}
		return who, nil
	}
	who, rd, err := proc.SpawnReady(l.Argv, os.Environ(), logf)
	if err != nil {
		return who, fmt.Errorf("spawn %s: %w", l.What, err)
	}
	defer rd.Close()
	if err := rd.Wait(ctx, l.Timeout); err != nil {
		if ctx.Err() != nil {
			return who, err
		}
		return who, fmt.Errorf("%s %v: %s", l.What, err, logTail(l.Root, l.Log, before))
	}
	return who, nil
}

// openLog opens logPath, a log under root's logs/, for appending, without
// following a link (fsx).
func openLog(root, logPath string) (*os.File, error) {
	if err := fsx.MkdirAll(root, "logs", 0o700); err != nil {
		return nil, fmt.Errorf("log: %w", err)
	}
	logf, err := fsx.OpenFile(root, logPath, os.O_WRONLY|os.O_APPEND, 0)
	if err == nil {
		// Made by a boot's logs step, which fsynced logs/ before the
		// journal claimed it, or created below by an earlier launch.
		return logf, nil
	}
	if !errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("log: %w", err)
	}
	logf, err = fsx.OpenFile(root, logPath, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("log: %w", err)
	}
	// The log is journaled as the sandbox's: its name must outlive a
	// power cut as the event does.
	if err := syncDirOf(root, logPath); err != nil {
		logf.Close()
		return nil, fmt.Errorf("log: %w", err)
	}
	return logf, nil
}

// tailBytes bounds what a failed start quotes of its process's log.
const tailBytes = 2048

// logTail is the end of what a process wrote to its log from offset from
// on, as one line that names the log: what it said before it failed to
// serve.
func logTail(root, logPath string, from int64) string {
	f, err := fsx.OpenFile(root, logPath, os.O_RDONLY, 0)
	if err != nil {
		return fmt.Sprintf("its log %s is unreadable: %v", logPath, err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return fmt.Sprintf("its log %s is unreadable: %v", logPath, err)
	}
	off := max(fi.Size()-tailBytes, from, 0)
	buf := make([]byte, max(fi.Size()-off, 0))
	n, _ := f.ReadAt(buf, off)
	if strings.TrimSpace(string(buf[:n])) == "" {
		return fmt.Sprintf("it wrote nothing to its log %s", logPath)
	}
	return fmt.Sprintf("its log %s ends: %s", logPath, oneline.Of(string(buf[:n])))
}

// launch starts a process through m.Launcher.
func (m *Manager) launch(ctx context.Context, what string, argv []string, log string, signals bool, ready func(context.Context) error) (proc.Identity, error) {
	if m.Launcher == nil {
		return proc.Identity{}, ErrNoLauncher
	}
	return m.Launcher.Launch(ctx, Launch{What: what, Argv: argv, Root: string(m.Root), Log: log, Timeout: m.startTimeout(), Signals: signals, Ready: ready})
}

// syncDirOf fsyncs the directory holding path, beneath root.
func syncDirOf(root, path string) error {
	d, err := fsx.OpenDir(root, filepath.Dir(path))
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}
