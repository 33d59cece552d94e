package ext4_test

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/nexus-sandbox/nexus/host/disk"
	"github.com/nexus-sandbox/nexus/host/ext4"
	"github.com/nexus-sandbox/nexus/host/ext4/ext4test"
	"github.com/nexus-sandbox/nexus/internal/testutil"
)

var ctx = context.Background()

func image(t *testing.T, mib int64) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "overlay.ext4")
	ext4test.Make(t, p, mib<<20)
	return p
}

func TestPreflightProbesEveryTool(t *testing.T) {
	banners, err := ext4.Preflight(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, tool := range []string{"e2fsck", "resize2fs", "mkfs.ext4", "debugfs", "dumpe2fs"} {
		if banners[tool] == "" {
			t.Errorf("no version banner for %s: %v", tool, banners)
		}
	}
}

func TestCheckCountsBlocksAndNeverWrites(t *testing.T) {
	img := image(t, 64)
	before := ext4test.SHA256(t, img)
	c, err := ext4.CheckImage(ctx, img)
	if err != nil {
		t.Fatal(err)
	}
	if !c.Clean || c.NeedsRecovery || c.Blocks*c.BlockSize != 64<<20 || c.UsedBlocks <= 0 || c.ReservedBlocks <= 0 {
		t.Fatalf("fresh image: %+v", c)
	}
	if c.UsableBytes() <= 0 || c.FillRatio() >= 0.5 {
		t.Fatalf("fresh image usable %d fill %.2f", c.UsableBytes(), c.FillRatio())
	}
	if ext4test.SHA256(t, img) != before {
		t.Fatal("the read-only check changed the image")
	}
}

func TestFilledImageHasNoUsableSpace(t *testing.T) {
	img := image(t, 64)
	ext4test.Write(t, img, "marker", []byte("marker\n"))
	size := ext4test.Fill(t, img, "fill")
	c, err := ext4.CheckImage(ctx, img)
	if err != nil {
		t.Fatal(err)
	}
	if c.UsableBytes() > 64*c.BlockSize || c.FillRatio() < 0.99 {
		t.Fatalf("after a %d-byte fill: usable %d, fill %.3f", size, c.UsableBytes(), c.FillRatio())
	}
	if got, err := ext4.FileSize(ctx, img, "/fill"); err != nil || got != size {
		t.Fatalf("filler size %d, %v; want %d", got, err, size)
	}
}

func TestBadMagicIsNotExt4AndUntouched(t *testing.T) {
	img := image(t, 16)
	ext4test.CorruptMagic(t, img)
	before := ext4test.SHA256(t, img)
	_, err := ext4.CheckImage(ctx, img)
	if !errors.Is(err, ext4.ErrNotExt4) {
		t.Fatalf("want ErrNotExt4, got %v", err)
	}
	if ext4test.SHA256(t, img) != before {
		t.Fatal("checking a damaged image changed it")
	}
}

func TestUnattachedInodeNeedsInteractiveRepair(t *testing.T) {
	img := image(t, 16)
	ext4test.Unattach(t, img)
	before := ext4test.SHA256(t, img)
	c, err := ext4.CheckImage(ctx, img)
	if err != nil {
		t.Fatal(err)
	}
	if c.Clean || len(c.Problems) == 0 {
		t.Fatalf("an unattached inode must be reported: %+v", c)
	}
	if ext4test.SHA256(t, img) != before {
		t.Fatal("read-only check changed the image")
	}
	cp := filepath.Join(t.TempDir(), "copy.ext4")
	if _, err := disk.Clone(img, cp); err != nil {
		t.Fatal(err)
	}
	if _, err := ext4.Preen(ctx, cp); !errors.Is(err, ext4.ErrInteractiveRepair) {
		t.Fatalf("preen of an unattached inode: want ErrInteractiveRepair, got %v", err)
	}
}

func TestDirtyJournalIsSeenAndReplayedOnPreen(t *testing.T) {
	img := image(t, 16)
	ext4test.Write(t, img, "marker", []byte("saved\n"))
	c0, _ := ext4.CheckImage(ctx, img)
	// A block far past the used ones: the replay rewrites free space only.
	ext4test.DirtyJournal(t, img, c0.Blocks-10, bytes.Repeat([]byte{'j'}, int(c0.BlockSize)))
	c, err := ext4.CheckImage(ctx, img)
	if err != nil {
		t.Fatal(err)
	}
	if !c.NeedsRecovery {
		t.Fatalf("needs_recovery not seen: %+v", c)
	}
	if _, err := ext4.Preen(ctx, img); err != nil {
		t.Fatal(err)
	}
	after, err := ext4.CheckImage(ctx, img)
	if err != nil || after.NeedsRecovery || !after.Clean {
		t.Fatalf("after preen: %+v %v", after, err)
	}
	if data, err := ext4.ReadFile(ctx, img, "/marker"); err != nil || string(data) != "saved\n" {
		t.Fatalf("marker after replay: %q %v", data, err)
	}
}

func TestGrowKeepsFiles(t *testing.T) {
	img := image(t, 32)
	ext4test.Write(t, img, "marker", []byte("keep me\n"))
	size := ext4test.Fill(t, img, "fill")
	if _, err := ext4.Preen(ctx, img); err != nil {
		t.Fatal(err)
	}
	if err := ext4.Grow(ctx, img, 96<<20); err != nil {
		t.Fatal(err)
	}
	c, err := ext4.CheckImage(ctx, img)
	if err != nil || !c.Clean || c.Bytes() != 96<<20 || c.UsableBytes() < 48<<20 {
		t.Fatalf("after growth: %+v %v", c, err)
	}
	if data, _ := ext4.ReadFile(ctx, img, "/marker"); string(data) != "keep me\n" {
		t.Fatalf("marker after growth: %q", data)
	}
	if got, _ := ext4.FileSize(ctx, img, "/fill"); got != size {
		t.Fatalf("filler %d after growth, want %d", got, size)
	}
	if err := ext4.Grow(ctx, img, 64<<20); err == nil {
		t.Fatal("Grow accepted a smaller size")
	}
	if _, err := ext4.ReadFile(ctx, img, "/nope"); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("missing file: %v", err)
	}
}

func TestPreflightNamesAMissingOrFakeTool(t *testing.T) {
	dir := t.TempDir()
	for _, tool := range []string{"e2fsck", "mkfs.ext4", "debugfs", "dumpe2fs"} {
		real, err := ext4.Lookup(tool)
		if err != nil {
			t.Fatal(err)
		}
		os.Symlink(real, filepath.Join(dir, tool))
	}
	t.Setenv(ext4.PathEnv, dir)
	if _, err := ext4.Preflight(ctx); !errors.Is(err, ext4.ErrToolMissing) || !strings.Contains(err.Error(), "resize2fs not found") {
		t.Fatalf("missing resize2fs: %v", err)
	}
	// Present but not e2fsprogs: the probe catches it.
	os.WriteFile(filepath.Join(dir, "resize2fs"), []byte("#!/bin/sh\nexit 1\n"), 0o755)
	if _, err := ext4.Preflight(ctx); !errors.Is(err, ext4.ErrToolMissing) || !strings.Contains(err.Error(), "resize2fs") {
		t.Fatalf("fake resize2fs: %v", err)
	}
}

// TestStaleSuperblockCountsAreNotBelieved: a guest that only synced can
// leave the superblock's free block and inode counts stale in either
// direction; e2fsck -fn then reports "count wrong ... Fix? no", exits 0
// and prints the stale figures in its summary. Every figure the overlay
// decision uses must be the counted one, and the image is not clean.
func TestStaleSuperblockCountsAreNotBelieved(t *testing.T) {
	for _, bs := range []string{"1024", "4096"} {
		for _, reserved := range []string{"5", "20"} {
			for _, dir := range []string{"claims-free", "claims-full"} {
				t.Run(bs+"/m"+reserved+"/"+dir, func(t *testing.T) {
					// The sample has both block sizes and both lies.
					testutil.ShortSample(t, bs == "1024" && reserved == "5" && dir == "claims-free" || bs == "4096" && reserved == "20" && dir == "claims-full")
					img := filepath.Join(t.TempDir(), "overlay.ext4")
					if err := os.WriteFile(img, nil, 0o600); err != nil {
						t.Fatal(err)
					}
					os.Truncate(img, 64<<20)
					mkfs, _ := ext4.Lookup("mkfs.ext4")
					if out, err := exec.Command(mkfs, "-q", "-F", "-b", bs, "-m", reserved, img).CombinedOutput(); err != nil {
						t.Fatalf("mkfs: %v %s", err, out)
					}
					ext4test.Write(t, img, "data", bytes.Repeat([]byte("d"), 24<<20))
					truth, err := ext4.CheckImage(ctx, img)
					if err != nil || !truth.Clean || truth.StaleCounts {
						t.Fatalf("before: %+v, %v", truth, err)
					}
					freeBlocks, freeInodes := truth.Blocks-truth.UsedBlocks, truth.Inodes-truth.UsedInodes
					staleBlocks, staleInodes := truth.Blocks-10, int64(5) // superblock says nearly empty / out of inodes
					if dir == "claims-full" {
						staleBlocks, staleInodes = 3, truth.Inodes-2
					}
					ext4test.Debugfs(t, img, "ssv free_blocks_count "+strconv.FormatInt(staleBlocks, 10), "ssv free_inodes_count "+strconv.FormatInt(staleInodes, 10))
					before := ext4test.SHA256(t, img)
					c, err := ext4.CheckImage(ctx, img)
					if err != nil {
						t.Fatal(err)
					}
					if c.UsedBlocks != truth.UsedBlocks || c.UsedInodes != truth.UsedInodes || c.UsableBytes() != truth.UsableBytes() || c.FillRatio() != truth.FillRatio() {
						t.Fatalf("stale superblock (free %d blocks, %d inodes; counted %d, %d): used %d blocks %d inodes, want %d, %d",
							staleBlocks, staleInodes, freeBlocks, freeInodes, c.UsedBlocks, c.UsedInodes, truth.UsedBlocks, truth.UsedInodes)
					}
					if c.ClaimedFree != staleBlocks || !c.StaleCounts || c.Clean || len(c.Problems) == 0 {
						t.Fatalf("stale counts not reported as a finding: %+v", c)
					}
					if ext4test.SHA256(t, img) != before {
						t.Fatal("the read-only check changed the image")
					}
				})
			}
		}
	}
}
