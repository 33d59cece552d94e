package lifecycle

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/nexus-sandbox/nexus/host/fsx"
	"github.com/nexus-sandbox/nexus/host/proc"
)

// Launcher starts a sandbox's processes: its perimeter supervisor and its
// VMM. It is the one host operation of the flows that needs the nexus
// binary (both are subcommands of it) or a hypervisor; everything else
// they do is files beneath the state root, journal appends through the
// Backend and calls on the processes' sockets. Declaring it here lets the
// flows' tests start processes of their own, or fail a start on purpose.
// Spawner is the production one.
type Launcher interface {
	// Launch starts l.Argv and returns once l.Ready answers. It returns
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
	// Ready succeeds once the process serves (a socket answering).
	Ready func(ctx context.Context) error
}

// ErrNoLauncher refuses a flow that would start a process on a Manager
// built without a Launcher.
var ErrNoLauncher = errors.New("lifecycle: the manager has no Launcher to start processes with")

// Spawner launches the process itself: detached, in a session of its own,
// its output appended to its log.
type Spawner struct{}

// Launch implements Launcher.
func (Spawner) Launch(ctx context.Context, l Launch) (proc.Identity, error) {
	who, err := spawnLogged(l.Root, l.Argv, l.Log)
	if err != nil {
		return proc.Identity{}, fmt.Errorf("spawn %s: %w", l.What, err)
	}
	return who, waitFor(ctx, who, l.Timeout, l.What, l.Ready)
}

// spawnLogged starts argv detached, appending its output to logPath, a log
// under root's logs/ opened without following a link (fsx).
func spawnLogged(root string, argv []string, logPath string) (proc.Identity, error) {
	if err := fsx.MkdirAll(root, "logs", 0o700); err != nil {
		return proc.Identity{}, fmt.Errorf("log: %w", err)
	}
	logf, err := fsx.OpenFile(root, logPath, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600)
	if err != nil {
		return proc.Identity{}, fmt.Errorf("log: %w", err)
	}
	defer logf.Close() // the child holds its own copy
	// The log is journaled as the sandbox's: its name must outlive a
	// power cut as the event does.
	if err := syncDirOf(root, logPath); err != nil {
		return proc.Identity{}, fmt.Errorf("log: %w", err)
	}
	return proc.SpawnDetachedTo(argv, os.Environ(), logf)
}

// launch starts a process through m.Launcher.
func (m *Manager) launch(ctx context.Context, what string, argv []string, log string, ready func(context.Context) error) (proc.Identity, error) {
	if m.Launcher == nil {
		return proc.Identity{}, ErrNoLauncher
	}
	return m.Launcher.Launch(ctx, Launch{What: what, Argv: argv, Root: string(m.Root), Log: log, Timeout: m.startTimeout(), Ready: ready})
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
