package lifecycle

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"

	"github.com/oklog/ulid/v2"

	"github.com/nexus-sandbox/nexus/events"
	"github.com/nexus-sandbox/nexus/host/disk"
	"github.com/nexus-sandbox/nexus/host/fsx"
	"github.com/nexus-sandbox/nexus/projections"
	"github.com/nexus-sandbox/nexus/sagas"
)

// attachSteps journal the attachment of named volumes, one step each.
func (m *Manager) attachSteps(mounts []Mount, readOnly bool) []sagas.Step {
	var steps []sagas.Step
	for _, mt := range mounts {
		mt := mt
		steps = append(steps, sagas.Step{
			Name: "volume." + mt.Name,
			Do: func(context.Context) ([]events.Payload, error) {
				return sagas.One(events.VolumeAttachedEvent{Name: mt.Name, GuestPath: mt.GuestPath, ReadOnly: readOnly}), nil
			},
			Undo: func(context.Context) ([]events.Payload, error) {
				return sagas.One(events.VolumeDetachedEvent{Name: mt.Name}), nil
			},
		})
	}
	return steps
}

// VolumeCreate makes a named, user-owned ext4 volume under
// volumes/<name>/. Volume files sit outside the intent system: they are
// created under a per-volume lock, and the reaper never looks at volumes/.
func (m *Manager) VolumeCreate(ctx context.Context, name string, size int64) (projections.Volume, error) {
	if !ValidName(name) {
		return projections.Volume{}, fmt.Errorf("%w: volume name %q: want lowercase letters, digits, '-', '_'", ErrRefused, name)
	}
	if size < 8<<20 {
		return projections.Volume{}, fmt.Errorf("%w: volume size %d: at least 8 MiB", ErrRefused, size)
	}
	if v, _ := m.findVolume(ctx, name); v != nil {
		return projections.Volume{}, fmt.Errorf("%w: volume %q exists", ErrRefused, name)
	}
	if err := m.ensureDirs("volumes"); err != nil {
		return projections.Volume{}, err
	}
	dir := m.Root.VolumeDir(name)
	if err := fsx.Mkdir(string(m.Root), dir, 0o700); err != nil {
		if errors.Is(err, os.ErrExist) {
			return projections.Volume{}, fmt.Errorf("%w: %s exists but the journal has no volume %q; move it aside first", ErrRefused, dir, name)
		}
		return projections.Volume{}, err
	}
	l, err := m.volumeLock(name)
	if err != nil {
		return projections.Volume{}, err
	}
	defer l.Release()
	if err := fsx.Mkdir(string(m.Root), dir+"/data", 0o700); err != nil {
		return projections.Volume{}, err
	}
	if err := disk.MakeExt4(m.Root.VolumeDisk(name), size, ""); err != nil {
		fsx.Remove(string(m.Root), m.rel(dir))
		return projections.Volume{}, err
	}
	e := events.New(ulid.Make(), nowUTC(), "", events.VolumeCreatedEvent{Name: name, Path: m.rel(m.Root.VolumeDisk(name)), SizeBytes: size})
	if _, err := m.B.Append(ctx, e); err != nil {
		return projections.Volume{}, err
	}
	v, _ := m.findVolume(ctx, name)
	return *v, nil
}

func (m *Manager) findVolume(ctx context.Context, name string) (*projections.Volume, error) {
	vols, err := m.B.Volumes(ctx)
	if err != nil {
		return nil, err
	}
	for _, v := range vols {
		if v.Name == name {
			return &v, nil
		}
	}
	return nil, nil
}

// Volumes lists the named volumes.
func (m *Manager) Volumes(ctx context.Context) ([]projections.Volume, error) { return m.B.Volumes(ctx) }

// VolumeRemove deletes a volume's files, refusing while any sandbox has it
// attached. This is the only path in nexus that deletes volume data, and
// only on the user's explicit command.
func (m *Manager) VolumeRemove(ctx context.Context, name string) error {
	v, err := m.findVolume(ctx, name)
	if err != nil {
		return err
	}
	if v == nil {
		return fmt.Errorf("%w: no volume %q", ErrNotFound, name)
	}
	if len(v.AttachedTo) > 0 {
		return fmt.Errorf("%w: volume %q is attached to %s; remove or stop using those sandboxes first", ErrRefused, name, strings.Join(v.AttachedTo, ", "))
	}
	l, err := m.volumeLock(name)
	if err != nil {
		return fmt.Errorf("%w: volume %q is in use: %v", ErrRefused, name, err)
	}
	defer l.Release()
	if err := fsx.Remove(string(m.Root), m.rel(m.Root.VolumeDir(name))); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	_, err = m.B.Append(ctx, events.New(ulid.Make(), nowUTC(), "", events.VolumeRemovedEvent{Name: name}))
	return err
}

// PruneReport says what `volume prune` found and did.
type PruneReport struct {
	Apply bool `json:"apply"`
	// Stale lists attachments naming a sandbox that no longer exists.
	Stale []string `json:"stale_attachments"`
	// Detached lists volumes no sandbox uses; deleted only with
	// --apply --include-detached.
	Detached []string `json:"detached"`
	Removed  []string `json:"removed"`
}

// VolumePrune clears attachments whose sandbox is gone and, when asked,
// deletes volumes nothing is attached to.
func (m *Manager) VolumePrune(ctx context.Context, apply, includeDetached bool) (PruneReport, error) {
	rep := PruneReport{Apply: apply, Stale: []string{}, Detached: []string{}, Removed: []string{}}
	vols, err := m.B.Volumes(ctx)
	if err != nil {
		return rep, err
	}
	list, err := m.sandboxes(ctx)
	if err != nil {
		return rep, err
	}
	live := map[string]bool{}
	for _, sb := range list {
		live[sb.ID] = true
	}
	for _, v := range vols {
		attached := 0
		for _, sb := range v.AttachedTo {
			if live[sb] {
				attached++
				continue
			}
			rep.Stale = append(rep.Stale, v.Name+"@"+sb)
			if apply {
				e := events.New(ulid.Make(), nowUTC(), sb, events.VolumeDetachedEvent{Name: v.Name})
				if _, err := m.B.Append(ctx, e); err != nil {
					return rep, err
				}
			}
		}
		if attached == 0 {
			rep.Detached = append(rep.Detached, v.Name)
			if apply && includeDetached {
				if err := m.VolumeRemove(ctx, v.Name); err != nil {
					return rep, err
				}
				rep.Removed = append(rep.Removed, v.Name)
			}
		}
	}
	return rep, nil
}
