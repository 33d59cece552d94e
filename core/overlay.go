package core

import (
	"fmt"
	"strings"
)

// Reasons a start refused by the overlay preparation carries in the
// sandbox's Ready=False condition, and the warning it raises.
const (
	ReasonOverlayDiskFull    = "OverlayDiskFull"
	ReasonProvisioningFailed = "ProvisioningFailed"
	// ReasonOverlayUnflushed refuses an overlay that has room but needs
	// offline work (its ext4 journal needs replay, or the check found
	// errors or stale counts) while its last run has no flush
	// acknowledgement: every real guest's overlay after a VMM crash.
	ReasonOverlayUnflushed = "OverlayUnflushed"
	// ReasonOverlayNearlyFull is the warning raised when an overlay's fill
	// ratio passes the configured threshold before it needs recovery.
	ReasonOverlayNearlyFull = "OverlayNearlyFull"
)

// OverlaySizeSetting is how messages name the setting an operator can
// change.
const OverlaySizeSetting = "[vm] overlay_disk_mib"

// DefaultWarnFillRatio is the fill ratio above which start warns.
const DefaultWarnFillRatio = 0.9

// LowWater is the usable space below which an overlay counts as full and
// is recovered: the larger of 8 MiB and 1/32 of its size (32 MiB of a
// 1 GiB overlay).
func LowWater(sizeBytes int64) int64 { return max(8<<20, sizeBytes/32) }

// OverlayCheck is what the read-only check of a saved overlay counted:
// every figure is e2fsck's count, never a superblock's claim.
type OverlayCheck struct {
	Bytes       int64 // the file system's size
	UsableBytes int64 // what an unprivileged guest writer can still allocate
	// FillRatio is used / (total - reserved): 1.0 is where a guest writer
	// gets ENOSPC.
	FillRatio float64
	// Clean: the check found nothing to fix, stale counts included.
	Clean bool
	// NeedsRecovery: the ext4 journal holds transactions not yet replayed.
	NeedsRecovery bool
	Problems      []string // the check's complaints, when not Clean
}

// OverlayEvidence is what start knows about a stopped sandbox's overlay
// before it boots.
type OverlayEvidence struct {
	// LastRun is the journal's marker of the sandbox's last run ("" for a
	// legacy overlay that never had one), and FlushedRun the last run
	// whose flush the guest acknowledged.
	LastRun, FlushedRun string
	// Ended, when not empty, says how the last run ended, so a refusal
	// names the cause and not only its symptom.
	Ended string
	Check OverlayCheck
	// WarnRatio is the fill ratio start warns at (0: DefaultWarnFillRatio).
	WarnRatio float64
	// AcceptUnflushed is the operator's `start --accept-unflushed`.
	AcceptUnflushed bool
}

// OverlayDecision is what start does with the overlay before it boots.
type OverlayDecision struct {
	Recover bool // work on a private copy, then publish it
	Grow    bool // the copy must grow (low space)
	// Warn is a usage warning (ReasonOverlayNearlyFull) to raise when
	// nothing else is done.
	Warn string
	// Refuse, when not empty, is the Ready=False reason start is refused
	// with, and Message the refusal's cause and way out; the overlay is
	// left untouched.
	Refuse  string
	Message string
}

// OverlayPlan decides the offline preparation of a stopped sandbox's
// overlay from the journal's run marker and acknowledgement and the
// read-only check of the saved overlay.
//
// Without an acknowledgement of the last run, nexus edits nothing: an
// overlay that would need recovery (low space, errors, stale counts) or
// whose journal needs replay is refused, both for an unacknowledged run
// and for a legacy overlay that never had one, naming the cause and the
// way out (start --accept-unflushed). A clean, roomy overlay nexus would
// not touch boots as it is, acknowledged or not; an acknowledged one whose
// journal needs replay is left to the guest.
//
// AcceptUnflushed counts the run as acknowledged, and a journal needing
// replay is replayed on a private copy (not left to the guest), under the
// same checks as any recovery.
func OverlayPlan(ev OverlayEvidence) OverlayDecision {
	c := ev.Check
	acked := ev.LastRun != "" && ev.FlushedRun == ev.LastRun
	low := c.UsableBytes < LowWater(c.Bytes)
	corrupt := !c.Clean && !c.NeedsRecovery
	which := "no run of it was flush-acknowledged"
	if ev.LastRun != "" {
		which = fmt.Sprintf("no flush acknowledgement for its last run %s", ev.LastRun)
		if ev.Ended != "" {
			which += " (" + ev.Ended + ")"
		}
	}
	const wayOut = "nexus edits an unacknowledged overlay only when told to: `nexus start --accept-unflushed ID` replays and checks it on a private copy and publishes it only if no saved block is released"
	refuse := func(reason, format string, args ...any) OverlayDecision {
		return OverlayDecision{Refuse: reason, Message: fmt.Sprintf(format, args...)}
	}
	switch {
	case ev.AcceptUnflushed && (low || corrupt || c.NeedsRecovery):
		return OverlayDecision{Recover: true, Grow: low}
	case !acked && low:
		return refuse(ReasonOverlayDiskFull,
			"the overlay is full (%d MiB usable, counted by e2fsck) and %s; %s", c.UsableBytes>>20, which, wayOut)
	case !acked && c.NeedsRecovery:
		return refuse(ReasonOverlayUnflushed,
			"%s, and the overlay's ext4 journal needs replay (as after a VMM crash); it has room (%d MiB usable); %s", which, c.UsableBytes>>20, wayOut)
	case !acked && corrupt:
		return refuse(ReasonOverlayUnflushed,
			"%s, and the read-only check found problems (%s); it has room (%d MiB usable); %s", which, strings.Join(c.Problems, "; "), c.UsableBytes>>20, wayOut)
	case low || corrupt:
		return OverlayDecision{Recover: true, Grow: low}
	}
	ratio := ev.WarnRatio
	if ratio <= 0 {
		ratio = DefaultWarnFillRatio
	}
	if c.FillRatio >= ratio {
		return OverlayDecision{Warn: fmt.Sprintf("VM overlay is %.0f%% full (warning threshold %.0f%%, %d MiB usable); remove files or increase %s for new sandboxes",
			100*c.FillRatio, 100*ratio, c.UsableBytes>>20, OverlaySizeSetting)}
	}
	return OverlayDecision{}
}
