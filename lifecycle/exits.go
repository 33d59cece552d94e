package lifecycle

import (
	"context"
	"fmt"

	"github.com/nexus-sandbox/nexus/host/proc"
	"github.com/nexus-sandbox/nexus/projections"
)

// ObserveExits returns list as a reader should see it: a sandbox whose
// recorded VMM no longer runs by pid + start time shows as exited (and a
// dead recorded supervisor is marked), though no daemon journaled the
// exit. It is derived at read time, never journaled, and deletes nothing;
// a process whose state cannot be read counts as running, since doubt
// must never lead to settling a sandbox that may still be up.
func ObserveExits(list []projections.Sandbox) []projections.Sandbox {
	out := make([]projections.Sandbox, len(list))
	for i, sb := range list {
		out[i] = observeExits(sb)
	}
	return out
}

func observeExits(sb projections.Sandbox) projections.Sandbox {
	return sb.ObserveGone(gone(sb.VMM), gone(sb.Supervisor))
}

func gone(p *projections.Process) bool {
	if p == nil || p.Exited {
		return false
	}
	alive, err := proc.Alive(proc.Identity{Pid: p.Pid, StartTicks: p.StartTicks})
	return err == nil && !alive
}

// settleExited brings an exited sandbox (journaled, or seen so by pid +
// start time) to stopped the way recover does after a crash: its dead VMM
// is journaled stopped and its sockets reclaimed, its supervisor stopped
// (nothing else would stop a detached one), in a recover saga. Any other sandbox is returned as is.
func (m *Manager) settleExited(ctx context.Context, sb projections.Sandbox) (projections.Sandbox, error) {
	if observeExits(sb).State != projections.StateExited {
		return sb, nil
	}
	var rep RecoverReport
	if err := m.recoverSandbox(ctx, sb, &rep); err != nil {
		return sb, fmt.Errorf("settle exited sandbox %s: %w", sb.ID, err)
	}
	return m.Find(ctx, sb.ID)
}
