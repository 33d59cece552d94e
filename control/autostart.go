package control

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/nexus-sandbox/nexus/control/wire"
	"github.com/nexus-sandbox/nexus/host/fsx"
	"github.com/nexus-sandbox/nexus/host/lease"
)

// SpawnLockName serialises on-demand daemon starts: whoever holds its flock
// is the only process that may start a daemon for the state root.
const SpawnLockName = "daemon.lock"

// DaemonLog is where an auto-started daemon writes, relative to the root.
const DaemonLog = "logs/daemon.log"

// AutoStart says how to start a daemon when none answers.
type AutoStart struct {
	// Exe is the nexus binary; Args(root) its arguments for that root.
	Exe  string
	Args func(root string) []string
	// Ready bounds the wait for a started daemon to answer on its socket.
	Ready time.Duration
	// LockGrace is how long a command waits in silence for another that
	// holds the spawn lock (0: DefaultLockGrace); then Notice is given
	// one line naming the holder.
	LockGrace time.Duration
	Notice    func(line string)
	// LockWait bounds that wait (0: DefaultLockWait) while the holder is
	// stopped (Ctrl-Z), or cannot be seen. A holder that is running is
	// starting or replacing a daemon, bounded by its own Ready twice
	// over: the waiter gives it that long on top.
	LockWait time.Duration
	// Locked, if set, runs with the spawn lock just taken: the tests'
	// way to stop a real command while it holds the lock.
	Locked func()
	// Ensured, if set, runs once a daemon was seen answering (or was
	// started) for this command, before the command dials it: the tests'
	// way to retire that daemon at this instant.
	Ensured func()
	// Fleet is the fingerprint of the fleet settings a daemon started now
	// would mirror with (wire.Status.Fleet, "" for none). With
	// CompareFleet set, an on-demand daemon reporting another is stale
	// and replaced like a daemon of another build; unset (the settings
	// could not be read), any is taken.
	Fleet        string
	CompareFleet bool
}

// current is whether a daemon reporting st serves a new command: it runs
// this build and, if it was started on demand, this configuration's fleet
// settings. A daemon started by hand keeps the settings it was given.
func (a *AutoStart) current(st wire.Status) bool {
	return sameBuild(st) && (!st.Auto || !a.CompareFleet || st.Fleet == a.Fleet)
}

// DefaultLockGrace and DefaultLockWait are the spawn lock waits unless
// AutoStart sets others. Starting a daemon takes well under a second on an
// idle root, so 2 s of silence already means the holder is slow or stopped.
const (
	DefaultLockGrace = 2 * time.Second
	DefaultLockWait  = 30 * time.Second
)

// ConnectOptions configure ConnectWith.
type ConnectOptions struct {
	// Wait is how long to wait for a journal held by a process that serves
	// no socket (a command run with auto-start off, a daemon starting).
	Wait time.Duration
	// Auto, if set, starts a daemon on demand instead of opening the journal
	// in this process.
	Auto *AutoStart
	// Exclusive asks for the journal in this process: an auto-started daemon
	// is asked to step down once its other clients are done, a hand-started
	// one is used as it is (it never steps down).
	Exclusive bool
	// InProcess opens the store in this process when that is what the
	// options ask for; without it such a connection fails with
	// ErrInProcess.
	InProcess InProcess
}

// ConnectWith reaches the state root at root as o says. Without Auto it is
// Connect. With Auto, a command that finds no daemon starts one and talks to
// it, so no command ever holds the journal for its whole run and any number
// of them share the root at once.
func ConnectWith(ctx context.Context, root string, o ConnectOptions) (b Backend, err error) {
	defer func() {
		if err != nil && ctx.Err() != nil {
			// Whatever step the interruption cut short, no command
			// has begun: say that, not the step's "context canceled".
			err = fmt.Errorf("%w while reaching the state root %s: nothing was done", context.Cause(ctx), root)
		}
	}()
	root, err = fsx.PrepareRoot(root)
	if err != nil {
		return nil, err
	}
	switch {
	case o.Exclusive && o.Auto != nil:
		return connectOwned(ctx, root, o.Wait, o.InProcess)
	case o.Auto == nil:
		return connectLocal(ctx, root, o.Wait, o.InProcess)
	}
	sock := filepath.Join(root, wire.SocketName)
	c, st, err := dialStatus(ctx, sock)
	if final(err) {
		return nil, err
	}
	if err == nil {
		if o.Auto.current(st) {
			c.ensure = redial(root, o)
			return c, nil
		}
		c.Close()
		if !st.Auto {
			return nil, otherBuild(root, st)
		}
		// A daemon started on demand of another build, or with other
		// fleet settings than the configuration's: ensureDaemon replaces
		// it under the spawn lock, so racing commands replace it once.
	}
	for handedOver := false; ; handedOver = true {
		if err := ensureDaemon(ctx, root, o, false); err != nil {
			if ctx.Err() != nil {
				return nil, ctx.Err()
			}
			var ob *OtherBuildError
			if errors.As(err, &ob) || errors.Is(err, ErrBusy) {
				// Another build's daemon: refused, or retiring too slowly.
				// Opening the store here would only wait on it again.
				return nil, err
			}
			// No daemon: it could not open the store (damaged, newer, held by
			// a command run without auto-start), or could not be started (no
			// room for its log). Opening the store here gives the same typed
			// error as without auto-start, or the store if the failure was the
			// daemon's alone.
			b, lerr := connectLocal(ctx, root, o.Wait, o.InProcess)
			if lerr != nil {
				if errors.Is(lerr, ErrBusy) {
					return nil, fmt.Errorf("%w; %v", lerr, err)
				}
				return nil, lerr
			}
			return b, nil
		}
		if o.Auto.Ensured != nil {
			o.Auto.Ensured()
		}
		c, st, err = dialStatus(ctx, sock)
		if !(errors.Is(err, errRetiring) || gone(err)) || handedOver {
			break
		}
		// Retired (or gone) since it was seen answering: a command of
		// another build, or one that needs the journal to itself, took
		// the root. This command has asked it nothing yet, so it goes to
		// the successor, once, after the retiring one has finished.
	}
	if final(err) {
		return nil, err
	}
	if err != nil {
		return nil, fmt.Errorf("the daemon started for %s stopped answering: %w (see %s)", root, err, filepath.Join(root, DaemonLog))
	}
	if !sameBuild(st) {
		// Replaced again since ensureDaemon saw ours answer: a command of
		// another build is running beside this one.
		c.Close()
		if !st.Auto {
			return nil, otherBuild(root, st)
		}
		return nil, &replacedError{root: root, st: st}
	}
	c.ensure = redial(root, o)
	return c, nil
}

// staleWhy says why an on-demand daemon reporting st is replaced.
func staleWhy(st wire.Status) string {
	if sameBuild(st) {
		return "other fleet settings than the configuration's"
	}
	return "another nexus build"
}

// startFailed is a started daemon that exited before it answered.
type startFailed struct {
	pid int
	err error
	log string
}

func (s *startFailed) Error() string {
	return fmt.Sprintf("the daemon started on demand (pid %d) exited before answering: %v (see %s)", s.pid, s.err, s.log)
}

// replacedError is a daemon of another build that took the root between
// this command starting one of its own and connecting to it, or, for a
// command already running (redial), after its daemon went away.
type replacedError struct {
	root    string
	st      wire.Status
	running bool
}

func (e *replacedError) Error() string {
	self, _ := selfBuild()
	d := "an older nexus"
	if e.st.Build != nil {
		d = e.st.Build.String()
	}
	if e.running {
		return fmt.Sprintf("the daemon on %s now runs another nexus build (pid %d, %s; this command: %s): run the command again with the installed nexus", e.root, e.st.Pid, d, self)
	}
	return fmt.Sprintf("the daemon on %s was replaced by another nexus build's (pid %d, %s; this command: %s) while this command started: commands of two builds are running on it", e.root, e.st.Pid, d, self)
}

// redial is a client's way back to a daemon after its own went away. A
// command already running never replaces another build's daemon: it is the
// old one (an `events --follow` left from before an upgrade, say), and
// taking the root back would start a replacement every time a new command
// ran; it stops with replacedError instead.
func redial(root string, o ConnectOptions) func(context.Context) error {
	return func(ctx context.Context) error { return ensureDaemon(ctx, root, o, true) }
}

func (a *AutoStart) ready() time.Duration {
	if a.Ready <= 0 {
		return 2 * time.Minute
	}
	return a.Ready
}

// waitGone returns once no daemon answers on sock at all (a retiring one
// included), or fails after d.
func waitGone(ctx context.Context, sock string, st wire.Status, why string, d time.Duration) error {
	deadline := time.Now().Add(d)
	for {
		if _, err := os.Lstat(sock); err != nil {
			return nil
		}
		c := NewClient(sock)
		sctx, cancel := context.WithTimeout(ctx, statusWait)
		_, err := c.Status(sctx)
		cancel()
		c.Close()
		if err != nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%w: the daemon on %s (pid %d), %s, retires but still serves its commands after %s; try again once they are done", ErrBusy, filepath.Dir(sock), st.Pid, why, d)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// ensureDaemon returns once a daemon of this build answers on root's
// socket, starting one if none does. The spawn lock makes racing callers
// start exactly one: the holder dials again before starting, so whoever
// waited on the lock finds the daemon its predecessor started. A daemon of
// another build started on demand is retired here, under the lock, so two
// commands finding it replace it once; one started by hand is refused.
func ensureDaemon(ctx context.Context, root string, o ConnectOptions, running bool) error {
	sock := filepath.Join(root, wire.SocketName)
	l, err := acquireSpawnLock(ctx, filepath.Join(root, SpawnLockName), o.Auto)
	if err != nil {
		return err
	}
	defer l.Release()
	if o.Auto.Locked != nil {
		o.Auto.Locked()
	}
	c, st, err := dialStatus(ctx, sock)
	if final(err) {
		return err
	}
	if errors.Is(err, errRetiring) {
		// Retiring, retired by another command that may be starting its
		// successor right now: wait until it has finished with its
		// clients, or a daemon started now would wait on its journal and
		// give up.
		if err := waitGone(ctx, sock, st, "retired by another command", o.Auto.ready()); err != nil {
			return err
		}
		// Its successor may already answer.
		if c, st, err = dialStatus(ctx, sock); final(err) {
			return err
		}
	}
	if err == nil {
		defer c.Close()
		switch {
		case o.Auto.current(st):
			return nil
		case running && sameBuild(st):
			// A running command goes on with whatever fleet settings
			// the daemon answering now has: they change only what is
			// mirrored, not what the command is told.
			return nil
		case running:
			return &replacedError{root: root, st: st, running: true}
		case !st.Auto:
			return otherBuild(root, st)
		}
		// It finishes with the commands talking to it (drain), then
		// exits. Waiting for that here, rather than in the daemon started
		// below (which gives up on a held journal after its lock wait),
		// gives an old command as long as a daemon has to answer.
		if err := c.Retire(ctx); err != nil {
			return fmt.Errorf("retire the daemon on %s (pid %d), of %s: %w", root, st.Pid, staleWhy(st), err)
		}
		if err := waitGone(ctx, sock, st, "of "+staleWhy(st), o.Auto.ready()); err != nil {
			return err
		}
	}
	if err := spawnDaemon(ctx, root, sock, o.Auto); err != nil {
		return err
	}
	// The executable at o.Auto.Exe may not be the one this process runs
	// (replaced since it started): say so rather than replace forever.
	if c, st, err := dialStatus(ctx, sock); err == nil {
		c.Close()
		if !sameBuild(st) {
			return &replacedError{root: root, st: st, running: running}
		}
	}
	return nil
}

// acquireSpawnLock takes the spawn lock, waiting for its holder. A holder
// can be stopped (Ctrl-Z on a command, a debugger) and would then hold
// every other command on the root forever: after a's grace the wait says
// once who holds it, and it fails with ErrBusy after a's bound unless the
// holder is seen running, which it is while it starts a daemon. The flock
// is the truth; the kernel's lock table, not the pid recorded in the file,
// names the holder.
func acquireSpawnLock(ctx context.Context, path string, a *AutoStart) (*lease.Lease, error) {
	start := time.Now()
	grace, bound := a.lockGrace(), a.lockWait()
	// The holder's own bound: retiring another build's daemon, then
	// starting one, each up to ready().
	running := bound + 2*a.ready()
	noticed := false
	backoff := 2 * time.Millisecond
	for {
		l, err := lease.TryAcquire(path)
		if err == nil {
			return l, nil
		}
		if !errors.Is(err, lease.ErrHeld) {
			return nil, fmt.Errorf("daemon spawn lock: %w", err)
		}
		if waited := time.Since(start); waited >= min(grace, bound) {
			h := spawnHolder(lease.Who(path))
			if _, ok := h.holder(); !ok {
				// The holder may have let go since the try: try once
				// more before naming nobody.
				if l, err := lease.TryAcquire(path); err == nil {
					return l, nil
				}
			}
			if waited >= bound && (!h.running() || waited >= running) {
				// It waited at least the bound that applied.
				over := bound
				if h.running() {
					over = running
				}
				return nil, fmt.Errorf("%w: the daemon spawn lock %s is still held after %s by %s: %s, then run the command again",
					ErrBusy, path, over, h, h.remedy())
			}
			if !noticed && a.Notice != nil {
				noticed = true
				until := "Ctrl-C stops waiting"
				if !h.running() {
					until = fmt.Sprintf("giving up after %s unless it runs; %s", bound, until)
				}
				a.Notice(fmt.Sprintf("waiting for the daemon spawn lock %s, held by %s: %s (%s)", path, h, h.remedy(), until))
			}
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(backoff):
		}
		backoff = min(backoff*2, 50*time.Millisecond)
	}
}

func (a *AutoStart) lockGrace() time.Duration {
	if a.LockGrace <= 0 {
		return DefaultLockGrace
	}
	return a.LockGrace
}

func (a *AutoStart) lockWait() time.Duration {
	if a.LockWait <= 0 {
		return DefaultLockWait
	}
	return a.LockWait
}

// spawnHolder is who holds the spawn lock, as far as this process can tell.
type spawnHolder lease.Holding

// holder is the live process the kernel names as the holder, if any. A
// zombie has closed its files: the lock it took is held by a process it
// started.
func (h spawnHolder) holder() (lease.LockHolder, bool) {
	for _, k := range h.Holders {
		if k.Exclusive && k.State != 0 && k.State != 'Z' {
			return k, true
		}
	}
	return lease.LockHolder{}, false
}

func (h spawnHolder) running() bool {
	k, ok := h.holder()
	return ok && k.State != 'T' && k.State != 't'
}

// String names the holder, and what the kernel's table and the pid in the
// file say when they disagree, without guessing past them.
func (h spawnHolder) String() string {
	rec := h.Recorded
	var s string
	if k, ok := h.holder(); ok {
		s = process(k)
		if rec.Pid != 0 && rec.Pid != k.Pid {
			s += fmt.Sprintf("; the lock file records pid %d, which is not the holder", rec.Pid)
		}
		return s
	}
	for _, k := range h.Holders {
		if k.Exclusive {
			// Taken by a process that is gone: one it started before
			// exiting holds the descriptor still.
			return fmt.Sprintf("a process that inherited it from pid %d, which no longer runs", k.Pid)
		}
	}
	switch {
	case h.HoldersErr != nil:
		s = fmt.Sprintf("a process the kernel's lock table does not name (%v)", h.HoldersErr)
	default:
		s = "a process not in this process's view of /proc/locks (another pid namespace, or it just let go)"
	}
	switch {
	case rec.Pid == 0:
	case rec.State == 0:
		s += fmt.Sprintf("; the lock file records pid %d, which no longer runs", rec.Pid)
	default:
		s += fmt.Sprintf("; the lock file records %s, unconfirmed", process(rec))
	}
	return s
}

// remedy says what frees the lock.
func (h spawnHolder) remedy() string {
	k, ok := h.holder()
	switch {
	case !ok:
		return "end the process that holds it"
	case k.State == 'T':
		return fmt.Sprintf("resume it with `kill -CONT %d` (or `fg` in its shell) or end it", k.Pid)
	case k.State == 't':
		return fmt.Sprintf("detach the debugger from pid %d or end it", k.Pid)
	default:
		return fmt.Sprintf("let it finish or end it (`kill %d`)", k.Pid)
	}
}

// process is "pid N (command), state".
func process(p lease.LockHolder) string {
	cmd := p.Command
	if cmd == "" {
		cmd = "command line unreadable"
	}
	return fmt.Sprintf("pid %d (%s), %s", p.Pid, cmd, stateText(p.State))
}

// stateText reads a /proc/<pid>/stat state letter for a person.
func stateText(s byte) string {
	switch s {
	case 0:
		return "no longer running"
	case 'T':
		return "stopped (Ctrl-Z or SIGSTOP)"
	case 't':
		return "stopped by a debugger"
	case 'R':
		return "running"
	case 'S', 'I':
		return "running (sleeping)"
	case 'D':
		return "running (in uninterruptible I/O)"
	case 'Z':
		return "exited, not yet reaped by its parent"
	default:
		return fmt.Sprintf("state %c", s)
	}
}

// spawnDaemon starts the daemon detached from the caller: its own session,
// stdin from /dev/null, stdout and stderr to the daemon log, so a caller
// waiting on this command's pipes or exit never waits for the daemon. It
// inherits the environment. It returns once the daemon answers.
func spawnDaemon(ctx context.Context, root, sock string, a *AutoStart) error {
	logPath := filepath.Join(root, DaemonLog)
	logf, err := openDaemonLog(root)
	if err != nil {
		return fmt.Errorf("start daemon: %w", err)
	}
	cmd := exec.Command(a.Exe, a.Args(root)...)
	cmd.Dir = "/"
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	err = cmd.Start()
	logf.Close()
	if err != nil {
		return fmt.Errorf("start daemon: %w", err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	ready := a.ready()
	deadline := time.NewTimer(ready)
	defer deadline.Stop()
	for {
		if c, err := Dial(ctx, sock); err == nil {
			c.Close()
			return nil
		}
		select {
		case err := <-exited:
			if err == nil {
				err = errors.New("exit status 0")
			}
			return &startFailed{pid: cmd.Process.Pid, err: err, log: logPath}
		case <-deadline.C:
			return fmt.Errorf("the daemon started on demand (pid %d) did not answer on %s within %s; see %s", cmd.Process.Pid, sock, ready, logPath)
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// openDaemonLog opens <root>/logs/daemon.log for appending without
// following a symlink at logs/ or at the file, and without blocking on a
// FIFO planted there: anything but a regular file is refused.
func openDaemonLog(root string) (*os.File, error) {
	rootfd, err := unix.Open(root, unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC|unix.O_RDONLY, 0)
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", root, err)
	}
	defer unix.Close(rootfd)
	dir := filepath.Dir(DaemonLog)
	if err := unix.Mkdirat(rootfd, dir, 0o700); err != nil && !errors.Is(err, unix.EEXIST) {
		return nil, fmt.Errorf("mkdir %s: %w", filepath.Join(root, dir), err)
	}
	dirfd, err := unix.Openat(rootfd, dir, unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC|unix.O_RDONLY, 0)
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", filepath.Join(root, dir), err)
	}
	defer unix.Close(dirfd)
	path := filepath.Join(root, DaemonLog)
	fd, err := unix.Openat(dirfd, filepath.Base(DaemonLog), unix.O_WRONLY|unix.O_APPEND|unix.O_CREAT|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", path, err)
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil || st.Mode&unix.S_IFMT != unix.S_IFREG {
		unix.Close(fd)
		return nil, fmt.Errorf("%s is not a regular file", path)
	}
	if err := unix.SetNonblock(fd, false); err != nil {
		unix.Close(fd)
		return nil, err
	}
	return os.NewFile(uintptr(fd), path), nil
}

// connectOwned opens the journal in this process. An auto-started daemon
// holding it is asked to retire: it turns every new command away at once
// and exits when its last client is done. A hand-started daemon is used as
// it is, if it runs this build.
func connectOwned(ctx context.Context, root string, wait time.Duration, ip InProcess) (Backend, error) {
	sock := filepath.Join(root, wire.SocketName)
	deadline := time.Now().Add(wait)
	backoff := 5 * time.Millisecond
	if ip == nil {
		return nil, ErrInProcess
	}
	for {
		b, err := ip.Open(ctx, root)
		if err == nil {
			return b, nil
		}
		if !ip.Held(err) {
			return nil, err
		}
		c, st, derr := dialStatus(ctx, sock)
		if final(derr) {
			return nil, derr
		}
		if derr == nil {
			if !st.Auto {
				if !sameBuild(st) {
					c.Close()
					return nil, otherBuild(root, st)
				}
				return c, nil
			}
			c.Retire(ctx)
			c.Close()
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("%w: %v; its other clients kept it past %s", ErrBusy, err, wait)
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(backoff):
		}
		backoff = min(backoff*2, 100*time.Millisecond)
	}
}
