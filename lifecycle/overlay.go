package lifecycle

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/oklog/ulid/v2"

	"github.com/nexus-sandbox/nexus/core"
	"github.com/nexus-sandbox/nexus/events"
	"github.com/nexus-sandbox/nexus/host/disk"
	"github.com/nexus-sandbox/nexus/host/durable"
	"github.com/nexus-sandbox/nexus/host/ext4"
	"github.com/nexus-sandbox/nexus/host/fsx"
	"github.com/nexus-sandbox/nexus/projections"
	"github.com/nexus-sandbox/nexus/sagas"
)

const (
	// MinGrowth is the least an overlay recovery grows an overlay by.
	MinGrowth = 64 << 20
	// maxGrowRounds bounds the grow-then-measure loop.
	maxGrowRounds = 4
)

// OverlayRefusal is a start refused by the overlay preparation. The
// original overlay is untouched whenever one is returned.
type OverlayRefusal struct {
	Reason  string
	Message string
}

func (r *OverlayRefusal) Error() string { return r.Reason + ": " + r.Message }
func (r *OverlayRefusal) Unwrap() error { return ErrRefused }

func refuseOverlay(reason, format string, args ...any) error {
	return &OverlayRefusal{Reason: reason, Message: fmt.Sprintf(format, args...)}
}

// overlayCheck is the read-only check's figures, as core.OverlayPlan
// decides on them.
func overlayCheck(c ext4.Check) core.OverlayCheck {
	return core.OverlayCheck{Bytes: c.Bytes(), UsableBytes: c.UsableBytes(), FillRatio: c.FillRatio(),
		Clean: c.Clean, NeedsRecovery: c.NeedsRecovery, Problems: c.Problems}
}

// runEnded says how a sandbox's last run ended when the journal knows it
// ended without a stop: the VMM's exit as its watcher saw it (a watcher
// that is not the VMM's parent cannot learn the status) and where the
// VMM's own account is. Empty otherwise.
func runEnded(sb projections.Sandbox) string {
	for _, c := range sb.Conditions {
		if c.Type == projections.ConditionReady && c.Reason == projections.ReasonVMMExited {
			return fmt.Sprintf("%s without a stop; its log: nexus logs %s --log vmm", c.Message, sb.ID)
		}
	}
	return ""
}

// growthFor is how much to add to an overlay with check c so that it has at
// least core.LowWater of usable space afterwards: MinGrowth or more, in whole
// MiB. resize2fs keeps the reserved share of the grown file system, and new
// block groups carry their own metadata (~3%), so the estimate works from
// free blocks and the reserved fraction rather than today's usable figure
// (which is floored at zero when root has eaten into the reserve).
func growthFor(c ext4.Check) int64 {
	size := c.Bytes()
	free := (c.Blocks - c.UsedBlocks) * c.BlockSize
	reservedFrac := float64(c.ReservedBlocks) / float64(max(1, c.Blocks))
	usableAfter := func(g int64) int64 {
		return free + g*97/100 - int64(reservedFrac*float64(size+g))
	}
	g := int64(MinGrowth)
	for range 4 {
		short := core.LowWater(size+g) - usableAfter(g)
		if short <= 0 {
			break
		}
		g = roundMiB(g + short*11/10)
	}
	return g
}

// overlaySteps are the offline preparation of a stopped sandbox's
// overlay (its workspace disk), run by start before anything boots:
// check -> copy -> repair -> grow -> publish. Only the private copy is ever
// written; the original changes only by the publish rename.
func (m *Manager) overlaySteps(sb projections.Sandbox, acceptUnflushed bool) []sagas.Step {
	overlay := m.Root.WorkspaceDisk(sb.ID)
	staging := m.Root.OverlayStaging(sb.ID)
	stagingRes := m.res(events.KindOverlayStaging, staging)
	var plan core.OverlayDecision
	var before, after ext4.Check
	var replayed bool
	return []sagas.Step{{
		Name: "overlay-check",
		Do: func(ctx context.Context) ([]events.Payload, error) {
			// A copy left by an interrupted recovery is never trusted.
			ps, err := m.dropStaging(ctx, sb.ID)
			if err != nil {
				return nil, err
			}
			if _, err := os.Lstat(overlay); errors.Is(err, os.ErrNotExist) {
				return nil, refuseOverlay(core.ReasonOverlayDiskFull,
					"overlay %s is missing; a published overlay is never recreated empty", m.rel(overlay))
			}
			before, err = ext4.CheckImage(ctx, overlay)
			if errors.Is(err, ext4.ErrNotExt4) {
				return nil, refuseOverlay(core.ReasonProvisioningFailed, "overlay %s is not ext4: %v", m.rel(overlay), err)
			}
			if err != nil {
				return nil, refuseOverlay(core.ReasonOverlayDiskFull, "read-only check of overlay %s: %v", m.rel(overlay), err)
			}
			plan = core.OverlayPlan(core.OverlayEvidence{LastRun: sb.LastRun, FlushedRun: sb.FlushedRun, Ended: runEnded(sb),
				Check: overlayCheck(before), WarnRatio: m.WarnFillRatio, AcceptUnflushed: acceptUnflushed})
			if plan.Refuse != "" {
				return nil, &OverlayRefusal{Reason: plan.Refuse, Message: plan.Message}
			}
			if plan.Warn != "" {
				ps = append(ps, events.WarningRaisedEvent{Reason: core.ReasonOverlayNearlyFull, Message: plan.Warn})
			}
			return ps, nil
		},
	}, {
		Name: "overlay-copy",
		Do: func(ctx context.Context) ([]events.Payload, error) {
			if !plan.Recover {
				return nil, nil
			}
			// Not fsynced here: preen and resize2fs rewrite the copy next,
			// and publish fsyncs it once before the rename.
			update, end := m.copyProgress("overlay of " + sb.ID + " for recovery")
			err := disk.CopyScratch(overlay, staging, update)
			end()
			if err != nil {
				return nil, refuseOverlay(core.ReasonOverlayDiskFull, "copy overlay for recovery: %v; free host space or increase %s", err, core.OverlaySizeSetting)
			}
			return sagas.One(events.ResourceCreatedEvent{Resource: stagingRes}), nil
		},
		Undo: func(ctx context.Context) ([]events.Payload, error) { return m.dropStaging(ctx, sb.ID) },
	}, {
		Name: "overlay-repair",
		Do: func(ctx context.Context) ([]events.Payload, error) {
			if !plan.Recover {
				return nil, nil
			}
			if _, err := ext4.Preen(ctx, staging); err != nil {
				if errors.Is(err, ext4.ErrInteractiveRepair) {
					return nil, refuseOverlay(core.ReasonOverlayDiskFull, "overlay %s %v; it was left untouched", m.rel(overlay), err)
				}
				return nil, refuseOverlay(core.ReasonOverlayDiskFull, "repair of the overlay's copy: %v", err)
			}
			var err error
			after, err = ext4.CheckImage(ctx, staging)
			if err != nil {
				return nil, refuseOverlay(core.ReasonOverlayDiskFull, "check of the repaired copy: %v", err)
			}
			if !after.Clean || after.NeedsRecovery {
				return nil, refuseOverlay(core.ReasonOverlayDiskFull, "the repaired copy is still not clean: %v", after.Problems)
			}
			if after.UsedBlocks < before.UsedBlocks || after.UsedInodes < before.UsedInodes {
				return nil, refuseOverlay(core.ReasonOverlayDiskFull,
					"journal replay or repair would release saved data (blocks %d -> %d, inodes %d -> %d); overlay %s left untouched",
					before.UsedBlocks, after.UsedBlocks, before.UsedInodes, after.UsedInodes, m.rel(overlay))
			}
			replayed = before.NeedsRecovery
			return nil, nil
		},
	}, {
		Name: "overlay-grow",
		Do: func(ctx context.Context) ([]events.Payload, error) {
			if !plan.Grow {
				return nil, nil
			}
			for round := 0; after.UsableBytes() < core.LowWater(after.Bytes()); round++ {
				if round == maxGrowRounds {
					return nil, refuseOverlay(core.ReasonOverlayDiskFull, "overlay still has only %d MiB usable after growing to %d MiB; increase %s",
						after.UsableBytes()>>20, after.Bytes()>>20, core.OverlaySizeSetting)
				}
				size := after.Bytes() + growthFor(after)
				if err := disk.Preflight(filepath.Dir(staging), size-after.Bytes()); err != nil {
					return nil, refuseOverlay(core.ReasonOverlayDiskFull, "grow overlay to %d MiB: %v; free host space or increase %s for new sandboxes", size>>20, err, core.OverlaySizeSetting)
				}
				if err := ext4.Grow(ctx, staging, size); err != nil {
					return nil, refuseOverlay(core.ReasonOverlayDiskFull, "grow overlay to %d MiB: %v", size>>20, err)
				}
				var err error
				if after, err = ext4.CheckImage(ctx, staging); err != nil || !after.Clean {
					return nil, refuseOverlay(core.ReasonOverlayDiskFull, "check of the grown copy: %v %v", err, after.Problems)
				}
			}
			return nil, nil
		},
	}, {
		Name: "overlay-publish",
		Do: func(ctx context.Context) ([]events.Payload, error) {
			if !plan.Recover {
				return nil, nil
			}
			// resize2fs and e2fsck write through their own descriptors:
			// make the copy durable before it takes the overlay's name.
			if err := syncFile(staging); err != nil {
				return nil, err
			}
			if err := os.Rename(staging, overlay); err != nil {
				return nil, fmt.Errorf("publish overlay: %w", err)
			}
			if err := durable.SyncDir(filepath.Dir(overlay)); err != nil {
				return nil, fmt.Errorf("publish overlay: %w", err)
			}
			ps := []events.Payload{
				events.OverlayRecoveredEvent{Overlay: m.rel(overlay), OldBytes: before.Bytes(), NewBytes: after.Bytes(),
					FreeBefore: before.UsableBytes(), FreeAfter: after.UsableBytes(), Replayed: replayed},
				events.ResourceReclaimedEvent{Resource: stagingRes, By: "publish"},
			}
			if grown := after.Bytes() - before.Bytes(); grown > 0 {
				ps = append(ps, events.WarningRaisedEvent{Reason: core.ReasonOverlayDiskFull, Message: fmt.Sprintf(
					"VM overlay was nearly full and grew by %d MiB for recovery (%d MiB usable now); remove files or increase %s for new sandboxes",
					grown>>20, after.UsableBytes()>>20, core.OverlaySizeSetting)})
			}
			return ps, nil
		},
	}}
}

// dropStaging removes a private copy an interrupted or refused recovery
// left, and releases it in the journal if the journal owned it.
func (m *Manager) dropStaging(ctx context.Context, id string) ([]events.Payload, error) {
	owned := false
	if sb, err := m.Find(ctx, id); err == nil {
		owned = sb.Owns(m.rel(m.Root.OverlayStaging(id)))
	}
	return m.reclaim(m.res(events.KindOverlayStaging, m.Root.OverlayStaging(id)), owned, "recover-overlay")
}

func syncFile(path string) error {
	f, err := fsx.OpenFile(filepath.Dir(path), filepath.Base(path), os.O_RDWR, 0) // no link, no FIFO
	if err != nil {
		return err
	}
	defer f.Close()
	return f.Sync()
}

// failStart journals the Error state of a sandbox whose start the overlay
// preparation refused, with its Ready=False condition.
func (m *Manager) failStart(ctx context.Context, id string, r *OverlayRefusal) error {
	_, err := m.B.Append(ctx, events.New(ulid.Make(), nowUTC(), id, events.SandboxFailedEvent{Reason: r.Reason, Message: r.Message}))
	return err
}
