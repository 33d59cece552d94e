package lifecycle

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/oklog/ulid/v2"

	"github.com/nexus-sandbox/nexus/agentproto"
	"github.com/nexus-sandbox/nexus/core"
	"github.com/nexus-sandbox/nexus/events"
	"github.com/nexus-sandbox/nexus/host/driver"
	"github.com/nexus-sandbox/nexus/host/proc"
	"github.com/nexus-sandbox/nexus/host/vmm"
	"github.com/nexus-sandbox/nexus/projections"
)

// DefaultReadyTimeout is how long create, start, fork, restore, exec and
// cp wait for a guest to become Ready unless told otherwise. A guest
// under software emulation on a loaded machine answers tens of seconds
// after its VMM starts.
const DefaultReadyTimeout = 3 * time.Minute

// How a sandbox became Ready (sandbox.ready's By).
const (
	ReadyByAgent = "agent" // its guest agent answered a session
	ReadyByVMM   = "vmm"   // a guest booted without the agent: its VMM runs
)

// NotReadyError is a guest that did not become Ready in time, or whose
// VMM ended first. The sandbox is left as it is.
type NotReadyError struct {
	ID         string
	Waited     time.Duration
	ConsoleLog string
	// Exited: the VMM ended before the guest was Ready.
	Exited bool
	// Last is the last attempt's error.
	Last error
}

func (e *NotReadyError) Error() string {
	if e.Exited {
		return fmt.Sprintf("sandbox %s: its VMM exited before the guest was Ready (%v); the guest's console log is %s", e.ID, e.Last, e.ConsoleLog)
	}
	return fmt.Sprintf("sandbox %s is running but not Ready: its guest agent did not answer within %s (last attempt: %v); the guest's console log is %s; `nexus wait %s --for ready` waits again",
		e.ID, e.Waited.Round(time.Second), e.Last, e.ConsoleLog, e.ID)
}

// guestHasAgent says whether sb's guest, booted as its record says, runs
// nexus's agent: the process driver's guest always does, and a kernel's
// does when it boots an initramfs (`nexus guest initramfs` puts the
// agent, or nexus-init, which answers its hello, at /init). A kernel
// booted without one mounts the image's root and runs the image's init,
// which nexus cannot know to run an agent: that guest is Ready once its
// VMM runs.
func (m *Manager) guestHasAgent(sb projections.Sandbox) bool {
	d, _ := m.bootOf(sb)
	return agentIsInit(d)
}

// agentIsInit is guestHasAgent's rule for a guest d boots: it is also
// what makes a new sandbox's root an overlay (newBoot).
func agentIsInit(d driver.Driver) bool { return !d.BootsKernel() || d.Initramfs != "" }

// WaitReady waits up to timeout for sandbox ref's guest to become Ready,
// and journals it (sandbox.ready) the first time it is seen. With record,
// a guest that is not Ready in time is journaled Ready=False
// reason=AgentNotReady (sandbox.not_ready) and left running. It fails
// with a *NotReadyError, naming the console log, when the guest is not
// Ready in time or its VMM ends.
func (m *Manager) WaitReady(ctx context.Context, ref string, timeout time.Duration, record bool) (projections.Sandbox, error) {
	sb, err := m.running(ctx, ref)
	if err != nil {
		return sb, err
	}
	c, err := m.awaitAgent(ctx, sb, timeout, record)
	if c != nil {
		c.Close()
	}
	if err != nil {
		if record {
			m.writeRecord(ctx, sb.ID)
		}
		return sb, err
	}
	return m.recordAndRead(ctx, sb.ID)
}

// awaitAgent returns a session with the guest agent of running sandbox sb
// once it answers (nil for a guest without the agent), waiting up to
// timeout for a guest that is not Ready yet, and journals the first
// answer of the run as its Ready.
func (m *Manager) awaitAgent(ctx context.Context, sb projections.Sandbox, timeout time.Duration, record bool) (*agentproto.Client, error) {
	run := sb.LastRun
	if !m.guestHasAgent(sb) {
		return nil, m.markReady(ctx, sb.ID, run, ReadyByVMM)
	}
	if timeout <= 0 {
		timeout = DefaultReadyTimeout
	}
	who := proc.Identity{Pid: sb.VMM.Pid, StartTicks: sb.VMM.StartTicks}
	start := time.Now()
	deadline := start.Add(timeout)
	notReady := func(exited bool, last error) *NotReadyError {
		return &NotReadyError{ID: sb.ID, Waited: time.Since(start), ConsoleLog: m.Root.ConsoleLog(sb.ID), Exited: exited, Last: last}
	}
	for delay := 50 * time.Millisecond; ; delay = min(delay*2, time.Second) {
		// One attempt is bounded on its own: a dial that hangs must not
		// take the whole wait.
		actx, cancel := context.WithTimeout(ctx, min(time.Until(deadline), 15*time.Second))
		c, err := vmm.DialAgent(actx, m.Root.VsockSocket(sb.ID))
		cancel()
		if err == nil {
			if !sb.IsReady() {
				if merr := m.markReady(ctx, sb.ID, run, ReadyByAgent); merr != nil {
					c.Close()
					return nil, merr
				}
			}
			return c, nil
		}
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		if alive, _ := proc.Alive(who); !alive {
			return nil, notReady(true, err)
		}
		if !time.Now().Before(deadline) {
			nr := notReady(false, err)
			if record {
				if jerr := m.markNotReady(ctx, sb.ID, run, nr); jerr != nil {
					return nil, errors.Join(nr, jerr)
				}
			}
			return nil, nr
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(min(delay, time.Until(deadline))):
		}
	}
}

// markReady journals run's Ready, unless it is no longer the sandbox's
// running run or is journaled Ready already. The append expects the
// sandbox as it was read: a change in between is read again, so Ready is
// never journaled after the run ended.
func (m *Manager) markReady(ctx context.Context, id, run, by string) error {
	return m.appendForRun(ctx, id, run, func(sb projections.Sandbox) events.Payload {
		if !sb.ReadyAt.IsZero() {
			return nil
		}
		now := nowUTC()
		return events.SandboxReadyEvent{Run: run, By: by, BootAtMs: sb.BootAt.UnixMilli(), ReadyAtMs: now.UnixMilli()}
	})
}

// markNotReady journals that run's guest did not become Ready in time.
func (m *Manager) markNotReady(ctx context.Context, id, run string, nr *NotReadyError) error {
	return m.appendForRun(ctx, id, run, func(sb projections.Sandbox) events.Payload {
		if !sb.ReadyAt.IsZero() {
			return nil
		}
		return events.SandboxNotReadyEvent{Run: run, Reason: projections.ReasonAgentNotReady, WaitedMs: nr.Waited.Milliseconds(),
			Message: fmt.Sprintf("the guest agent did not answer within %s (%v); console log %s", nr.Waited.Round(time.Second), nr.Last, m.rel(nr.ConsoleLog))}
	})
}

// appendForRun appends what event makes of the sandbox as it stands, if
// run is still its running run, expecting the sandbox unchanged since it
// was read; event returns nil when there is nothing to journal.
func (m *Manager) appendForRun(ctx context.Context, id, run string, event func(projections.Sandbox) events.Payload) error {
	ctx = context.WithoutCancel(ctx)
	for attempt := 1; ; attempt++ {
		sb, err := m.Find(ctx, id)
		if err != nil {
			return err
		}
		if sb.State != projections.StateRunning || sb.LastRun != run {
			return nil
		}
		// A saga open on the sandbox is changing it, and each of its
		// steps expects the sandbox as the saga left it: a mark between
		// two steps would fail the saga. The mark waits for a later
		// session with the guest (exec, cp, wait). Read after the
		// sandbox: a saga that starts later moves its revision, and the
		// append below is refused and judged again.
		open, err := m.B.OpenSagas(ctx)
		if err != nil {
			return err
		}
		if core.SagaOn(open, id) != nil {
			return nil
		}
		p := event(sb)
		if p == nil {
			return nil
		}
		_, err = m.B.AppendExpect(ctx, []core.Expect{{Entity: core.Sandbox(id), Seq: sb.Rev}}, events.New(ulid.Make(), nowUTC(), id, p))
		// Another command's event came first: read again, a bounded
		// number of times (each one is a change the journal accepted).
		if !errors.Is(err, core.ErrStale) || attempt == 20 {
			return err
		}
	}
}

// What `nexus wait --for` waits for.
const (
	ForReady   = "ready"   // the guest is Ready
	ForStopped = "stopped" // no VMM runs: stopped, exited or in error
	ForExited  = "exited"  // the VMM ended without a stop
)

// WaitFor waits up to timeout (0: DefaultReadyTimeout) for sandbox ref to
// reach cond (ForReady, ForStopped or ForExited). It journals only what
// WaitReady journals for ready, never a not-Ready: the sandbox's boot
// decides that. An exit is seen by pid and start time, as ls sees it,
// whether or not a daemon journaled it.
func (m *Manager) WaitFor(ctx context.Context, ref, cond string, timeout time.Duration) (projections.Sandbox, error) {
	if timeout <= 0 {
		timeout = DefaultReadyTimeout
	}
	var reached func(projections.Sandbox) bool
	switch cond {
	case ForReady:
		return m.WaitReady(ctx, ref, timeout, false)
	case ForStopped:
		reached = func(sb projections.Sandbox) bool {
			return sb.State == projections.StateStopped || sb.State == projections.StateExited || sb.State == projections.StateError
		}
	case ForExited:
		reached = func(sb projections.Sandbox) bool { return sb.State == projections.StateExited }
	default:
		return projections.Sandbox{}, fmt.Errorf("wait: --for %q: want %s, %s or %s", cond, ForReady, ForStopped, ForExited)
	}
	deadline := time.Now().Add(timeout)
	for delay := 50 * time.Millisecond; ; delay = min(delay*2, time.Second) {
		sb, err := m.Lookup(ctx, ref)
		if err != nil {
			return sb, err
		}
		if sb = observeExits(sb); reached(sb) {
			return sb, nil
		}
		if !time.Now().Before(deadline) {
			return sb, fmt.Errorf("sandbox %s is still %s after %s, not %s", sb.ID, sb.State, timeout, cond)
		}
		select {
		case <-ctx.Done():
			return sb, ctx.Err()
		case <-time.After(min(delay, time.Until(deadline))):
		}
	}
}
