package lifecycle

import (
	"context"
	"fmt"

	"github.com/nexus-sandbox/nexus/core"
	"github.com/nexus-sandbox/nexus/projections"
)

// The plans below are the --dry-run of each removing command: what it
// would remove, or why it would be refused, decided by the same rules on
// what a reader sees now. They take no lease and change nothing, so the
// real command decides again under its lease (something may change in
// between, as with any dry run).

// RemovePlan is what RemoveWith would remove, and the resources it would
// delete (the outermost paths, relative to the root).
func (m *Manager) RemovePlan(ctx context.Context, ref string, opt RemoveOptions) (Removed, []string, error) {
	sb, err := m.Lookup(ctx, ref)
	if err != nil {
		return Removed{}, nil, err
	}
	open, err := m.B.OpenSagas(ctx)
	if err != nil {
		return Removed{}, nil, err
	}
	sb = observeExits(sb)
	cmd := core.Remove
	if opt.Force {
		cmd = core.ForceRemove
	}
	if err := core.Decide(cmd, sb, open); err != nil {
		return Removed{}, nil, fmt.Errorf("refused: %w", err)
	}
	if err := core.DecideSnapshots(sb, opt.WithSnapshots); err != nil {
		return Removed{}, nil, err
	}
	rep := Removed{ID: sb.ID, Handle: sb.Handle, Resources: len(sb.Resources), Snapshots: append([]string{}, sb.Snapshots...)}
	paths := outermost(sb.Resources)
	for _, rel := range paths {
		rep.AllocatedBytes += allocated(string(m.Root), rel)
	}
	return rep, paths, nil
}

// SnapshotRemovePlan is the snapshot SnapshotRemove would delete.
func (m *Manager) SnapshotRemovePlan(ctx context.Context, ref string) (SnapshotInfo, error) {
	snap, sb, err := m.findSnapshot(ctx, ref)
	if err != nil {
		return SnapshotInfo{}, err
	}
	open, err := m.B.OpenSagas(ctx)
	if err != nil {
		return SnapshotInfo{}, err
	}
	if err := core.Decide(core.SnapshotRemove, observeExits(sb), open); err != nil {
		return SnapshotInfo{}, fmt.Errorf("refused: %w", err)
	}
	all, err := m.Snapshots(ctx, sb.ID)
	if err != nil {
		return SnapshotInfo{}, err
	}
	for _, s := range all {
		if s.ID == snap {
			return s, nil
		}
	}
	return SnapshotInfo{}, fmt.Errorf("%w: no snapshot %q", ErrNotFound, ref)
}

// VolumeRemovePlan is the volume VolumeRemove would delete, or why it
// would refuse.
func (m *Manager) VolumeRemovePlan(ctx context.Context, name string) (projections.Volume, error) {
	v, err := m.findVolume(ctx, name)
	if err != nil {
		return projections.Volume{}, err
	}
	if v == nil {
		return projections.Volume{}, fmt.Errorf("%w: no volume %q", ErrNotFound, name)
	}
	if err := core.DecideVolumeRemove(v, name, nil); err != nil {
		return projections.Volume{}, fmt.Errorf("refused: %w", err)
	}
	return *v, nil
}
