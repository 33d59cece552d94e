package lifecycle

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/oklog/ulid/v2"

	"github.com/nexus-sandbox/nexus/core"
	"github.com/nexus-sandbox/nexus/events"
	"github.com/nexus-sandbox/nexus/host/scan"
	"github.com/nexus-sandbox/nexus/projections"
	"github.com/nexus-sandbox/nexus/sagas"
)

// SnapshotInfo is one snapshot as `snapshot ls` shows it.
type SnapshotInfo struct {
	ID      string `json:"id"`
	Sandbox string `json:"sandbox"`
	Handle  string `json:"handle,omitempty"`
	// Labels are that sandbox's labels.
	Labels events.Labels `json:"labels,omitempty"`
	// CreatedAt is the time in the snapshot's ULID, when it was taken.
	CreatedAt time.Time `json:"created_at"`
	// AllocatedBytes is what its directory holds on disk now.
	AllocatedBytes int64 `json:"allocated_bytes"`
}

// Snapshots lists the snapshots of every sandbox, or of the one ref names
// (then without the list).
func (m *Manager) Snapshots(ctx context.Context, ref string) ([]SnapshotInfo, error) {
	var list []projections.Sandbox
	if ref != "" {
		sb, err := m.Lookup(ctx, ref)
		if err != nil {
			return nil, err
		}
		list = []projections.Sandbox{sb}
	} else {
		var err error
		if list, err = m.B.Sandboxes(ctx); err != nil {
			return nil, err
		}
	}
	out := []SnapshotInfo{}
	for _, sb := range list {
		for _, snap := range sb.Snapshots {
			out = append(out, m.snapshotInfo(sb, snap))
		}
	}
	return out, nil
}

func (m *Manager) snapshotInfo(sb projections.Sandbox, snap string) SnapshotInfo {
	info := SnapshotInfo{ID: snap, Sandbox: sb.ID, Handle: sb.Handle, Labels: sb.Labels,
		AllocatedBytes: scan.TreeAllocated(string(m.Root), m.rel(m.Root.Snapshot(sb.ID, snap)))}
	if u, err := ulid.ParseStrict(snap); err == nil {
		info.CreatedAt = ulid.Time(u.Time()).UTC()
	}
	return info
}

// findSnapshot resolves a snapshot reference by projections.MatchSnapshot
// (an exact ID, any case, or a unique prefix of an ID or short ID) to the
// snapshot and its sandbox. An exact ID is one per-entity read; any other
// reference asks the store's snapshot indexes for its candidates, never
// the sandbox list, so restore and snapshot rm cost the same at 10
// sandboxes and 100,000.
func (m *Manager) findSnapshot(ctx context.Context, ref string) (string, projections.Sandbox, error) {
	snap := strings.ToUpper(ref)
	if sb, found, err := m.B.SnapshotOwner(ctx, snap); err != nil || found {
		return snap, sb, err
	}
	refs, err := m.B.SnapshotsNamed(ctx, ref)
	if err != nil {
		return "", projections.Sandbox{}, err
	}
	snap, err = projections.MatchSnapshot(refs, ref)
	if err == nil {
		sb, found, err := m.B.SnapshotOwner(ctx, snap)
		if err != nil || found {
			return snap, sb, err
		}
		// Removed since its candidates were read: no snapshot, as if first.
	}
	if err != nil && !errors.Is(err, projections.ErrNoMatch) {
		return "", projections.Sandbox{}, err
	}
	return "", projections.Sandbox{}, fmt.Errorf("%w: no snapshot %q", ErrNotFound, ref)
}

// snapshotRmStep names the snapshot a snapshot-rm saga deletes, so that
// recover can finish a delete it sees only the start of.
const snapshotRmStep = "delete:"

// SnapshotRemove deletes one snapshot (an ID or a unique prefix of one).
// It runs as a saga on the owning sandbox, under its lease and guarded
// like every other command on it, so it cannot race a restore that is
// copying from the snapshot, and its deletion is journaled
// (resource.reclaimed) like every other.
func (m *Manager) SnapshotRemove(ctx context.Context, ref string) (SnapshotInfo, error) {
	snap, sb, err := m.findSnapshot(ctx, ref)
	if err != nil {
		return SnapshotInfo{}, err
	}
	c, err := m.claim(ctx, sb.ID, core.SnapshotRemove)
	if err != nil {
		return SnapshotInfo{}, err
	}
	defer c.release()
	if !hasSnapshot(c.sb, snap) {
		return SnapshotInfo{}, fmt.Errorf("%w: no snapshot %q (removed meanwhile)", ErrNotFound, ref)
	}
	info := m.snapshotInfo(c.sb, snap)
	err = m.run(ctx, c, func(sb projections.Sandbox) *sagas.Saga { return m.snapshotRmSaga(sb.ID, snap) })
	if err != nil {
		return SnapshotInfo{}, err
	}
	m.writeRecord(ctx, c.sb.ID)
	return info, nil
}

func hasSnapshot(sb projections.Sandbox, snap string) bool {
	for _, s := range sb.Snapshots {
		if s == snap {
			return true
		}
	}
	return false
}

// snapshotRmSaga deletes snapshots/<sandbox>/<snap>. A teardown: finished
// forward, never compensated (a half-deleted snapshot cannot be restored).
func (m *Manager) snapshotRmSaga(sandbox, snap string) *sagas.Saga {
	s := m.saga(events.SagaSnapshotRm, sandbox, []sagas.Step{{Name: snapshotRmStep + snap, Do: func(context.Context) ([]events.Payload, error) {
		return m.reclaim(m.res(events.KindSnapshot, m.Root.Snapshot(sandbox, snap)), true, "snapshot rm")
	}}})
	s.Forward = true
	return s
}

// snapshotOfSaga is the snapshot a snapshot-rm saga deletes ("" if none).
func snapshotOfSaga(sg projections.OpenSaga) string {
	if sg.Kind != events.SagaSnapshotRm || len(sg.Steps) != 1 {
		return ""
	}
	snap, ok := strings.CutPrefix(sg.Steps[0], snapshotRmStep)
	if _, err := ulid.ParseStrict(snap); !ok || err != nil {
		return "" // never a path piece that is not a snapshot ID
	}
	return snap
}
