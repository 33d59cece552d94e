package lifecycle

import (
	"context"
	"path/filepath"
	"sort"
	"strings"
	"syscall"

	"github.com/nexus-sandbox/nexus/core"
	"github.com/nexus-sandbox/nexus/events"
	"github.com/nexus-sandbox/nexus/host/fsx"
	"github.com/nexus-sandbox/nexus/host/scan"
	"github.com/nexus-sandbox/nexus/projections"
	"github.com/nexus-sandbox/nexus/sagas"
)

// RemoveOptions are what `nexus rm` may add.
type RemoveOptions struct {
	// Force stops a running sandbox first (rm -f); without it a running
	// sandbox is refused.
	Force bool
	// WithSnapshots also deletes the sandbox's snapshots; without it a
	// sandbox that has any is refused.
	WithSnapshots bool
}

// Removed is what a removal deleted, as the journal knew it just before.
type Removed struct {
	ID        string   `json:"id"`
	Handle    string   `json:"handle,omitempty"`
	Resources int      `json:"resources"`
	Snapshots []string `json:"snapshots"`
	// AllocatedBytes is what those resources held on disk just before.
	AllocatedBytes int64 `json:"allocated_bytes"`
}

// Remove is RemoveWith forced and with snapshots: what an owner that is
// gone (a ledger sweep) wants.
func (m *Manager) Remove(ctx context.Context, ref string) error {
	_, err := m.RemoveWith(ctx, ref, RemoveOptions{Force: true, WithSnapshots: true})
	return err
}

// RemoveWith tears a sandbox down completely: VMM and supervisor stopped,
// sockets, supervisor state, builder-supervisor dir, snapshots and disks
// deleted, volumes detached (their
// files are never touched), and finally the sandbox removed from the
// journal's view. A removal interrupted at any step is finished by recover.
func (m *Manager) RemoveWith(ctx context.Context, ref string, opt RemoveOptions) (Removed, error) {
	cmd := core.Remove
	if opt.Force {
		cmd = core.ForceRemove
	}
	c, err := m.claim(ctx, ref, cmd)
	if err != nil {
		return Removed{}, err
	}
	if err := core.DecideSnapshots(c.sb, opt.WithSnapshots); err != nil {
		c.release()
		return Removed{}, err
	}
	rep := Removed{ID: c.sb.ID, Handle: c.sb.Handle, Resources: len(c.sb.Resources), Snapshots: append([]string{}, c.sb.Snapshots...)}
	for _, rel := range outermost(c.sb.Resources) {
		rep.AllocatedBytes += allocated(string(m.Root), rel)
	}
	err = m.run(ctx, c, func(sb projections.Sandbox) *sagas.Saga { return m.saga(events.SagaRm, sb.ID, m.removeSteps(sb)) })
	c.release()
	if err != nil {
		return Removed{}, err
	}
	return rep, nil
}

// outermost lists the paths of rs that are not beneath another of them
// (a snapshot directory lies under the sandbox's snapshots directory,
// and both are owned), so that a size summed over them counts each byte
// once.
func outermost(rs []events.Resource) []string {
	paths := make([]string, 0, len(rs))
	for _, r := range rs {
		paths = append(paths, filepath.Clean(r.Path))
	}
	sort.Strings(paths)
	var out []string
	for _, p := range paths {
		if n := len(out); n > 0 && (p == out[n-1] || strings.HasPrefix(p, out[n-1]+"/")) {
			continue
		}
		out = append(out, p)
	}
	return out
}

// allocated is the space rel takes under root: a whole tree for a
// directory, the blocks of anything else; never following a link.
func allocated(root, rel string) int64 {
	if n := scan.TreeAllocated(root, rel); n > 0 {
		return n
	}
	fi, err := fsx.Stat(root, rel)
	if err != nil || fi.IsDir() {
		return 0
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		return st.Blocks * 512
	}
	return 0
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
