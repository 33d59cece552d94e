package lifecycle

import (
	"context"

	"github.com/nexus-sandbox/nexus/events"
	"github.com/nexus-sandbox/nexus/guard"
	"github.com/nexus-sandbox/nexus/projections"
	"github.com/nexus-sandbox/nexus/sagas"
)

// Remove tears a sandbox down completely: VMM and supervisor stopped,
// sockets (RL-11), supervisor state (RL-18), builder-supervisor dir
// (RL-12), snapshots (RL-15) and disks deleted, volumes detached (their
// files are never touched), and finally the sandbox removed from the
// journal's view. A removal interrupted at any step is finished by recover.
func (m *Manager) Remove(ctx context.Context, ref string) error {
	c, err := m.claim(ctx, ref, guard.Remove)
	if err != nil {
		return err
	}
	err = m.run(ctx, c, func(sb projections.Sandbox) *sagas.Saga { return m.saga(events.SagaRm, sb.ID, m.removeSteps(sb)) })
	if err != nil {
		c.release()
		return err
	}
	c.lease.Remove() // the sandbox is gone; so is its lease file
	return nil
}

func (m *Manager) removeSteps(sb projections.Sandbox) []sagas.Step {
	steps := m.stopSteps(sb)
	steps = append(steps, sagas.Step{Name: "reclaim", Do: func(ctx context.Context) ([]events.Payload, error) {
		// Read again: stopping already reclaimed the sockets.
		cur, err := m.Find(ctx, sb.ID)
		if err != nil {
			return nil, err
		}
		return m.reclaimAll(cur, "rm")
	}})
	if len(sb.Volumes) > 0 {
		steps = append(steps, sagas.Step{Name: "detach-volumes", Do: func(context.Context) ([]events.Payload, error) {
			var ps []events.Payload
			for _, v := range sb.Volumes {
				ps = append(ps, events.VolumeDetachedEvent{Name: v.Name})
			}
			return ps, nil
		}})
	}
	return append(steps, sagas.Step{Name: "remove", Do: func(context.Context) ([]events.Payload, error) {
		return sagas.One(events.SandboxRemovedEvent{}), nil
	}})
}

// reclaimAll deletes every resource the journal says the sandbox owns,
// plus the per-sandbox directories that exist by name alone.
func (m *Manager) reclaimAll(sb projections.Sandbox, by string) ([]events.Payload, error) {
	var ps []events.Payload
	owned := append([]events.Resource(nil), sb.Resources...)
	for _, r := range append(m.logResources(sb.ID), []events.Resource{
		m.res(events.KindBuilderSupervisor, m.Root.BuilderDir(sb.ID)),
		m.res(events.KindSnapshot, m.Root.SnapshotsOf(sb.ID)),
		m.res(events.KindAPISocket, m.Root.APISocket(sb.ID)),
		m.res(events.KindAPISocketLock, m.Root.APISocketLock(sb.ID)),
		m.res(events.KindVsockSocket, m.Root.VsockSocket(sb.ID)),
		m.res(events.KindIIDSocket, m.Root.IIDSocket(sb.ID)),
	}...) {
		if !sb.Owns(r.Path) {
			owned = append(owned, r)
		}
	}
	for _, r := range owned {
		more, err := m.reclaim(r, sb.Owns(r.Path), by)
		if err != nil {
			return ps, err
		}
		ps = append(ps, more...)
	}
	return ps, nil
}
