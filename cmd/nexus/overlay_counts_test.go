package main

import (
	"context"
	"strconv"
	"strings"
	"testing"

	"github.com/nexus-sandbox/nexus/host/ext4"
	"github.com/nexus-sandbox/nexus/host/ext4/ext4test"
	"github.com/nexus-sandbox/nexus/internal/testutil"
	"github.com/nexus-sandbox/nexus/projections"
)

// TestStaleFreeCountOverlayIsRecovered: a full overlay whose
// superblock, after a plain sync, still claims almost every block free.
// e2fsck -fn says "Free blocks count wrong" and exits 0 with the stale
// figure in its summary; the start must still see a full overlay and
// recover and grow it.
func TestStaleFreeCountOverlayIsRecovered(t *testing.T) {
	testutil.StartsSandboxes(t)
	t.Parallel()
	root := overlayRoot(t, 64)
	sb, fillSize := stoppedWithFiles(t, root, false, true)
	img := overlayOf(root, sb.ID)
	c, err := ext4.CheckImage(context.Background(), img)
	if err != nil {
		t.Fatal(err)
	}
	ext4test.Debugfs(t, img, "ssv free_blocks_count "+strconv.FormatInt(c.Blocks-10, 10))
	before := fileSize(t, img)
	mustOK(t, proc(t, root, "start", sb.ID), "start")
	if grown := fileSize(t, img); grown < before+64<<20 {
		t.Fatalf("overlay %d -> %d bytes: a full overlay with a stale free count was judged roomy", before, grown)
	}
	assertFilesIntact(t, img, fillSize)
	if warn := nexus(t, root, "events", "--type", "warning.raised", "--sandbox", sb.ID).stdout; !strings.Contains(warn, "grew by") {
		t.Fatalf("warning event: %q", warn)
	}
}

// TestUnflushedDirtyJournalIsRefusedThenAccepted: an overlay with room whose
// last run has no acknowledgement and whose journal needs replay (every
// real guest's overlay after a VMM crash) is refused with that reason,
// not "full"; start --accept-unflushed replays it on a private copy.
func TestUnflushedDirtyJournalIsRefusedThenAccepted(t *testing.T) {
	testutil.StartsSandboxes(t)
	t.Parallel()
	root := overlayRoot(t, 64)
	sb, _ := stoppedWithFiles(t, root, true, false)
	img := overlayOf(root, sb.ID)
	ext4test.DirtyJournal(t, img, 60000, make([]byte, 1024))
	assertRefused(t, root, sb.ID, ext4test.SHA256(t, img), "OverlayUnflushed", "journal needs replay")
	r := proc(t, root, "start", sb.ID)
	if strings.Contains(r.stderr, "is full") || !strings.Contains(r.stderr, "no flush acknowledgement") || !strings.Contains(r.stderr, "--accept-unflushed") {
		t.Fatalf("refusal message %q", r.stderr)
	}
	mustOK(t, proc(t, root, "start", sb.ID, "--accept-unflushed"), "start --accept-unflushed")
	if s := inspect(t, root, sb.ID); s.State != projections.StateRunning {
		t.Fatalf("after start --accept-unflushed: %+v", s)
	}
	if rec := nexus(t, root, "events", "--type", "overlay.recovered", "--json").stdout; !strings.Contains(rec, `"replayed":true`) {
		t.Fatalf("overlay.recovered: %q", rec)
	}
	assertFilesIntact(t, img, 0)
}
