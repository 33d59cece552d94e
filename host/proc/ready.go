package proc

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// ReadyEnv names, in a child's environment, the descriptor on which it says
// it serves: the write end of a pipe its spawner reads (SpawnReady). The
// child writes readyLine once its sockets accept connections and closes
// it; a child that dies first closes it unwritten, which its spawner reads
// as an end of file at once, with no poll.
const ReadyEnv = "NEXUS_READY_FD"

// readyFD is the descriptor the pipe's write end has in the child: the
// first of exec.Cmd's ExtraFiles.
const readyFD = 3

const readyLine = "ready\n"

// ErrExitedEarly means a process closed its readiness pipe without saying
// it serves: it exited before it served.
var ErrExitedEarly = errors.New("exited before answering")

// Readiness is the spawner's end of a child's readiness pipe.
type Readiness struct {
	r      *os.File
	exited <-chan error // the child's exit, from its reaper
}

// SpawnReady is SpawnDetachedTo with a readiness pipe: the child inherits
// its write end as descriptor 3, named in its environment by ReadyEnv, and
// signals on it with the hook ReadyHook returns. Wait on the Readiness,
// then Close it. The pipe does not tie the child to this process: once it
// has signalled, or once this process is gone, the child runs on alone.
func SpawnReady(argv []string, env []string, logf *os.File) (Identity, *Readiness, error) {
	if len(argv) == 0 {
		return Identity{}, nil, errors.New("spawn: empty argv")
	}
	r, w, err := os.Pipe()
	if err != nil {
		return Identity{}, nil, fmt.Errorf("spawn %s: readiness pipe: %w", argv[0], err)
	}
	if env == nil {
		env = os.Environ()
	}
	env = append(withoutEnv(env, ReadyEnv), ReadyEnv+"="+strconv.Itoa(readyFD))
	exited := make(chan error, 1)
	id, err := spawn(argv, env, logf, w, exited)
	// The child holds its own copy: only then does its death close the
	// last write end, which is what the reader hears.
	w.Close()
	if err != nil {
		r.Close()
		return id, nil, err
	}
	return id, &Readiness{r: r, exited: exited}, nil
}

// Wait returns nil once the child has said it serves; ErrExitedEarly
// (with its exit status when known) if it closed the pipe without; an
// error after timeout, or ctx's error if ctx ends first.
func (rd *Readiness) Wait(ctx context.Context, timeout time.Duration) error {
	if err := rd.r.SetReadDeadline(time.Now().Add(timeout)); err != nil {
		return fmt.Errorf("readiness pipe: %w", err)
	}
	// A past deadline wakes the read when ctx ends.
	stop := context.AfterFunc(ctx, func() { rd.r.SetReadDeadline(time.Unix(1, 0)) })
	defer stop()
	var got []byte
	buf := make([]byte, len(readyLine))
	for {
		n, err := rd.r.Read(buf)
		got = append(got, buf[:n]...)
		if string(got) == readyLine {
			return nil
		}
		if len(got) >= len(readyLine) {
			return fmt.Errorf("readiness pipe: unexpected %q", got)
		}
		switch {
		case err == nil:
		case errors.Is(err, os.ErrDeadlineExceeded):
			if ctx.Err() != nil {
				return ctx.Err()
			}
			return fmt.Errorf("did not answer within %s", timeout)
		case n == 0:
			return rd.exitedEarly()
		default:
			return fmt.Errorf("readiness pipe: %w", err)
		}
	}
}

// exitedEarly is ErrExitedEarly with the child's exit status, when its
// reaper has it within a moment (the pipe closes as the child exits, just
// before the kernel reports it).
func (rd *Readiness) exitedEarly() error {
	select {
	case err := <-rd.exited:
		if err != nil {
			return fmt.Errorf("%w (%v)", ErrExitedEarly, err)
		}
		return fmt.Errorf("%w (exit status 0)", ErrExitedEarly)
	case <-time.After(time.Second):
		return ErrExitedEarly
	}
}

// Close releases the spawner's end of the pipe.
func (rd *Readiness) Close() error { return rd.r.Close() }

// ReadyHook is the child's side of SpawnReady: with ReadyEnv set, it takes
// the descriptor (close-on-exec from now, so no process this one starts
// inherits it, and ReadyEnv is cleared for the same reason) and returns
// the function that signals on it, to be called once this process serves.
// Without ReadyEnv (started by hand, or by a spawner that polls) the
// function does nothing. Call it at the start of main.
func ReadyHook() func() {
	s, ok := os.LookupEnv(ReadyEnv)
	if !ok {
		return func() {}
	}
	os.Unsetenv(ReadyEnv)
	fd, err := strconv.Atoi(s)
	if err != nil || fd < 0 {
		return func() {}
	}
	// A descriptor this process does not have (a stale variable) is left
	// alone: it may be a file the runtime opened since.
	if _, err := unix.FcntlInt(uintptr(fd), unix.F_GETFD, 0); err != nil {
		return func() {}
	}
	unix.CloseOnExec(fd)
	f := os.NewFile(uintptr(fd), "readiness pipe")
	return func() {
		// The spawner may be gone: the write then fails (EPIPE, not a
		// signal, on a descriptor other than stdout and stderr), and
		// this process serves on regardless.
		f.WriteString(readyLine)
		f.Close()
	}
}

func withoutEnv(env []string, name string) []string {
	out := make([]string, 0, len(env))
	for _, kv := range env {
		if !strings.HasPrefix(kv, name+"=") {
			out = append(out, kv)
		}
	}
	return out
}

// spawn starts argv detached (SpawnDetachedTo), with extra, if any, as its
// descriptor 3; exited, if given, receives its exit once reaped.
func spawn(argv []string, env []string, logf *os.File, extra *os.File, exited chan<- error) (Identity, error) {
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Env = env
	cmd.Stdin = nil // exec.Cmd opens /dev/null
	cmd.Stdout = logf
	cmd.Stderr = logf
	if extra != nil {
		cmd.ExtraFiles = []*os.File{extra}
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		return Identity{}, fmt.Errorf("spawn %s: %w", argv[0], err)
	}
	// Read the identity before the reaper can run: until Wait, even a child
	// that already exited keeps its /proc entry as a zombie.
	id, idErr := Of(cmd.Process.Pid)
	go func() {
		err := cmd.Wait()
		if exited != nil {
			exited <- err
		}
	}()
	if idErr != nil {
		return Identity{}, fmt.Errorf("spawn %s: identity of pid %d: %w", argv[0], cmd.Process.Pid, idErr)
	}
	return id, nil
}
