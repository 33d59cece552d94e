package lifecycle

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"

	"github.com/dustin/go-humanize"
	"github.com/oklog/ulid/v2"

	"github.com/nexus-sandbox/nexus/core"
	"github.com/nexus-sandbox/nexus/events"
	"github.com/nexus-sandbox/nexus/host/disk"
	"github.com/nexus-sandbox/nexus/host/fsx"
	"github.com/nexus-sandbox/nexus/host/sagalease"
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
// volumes/<name>/, with labels (checked by projections.ParseLabels). Volume files sit outside the intent system: they are
// created under a per-volume lock, and the reaper never looks at volumes/.
func (m *Manager) VolumeCreate(ctx context.Context, name string, size int64, labels events.Labels) (projections.Volume, error) {
	if !ValidName(name) {
		return projections.Volume{}, fmt.Errorf("%w: volume name %q: want lowercase letters, digits, '-', '_'", ErrRefused, name)
	}
	if size < 8<<20 {
		return projections.Volume{}, fmt.Errorf("%w: volume size %d bytes: at least 8 MiB (a size takes a unit: 64M, 10G)", ErrRefused, size)
	}
	l, err := m.lease(ctx, core.Volume(name), "volume create")
	if err != nil {
		return projections.Volume{}, err
	}
	defer l.Release()
	// The revision is read before the volume, as a handle's claim is: a
	// create between the two reads shows as the volume, never as a free
	// name expected at a sequence before its create. A name used before
	// is at its last volume.removed, not at 0.
	rev, err := m.B.Rev(ctx, core.Volume(name))
	if err != nil {
		return projections.Volume{}, err
	}
	v, err := m.findVolume(ctx, name)
	if err != nil {
		return projections.Volume{}, err
	}
	if v != nil {
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
	dl, err := m.volumeLock(name)
	if err != nil {
		return projections.Volume{}, err
	}
	defer dl.Release()
	if err := fsx.Mkdir(string(m.Root), dir+"/data", 0o700); err != nil {
		return projections.Volume{}, err
	}
	if err := disk.MakeExt4(m.Root.VolumeDisk(name), size, ""); err != nil {
		fsx.Remove(string(m.Root), m.rel(dir))
		return projections.Volume{}, err
	}
	if free, err := disk.FreeBytes(dir); err == nil && size > free {
		m.notice("volume %s is %s, more than the %s free where it lives: it is sparse, and the guest's writes fail once that space is used", name, humanize.IBytes(uint64(size)), humanize.IBytes(uint64(free)))
	}
	e := events.New(ulid.Make(), nowUTC(), "", events.VolumeCreatedEvent{Name: name, Path: m.rel(m.Root.VolumeDisk(name)), SizeBytes: size, Labels: labels})
	if _, err := m.B.AppendExpect(context.WithoutCancel(ctx), []core.Expect{{Entity: core.Volume(name), Seq: rev}}, e); err != nil {
		return projections.Volume{}, err
	}
	v, _ = m.findVolume(ctx, name)
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
	l, err := m.lease(ctx, core.Volume(name), "volume rm")
	if err != nil {
		return err
	}
	defer l.Release()
	return m.volumeRemoveHeld(ctx, name, nil)
}

// volumeRemoveHeld deletes a volume whose lease the caller holds, deciding
// on a fresh read; live, if set, names the sandboxes that still exist.
func (m *Manager) volumeRemoveHeld(ctx context.Context, name string, live map[string]bool) error {
	v, err := m.findVolume(ctx, name)
	if err != nil {
		return err
	}
	if v == nil {
		return fmt.Errorf("%w: no volume %q", ErrNotFound, name)
	}
	if err := core.DecideVolumeRemove(v, name, live); err != nil {
		return fmt.Errorf("refused: %w", err)
	}
	dl, err := m.volumeLock(name)
	if err != nil {
		return fmt.Errorf("%w: volume %q is in use: %v", ErrRefused, name, err)
	}
	defer dl.Release()
	// Under the volume's lease nothing else may have attached it; the
	// expectation makes the journal say so too.
	s := m.volumeRmSaga(name)
	s.Expect = []core.Expect{{Entity: core.Volume(name), Seq: v.Rev}}
	return s.Run(ctx, m.B)
}

// volumeRmStep prefixes the one step of a volume-rm saga; the volume's name
// follows it, so recover, which may see nothing but saga.started, knows
// which volume to finish deleting.
const volumeRmStep = "delete-volume:"

// volumeRmSaga deletes a volume's files and journals volume.removed. It
// only goes forward: a runner killed mid-delete leaves the saga open and
// recover finishes the delete, so the journal never lists a volume whose
// files are gone.
func (m *Manager) volumeRmSaga(name string) *sagas.Saga {
	s := m.saga(events.SagaVolumeRm, "", []sagas.Step{{Name: volumeRmStep + name, Do: func(context.Context) ([]events.Payload, error) {
		if err := fsx.Remove(string(m.Root), m.rel(m.Root.VolumeDir(name))); err != nil && !errors.Is(err, os.ErrNotExist) {
			return nil, err
		}
		return sagas.One(events.VolumeRemovedEvent{Name: name}), nil
	}}})
	s.Forward = true
	return s
}

// volumeOfSaga is the volume a volume-rm saga deletes ("" for other sagas).
func volumeOfSaga(sg projections.OpenSaga) string {
	if sg.Kind != events.SagaVolumeRm || len(sg.Steps) != 1 {
		return ""
	}
	name, _ := strings.CutPrefix(sg.Steps[0], volumeRmStep)
	return name
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
// deletes volumes nothing is attached to. With only given, it deletes no
// volume outside it: the names the user confirmed after a dry run, so a
// volume detached since is never deleted unnamed.
func (m *Manager) VolumePrune(ctx context.Context, apply, includeDetached bool, only ...string) (PruneReport, error) {
	rep := PruneReport{Apply: apply, Stale: []string{}, Detached: []string{}, Removed: []string{}}
	vols, err := m.B.Volumes(ctx)
	if err != nil {
		return rep, err
	}
	for _, v := range vols {
		// A dry run changes nothing and takes no lease; --apply judges
		// each volume under its lease, on a fresh read of the volume and
		// of the sandboxes (one finishing a create just now is live).
		var l *sagalease.Lease
		if apply {
			if l, err = m.lease(ctx, core.Volume(v.Name), "volume prune"); err != nil {
				return rep, err
			}
		}
		del := includeDetached && (only == nil || slices.Contains(only, v.Name))
		err = m.pruneOne(ctx, v.Name, apply, del, &rep)
		l.Release()
		if err != nil {
			return rep, err
		}
	}
	return rep, nil
}

// pruneOne judges one volume (under its lease when applying).
func (m *Manager) pruneOne(ctx context.Context, name string, apply, includeDetached bool, rep *PruneReport) error {
	fresh, err := m.findVolume(ctx, name)
	if err != nil || fresh == nil {
		return err
	}
	v := *fresh
	list, err := m.sandboxes(ctx)
	if err != nil {
		return err
	}
	live := map[string]bool{}
	for _, sb := range list {
		live[sb.ID] = true
	}
	{
		attached := 0
		for _, sb := range v.AttachedTo {
			if live[sb] {
				attached++
				continue
			}
			rep.Stale = append(rep.Stale, v.Name+"@"+sb)
			if apply {
				e := events.New(ulid.Make(), nowUTC(), sb, events.VolumeDetachedEvent{Name: v.Name})
				seqs, err := m.B.AppendExpect(context.WithoutCancel(ctx), []core.Expect{{Entity: core.Volume(v.Name), Seq: v.Rev}}, e)
				if err != nil {
					return err
				}
				v.Rev = seqs[0]
			}
		}
		if attached == 0 {
			rep.Detached = append(rep.Detached, v.Name)
			if apply && includeDetached {
				if err := m.volumeRemoveHeld(ctx, v.Name, live); err != nil {
					return err
				}
				rep.Removed = append(rep.Removed, v.Name)
			}
		}
	}
	return nil
}
