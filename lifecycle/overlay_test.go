package lifecycle

import (
	"reflect"
	"strings"
	"testing"

	"github.com/nexus-sandbox/nexus/core"
	"github.com/nexus-sandbox/nexus/host/ext4"
	"github.com/nexus-sandbox/nexus/projections"
)

// check builds a read-only check result of a 64 MiB, 1 KiB-block image
// with usedMiB in use and 5% reserved.
func check(usedMiB int64, clean, dirty bool) ext4.Check {
	return ext4.Check{BlockSize: 1024, Blocks: 65536, UsedBlocks: usedMiB << 10, ReservedBlocks: 3276,
		ClaimedFree: 60000, Clean: clean, NeedsRecovery: dirty}
}

// TestOverlayCheck: the overlay plan decides on the check's counted
// figures, never the superblock's claim.
func TestOverlayCheck(t *testing.T) {
	c := check(10, false, true)
	c.Problems = []string{"Free blocks count wrong (60000, counted=55000)."}
	got := overlayCheck(c)
	want := core.OverlayCheck{Bytes: 64 << 20, UsableBytes: (65536 - 10240 - 3276) << 10, FillRatio: float64(10240) / float64(65536-3276),
		NeedsRecovery: true, Problems: c.Problems}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("overlayCheck(%+v) = %+v, want %+v", c, got, want)
	}
	if c.Clean = true; !overlayCheck(c).Clean {
		t.Fatal("a clean check is not passed on as clean")
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
		if usableAfter := free + g*97/100 - reserved; usableAfter < core.LowWater(c.Bytes()+g) {
			t.Fatalf("growth %d leaves %d usable, low water %d", g, usableAfter, core.LowWater(c.Bytes()+g))
		}
	}
}

// TestRunEnded: a refusal names how the last run ended only when the
// journal says its VMM exited without a stop.
func TestRunEnded(t *testing.T) {
	died := projections.Sandbox{ID: "sb1", Conditions: []projections.Condition{{Type: projections.ConditionReady, Status: "False", Reason: projections.ReasonVMMExited, Message: "VMM pid 7 killed by SIGKILL"}}}
	if got := runEnded(died); !strings.Contains(got, "VMM pid 7 killed by SIGKILL without a stop") || !strings.Contains(got, "nexus logs sb1 --log vmm") {
		t.Errorf("runEnded of a dead VMM: %q", got)
	}
	other := projections.Sandbox{ID: "sb2", Conditions: []projections.Condition{{Type: projections.ConditionReady, Status: "False", Reason: "OverlayUnflushed", Message: "x"}}}
	for _, sb := range []projections.Sandbox{{ID: "sb0"}, other} {
		if got := runEnded(sb); got != "" {
			t.Errorf("runEnded of %+v: %q, want nothing", sb, got)
		}
	}
}
