package lifecycle

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/nexus-sandbox/nexus/agentproto"
	"github.com/nexus-sandbox/nexus/host/durable"
	"github.com/nexus-sandbox/nexus/host/vmm"
	"github.com/nexus-sandbox/nexus/projections"
)

// ExecOptions is a command to run in a sandbox's guest (docs/guest-agent.md
// `exec`).
type ExecOptions struct {
	Argv []string
	// Env is added to the guest's environment (K=V).
	Env []string
	Cwd string
	// Stdin, when set, is forwarded to the command; nil gives it no input.
	Stdin          io.Reader
	Stdout, Stderr io.Writer
	// Signals are forwarded to the guest process (signal numbers).
	Signals <-chan int
	// TTY runs the command on a terminal in the guest; its stderr then
	// arrives on Stdout.
	TTY bool
}

// ExecStartError is a command the guest could not start: NotFound when no
// such program exists (a shell's 127), otherwise it exists but could not
// be run (126).
type ExecStartError struct {
	NotFound bool
	Reason   string
}

func (e *ExecStartError) Error() string {
	// An older agent prefixes its reason with os/exec's "exec: ", once or
	// twice.
	reason := e.Reason
	for strings.HasPrefix(reason, "exec: ") {
		reason = strings.TrimPrefix(reason, "exec: ")
	}
	return "exec: the guest could not start " + reason
}

// running resolves ref to a sandbox whose guest is running.
func (m *Manager) running(ctx context.Context, ref string) (projections.Sandbox, error) {
	sb, err := m.Lookup(ctx, ref)
	if err != nil {
		return sb, err
	}
	if sb.State != projections.StateRunning || sb.VMM == nil || sb.VMM.Exited {
		return sb, fmt.Errorf("%w: sandbox %s is %s, not running: `nexus start %s` first", ErrRefused, sb.ID, sb.State, sb.ID)
	}
	return sb, nil
}

// agent opens a session with the guest agent of a running sandbox. A
// sandbox that is not Ready yet (booting) is waited for, up to
// ReadyTimeout, and the operator told so: the guest agent of a booting
// guest does not answer yet, which is no failure of the guest.
func (m *Manager) agent(ctx context.Context, ref string) (projections.Sandbox, *agentproto.Client, error) {
	sb, err := m.running(ctx, ref)
	if err != nil {
		return sb, nil, err
	}
	m.noticeHostGuest(sb)
	// A guest booted without the agent is Ready as its VMM runs: an
	// agent in it is dialled as in any Ready sandbox.
	if !sb.IsReady() && m.guestHasAgent(sb) {
		_, why := sb.Readiness()
		timeout := m.ReadyTimeout
		if timeout <= 0 {
			timeout = DefaultReadyTimeout
		}
		m.status("sandbox %s is not Ready (%s): waiting up to %s for its guest agent", sb.ID, why, timeout)
		c, err := m.awaitAgent(ctx, sb, timeout, false)
		return sb, c, err
	}
	c, err := vmm.DialAgent(ctx, m.Root.VsockSocket(sb.ID))
	if err != nil {
		return sb, nil, fmt.Errorf("sandbox %s: %w", sb.ID, err)
	}
	return sb, c, nil
}

// Exec runs a command in a running sandbox's guest through its agent,
// streaming its output, and returns how it ended. It journals nothing but,
// for a sandbox not Ready yet, its Ready once the agent answers: a
// command is the guest's business, not a change of the sandbox's state.
func (m *Manager) Exec(ctx context.Context, ref string, o ExecOptions) (agentproto.ExitStatus, error) {
	if len(o.Argv) == 0 {
		return agentproto.ExitStatus{}, errors.New("exec: no command")
	}
	_, c, err := m.agent(ctx, ref)
	if err != nil {
		return agentproto.ExitStatus{}, err
	}
	defer c.Close()
	st, err := c.Exec(ctx, agentproto.Exec{Argv: o.Argv, Env: execEnv(o.Env), Cwd: o.Cwd, Stdin: o.Stdin, Stdout: o.Stdout, Stderr: o.Stderr, Signals: o.Signals, TTY: o.TTY})
	var ae *agentproto.AgentError
	if errors.As(err, &ae) {
		// The agent answers an exec it could not start with its reason;
		// os/exec words "no such program" these ways.
		nf := strings.Contains(ae.Reason, "executable file not found") || strings.Contains(ae.Reason, "no such file or directory")
		return st, &ExecStartError{NotFound: nf, Reason: ae.Reason}
	}
	return st, err
}

// execEnv is the environment sent to the agent. The protocol replaces the
// environment when one is sent; a user's --env adds to the guest's, so
// PATH and HOME are given a guest's usual values unless set.
func execEnv(extra []string) []string {
	if len(extra) == 0 {
		return nil
	}
	env := []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOME=/root"}
	return append(env, extra...)
}

// CopyOut copies the guest file at path to local (a file; "-" is w). The
// local file is published as nexus publishes its own: written to a
// temporary name, fsynced, renamed into place.
func (m *Manager) CopyOut(ctx context.Context, ref, path, local string, w io.Writer) (int64, error) {
	if !filepath.IsAbs(path) {
		return 0, fmt.Errorf("cp: guest path %q is not absolute", path)
	}
	_, c, err := m.agent(ctx, ref)
	if err != nil {
		return 0, err
	}
	defer c.Close()
	if local == "-" {
		return c.ReadFile(ctx, path, w)
	}
	if fi, err := os.Stat(local); err == nil && fi.IsDir() {
		local = filepath.Join(local, filepath.Base(path))
	}
	var n int64
	err = durable.Publish(local, 0o644, func(f *os.File) error {
		n, err = c.ReadFile(ctx, path, f)
		return err
	})
	if err != nil {
		return n, fmt.Errorf("cp %s: %w", path, err)
	}
	return n, nil
}

// CopyIn copies the local file (or r, for "-") to path in the guest; the
// agent publishes it only once every byte is durable on the guest's disk.
// Directories are refused: the protocol moves one file at a time.
func (m *Manager) CopyIn(ctx context.Context, ref, local, path string, r io.Reader) (int64, error) {
	if !filepath.IsAbs(path) {
		return 0, fmt.Errorf("cp: guest path %q is not absolute", path)
	}
	mode := uint32(0)
	if local != "-" {
		f, err := os.Open(local)
		if err != nil {
			return 0, fmt.Errorf("cp: %w", err)
		}
		defer f.Close()
		fi, err := f.Stat()
		if err != nil {
			return 0, fmt.Errorf("cp: %w", err)
		}
		if !fi.Mode().IsRegular() {
			return 0, fmt.Errorf("cp: %s is not a regular file (directories are not copied: one file at a time)", local)
		}
		mode = uint32(fi.Mode().Perm())
		r = f
		if strings.HasSuffix(path, "/") {
			path += filepath.Base(local)
		}
	}
	_, c, err := m.agent(ctx, ref)
	if err != nil {
		return 0, err
	}
	defer c.Close()
	n, err := c.WriteFile(ctx, path, mode, r)
	if err != nil {
		return n, fmt.Errorf("cp %s: %w", path, err)
	}
	return n, nil
}
