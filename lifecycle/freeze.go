package lifecycle

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/nexus-sandbox/nexus/host/vmm"
	"github.com/nexus-sandbox/nexus/projections"
)

// freezeHold is how long the guest agent keeps a fork's or snapshot's
// freeze if nexus never thaws it (nexus died mid-copy): long enough for a
// slow copy, short enough that a guest is not stuck for good.
const freezeHold = 5 * time.Minute

// quiesce makes a running sandbox's disks safe to copy: the guest agent
// freezes its filesystems (sync + FIFREEZE: on disk as a clean unmount
// leaves them, docs/guest-agent.md), then the VM is paused so the copies
// are of one instant. The returned release resumes the VM and then thaws
// the guest (the agent answers only a running guest); it is safe to call
// more than once, so a flow calls it as soon as its copies are durable and
// defers it for the failure paths.
//
// An agent that does not answer refuses the copy: a running guest's disks
// copied without a freeze are as a power cut leaves them (written but
// unsynced data missing). crashConsistent proceeds anyway and says so.
func (m *Manager) quiesce(ctx context.Context, sb projections.Sandbox, what string, crashConsistent bool) (release func(), frozen bool, err error) {
	if sb.State != projections.StateRunning {
		return func() {}, false, nil
	}
	thaw := func() {}
	fctx, cancel := context.WithTimeout(ctx, m.freezeDeadline())
	c, err := vmm.DialAgent(fctx, m.Root.VsockSocket(sb.ID))
	if err == nil {
		if _, err = c.Freeze(fctx, freezeHold); err != nil {
			c.Close()
		}
	}
	cancel()
	switch {
	case err == nil:
		thaw = func() {
			tctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), m.freezeDeadline())
			defer cancel()
			if _, err := c.Thaw(tctx); err != nil {
				m.notice("%s: the guest agent did not confirm the thaw (%v): its filesystems thaw by themselves within %v", sb.ID, err, freezeHold)
			}
			c.Close()
		}
	case !crashConsistent:
		return nil, false, fmt.Errorf("%w: %s of running sandbox %s: its guest agent did not freeze its filesystems (%v); disks copied now would be as a power cut leaves them, without what the guest wrote but did not sync (pass --crash-consistent to copy them so anyway, or stop it first)", ErrRefused, what, sb.ID, err)
	default:
		m.notice("%s of running sandbox %s is crash-consistent only: its guest agent did not freeze its filesystems (%v), so the copies hold what a power cut would leave", what, sb.ID, err)
	}
	frozen = err == nil
	resume, err := m.pauseIfRunning(ctx, sb)
	if err != nil {
		thaw()
		return nil, false, err
	}
	var once sync.Once
	return func() { once.Do(func() { resume(); thaw() }) }, frozen, nil
}

// thawRestored thaws a guest restored from a snapshot whose memory was
// saved frozen: its agent wakes holding the freeze, which would otherwise
// last until its deadline (freezeHold).
func (m *Manager) thawRestored(ctx context.Context, id string) {
	tctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), m.freezeDeadline())
	defer cancel()
	c, err := vmm.DialAgent(tctx, m.Root.VsockSocket(id))
	if err == nil {
		_, err = c.Thaw(tctx)
		c.Close()
	}
	if err != nil {
		m.notice("%s: restored from a snapshot taken frozen, and its guest agent did not confirm the thaw (%v): its filesystems thaw by themselves within %v", id, err, freezeHold)
	}
}

func (m *Manager) freezeDeadline() time.Duration {
	if m.FreezeDeadline <= 0 {
		return vmm.DefaultFlushDeadline
	}
	return m.FreezeDeadline
}
