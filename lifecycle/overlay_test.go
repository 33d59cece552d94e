package lifecycle

import (
	"errors"
	"testing"

	"github.com/nexus-sandbox/nexus/host/ext4"
)

// check builds a read-only check result of a 64 MiB, 1 KiB-block image
// with usedMiB in use and 5% reserved.
func check(usedMiB int64, clean, dirty bool) ext4.Check {
	return ext4.Check{BlockSize: 1024, Blocks: 65536, UsedBlocks: usedMiB << 10, ReservedBlocks: 3276,
		ClaimedFree: 60000, Clean: clean, NeedsRecovery: dirty}
}

func TestPlanOverlay(t *testing.T) {
	cases := []struct {
		name          string
		last, flushed string
		c             ext4.Check
		refuse        bool
		recover, grow bool
		warn          bool
	}{
		{"roomy, acknowledged", "r1", "r1", check(10, true, false), false, false, false, false},
		{"full, acknowledged: recover and grow", "r1", "r1", check(60, true, false), false, true, true, false},
		{"full, last run unacknowledged", "r2", "r1", check(60, true, false), true, false, false, false},
		{"roomy and clean, last run unacknowledged: untouched, boots", "r2", "r1", check(10, true, false), false, false, false, false},
		{"roomy, dirty journal, last run unacknowledged", "r2", "r1", check(10, true, true), true, false, false, false},
		{"roomy, errors, last run unacknowledged", "r2", "r1", check(10, false, false), true, false, false, false},
		{"legacy full, no acknowledgement", "", "", check(60, true, false), true, false, false, false},
		{"legacy clean roomy", "", "", check(10, true, false), false, false, false, false},
		{"legacy dirty journal, no acknowledgement", "", "", check(10, true, true), true, false, false, false},
		{"acknowledged dirty journal, roomy: the guest replays it", "r1", "r1", check(10, true, true), false, false, false, false},
		{"acknowledged, corrupt, roomy: repair a copy, no growth", "r1", "r1", check(10, false, false), false, true, false, false},
		{"nearly full: warn only", "r1", "r1", ext4.Check{BlockSize: 4096, Blocks: 262144, UsedBlocks: 900 << 8, ReservedBlocks: 13107, Clean: true}, false, false, false, true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			// The superblock's claim (ClaimedFree) is the same in every
			// case: only the checked figure may decide.
			p, err := planOverlay(c.last, c.flushed, c.c, 0.9)
			var r *OverlayRefusal
			if c.refuse != errors.As(err, &r) || (c.refuse && (r.Reason != ReasonOverlayDiskFull || !errors.Is(err, ErrRefused))) {
				t.Fatalf("refusal %v, want %v", err, c.refuse)
			}
			if p.Recover != c.recover || p.Grow != c.grow || (p.Warn != "") != c.warn {
				t.Fatalf("plan %+v", p)
			}
		})
	}
}

func TestGrowthLeavesUsableSpace(t *testing.T) {
	for _, c := range []ext4.Check{check(62, true, false), {BlockSize: 4096, Blocks: 262144, UsedBlocks: 262144 - 13107, ReservedBlocks: 13107}} {
		g := growthFor(c)
		if g < MinGrowth || g%(1<<20) != 0 {
			t.Fatalf("growth %d: want >= 64 MiB in whole MiB", g)
		}
		free := (c.Blocks - c.UsedBlocks) * c.BlockSize
		reserved := c.ReservedBlocks * c.BlockSize * (c.Bytes() + g) / c.Bytes()
		if usableAfter := free + g*97/100 - reserved; usableAfter < LowWater(c.Bytes()+g) {
			t.Fatalf("growth %d leaves %d usable, low water %d", g, usableAfter, LowWater(c.Bytes()+g))
		}
	}
}
