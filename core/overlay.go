package core

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
