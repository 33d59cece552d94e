package lifecycle

import (
	"errors"
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

func TestPlanOverlay(t *testing.T) {
	const full, unflushed = core.ReasonOverlayDiskFull, core.ReasonOverlayUnflushed
	stale := check(10, false, false)
	stale.StaleCounts, stale.Problems = true, []string{"Free blocks count wrong (60000, counted=55000)."}
	cases := []struct {
		name          string
		last, flushed string
		ended         string
		c             ext4.Check
		accept        bool
		reason        string // "" = not refused
		mention       string
		recover, grow bool
		warn          bool
	}{
		{"roomy, acknowledged", "r1", "r1", "", check(10, true, false), false, "", "", false, false, false},
		{"full, acknowledged: recover and grow", "r1", "r1", "", check(60, true, false), false, "", "", true, true, false},
		{"full, last run unacknowledged", "r2", "r1", "", check(60, true, false), false, full, "no flush acknowledgement for its last run r2", false, false, false},
		{"roomy and clean, last run unacknowledged: untouched, boots", "r2", "r1", "", check(10, true, false), false, "", "", false, false, false},
		{"roomy, dirty journal, last run unacknowledged: says so, not full", "r2", "r1", "", check(10, true, true), false, unflushed, "journal needs replay", false, false, false},
		{"a VMM that died: the refusal says how", "r2", "r1", "VMM pid 7 exited (status unknown) without a stop", check(10, true, true), false, unflushed, "last run r2 (VMM pid 7 exited (status unknown) without a stop)", false, false, false},
		{"roomy, errors, last run unacknowledged", "r2", "r1", "", check(10, false, false), false, unflushed, "found problems", false, false, false},
		{"roomy, stale counts, last run unacknowledged", "r2", "r1", "", stale, false, unflushed, "count wrong", false, false, false},
		{"legacy full, no acknowledgement", "", "", "", check(60, true, false), false, full, "no run of it was flush-acknowledged", false, false, false},
		{"legacy clean roomy", "", "", "", check(10, true, false), false, "", "", false, false, false},
		{"legacy dirty journal, no acknowledgement", "", "", "", check(10, true, true), false, unflushed, "--accept-unflushed", false, false, false},
		{"acknowledged dirty journal, roomy: the guest replays it", "r1", "r1", "", check(10, true, true), false, "", "", false, false, false},
		{"acknowledged, corrupt, roomy: repair a copy, no growth", "r1", "r1", "", check(10, false, false), false, "", "", true, false, false},
		{"acknowledged, stale counts: preen a copy", "r1", "r1", "", stale, false, "", "", true, false, false},
		{"accepted unflushed dirty journal: replay on a copy", "r2", "r1", "", check(10, true, true), true, "", "", true, false, false},
		{"accepted unflushed full: recover and grow", "r2", "r1", "", check(60, true, true), true, "", "", true, true, false},
		{"accepted, nothing to do: boots", "r2", "r1", "", check(10, true, false), true, "", "", false, false, false},
		{"nearly full: warn only", "r1", "r1", "", ext4.Check{BlockSize: 4096, Blocks: 262144, UsedBlocks: 900 << 8, ReservedBlocks: 13107, Clean: true}, false, "", "", false, false, true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			// The superblock's claim (ClaimedFree) is the same in every
			// case: only the checked figure may decide.
			p, err := planOverlay(c.last, c.flushed, c.ended, c.c, 0.9, c.accept)
			var r *OverlayRefusal
			if (c.reason != "") != errors.As(err, &r) || (c.reason != "" && (r.Reason != c.reason || !errors.Is(err, ErrRefused) || !strings.Contains(r.Message, c.mention))) {
				t.Fatalf("refusal %v, want reason %q mentioning %q", err, c.reason, c.mention)
			}
			if c.reason == unflushed && strings.Contains(r.Message, "full") {
				t.Fatalf("an overlay with room is called full: %s", r.Message)
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
