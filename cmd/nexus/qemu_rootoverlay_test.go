package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/nexus-sandbox/nexus/host/ext4/ext4test"
	"github.com/nexus-sandbox/nexus/internal/testutil"
)

const imageMarker = "this file is in the image\n"

// ext4Image is an ext4 OS image holding /etc/nexus-image, made outside
// any state root.
func ext4Image(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	tree := filepath.Join(dir, "tree")
	os.MkdirAll(filepath.Join(tree, "etc"), 0o755)
	if err := os.WriteFile(filepath.Join(tree, "etc", "nexus-image"), []byte(imageMarker), 0o644); err != nil {
		t.Fatal(err)
	}
	img := filepath.Join(dir, "os.ext4")
	if out, err := exec.Command("mkfs.ext4", "-q", "-F", "-d", tree, img, "32M").CombinedOutput(); err != nil {
		t.Fatalf("mkfs.ext4: %v\n%s", err, out)
	}
	return img
}

// TestQEMUOverlayRootKeepsTheImage: two real guests, with the agent as
// PID 1, boot on one image's cache entry under overlay roots (each QEMU
// given the entry file read-only): each sees
// the image's files at /, a file one writes to / is on its own workspace
// disk (the overlay's upper layer, read back from the stopped disk with
// debugfs) and not in the other guest, and the entry and the image keep
// their checksums. Filling / to ENOSPC is recovered on the next start as
// a full workspace is: the overlay grows, OverlayDiskFull is journaled,
// and every file, the filler's bytes included, comes back.
func TestQEMUOverlayRootKeepsTheImage(t *testing.T) {
	testutil.StartsSandboxes(t)
	q := newRealGuest(t, 32)
	q.env = append(q.env, sharedRootEnv...)
	image := ext4Image(t)
	imageSum := ext4test.SHA256(t, image)
	a := strings.Fields(q.ok("create", "create", "--image", image))[0]
	b := strings.Fields(q.ok("create", "create", "--image", image))[0]
	rows := cacheList(t, q.root)
	if len(rows) != 1 {
		t.Fatalf("cache entries: %+v", rows)
	}
	entry := filepath.Join(q.root, "images", rows[0].CacheID, "disk.raw")
	entrySum := ext4test.SHA256(t, entry)
	for _, id := range []string{a, b} {
		if got := inspectJSON(t, q.root, id).Root; got != "overlay" {
			t.Fatalf("%s: root %q, want overlay", id, got)
		}
		// Both QEMUs are given the one entry file, read-only.
		vmmLog, _ := os.ReadFile(filepath.Join(q.root, "logs", id+".vmm.log"))
		if want := "file=" + entry + ",format=raw,if=none,id=disk0,readonly=on"; !strings.Contains(string(vmmLog), want) {
			t.Fatalf("%s: QEMU was not given %s:\n%s", id, want, vmmLog)
		}
		q.ready(id) // guestfill lands in the overlay root
		if got := string(q.cat(id, "/etc/nexus-image")); got != imageMarker {
			t.Fatalf("%s: the image's file reads %q in the guest", id, got)
		}
	}
	const rootText = "written to / by the guest\n"
	q.exec(a, "write", "/root-file", rootText, "nosync")
	q.exec(a, "write", "/etc/nexus-image", "changed by the guest\n", "nosync")
	if r := q.run("cp", b+":/root-file", filepath.Join(t.TempDir(), "x")); r.code == 0 {
		t.Fatal("a file guest a wrote to / is in guest b")
	}
	if got := string(q.cat(b, "/etc/nexus-image")); got != imageMarker {
		t.Fatalf("guest b sees the image's file as %q after guest a changed its own", got)
	}
	fill, err := strconv.ParseInt(strings.TrimSpace(q.exec(a, "fill", "/fill")), 10, 64)
	if err != nil || fill < 4<<20 {
		t.Fatalf("the filler of / wrote %d bytes (%v): want the overlay filled", fill, err)
	}
	if r := q.run("stop", a); r.code != 0 || strings.Contains(r.stderr, "warning") {
		t.Fatalf("stop: exit %d: %s (want the agent's flush acknowledged)", r.code, r.stderr)
	}
	// The write is on a's workspace disk, in the overlay's upper layer.
	ws := overlayOf(q.root, a)
	out, err := exec.Command("debugfs", "-R", "cat /.nexus-root/upper/root-file", ws).Output()
	if err != nil || string(out) != rootText {
		t.Fatalf("debugfs cat of the upper layer's root-file on %s: %q %v", ws, out, err)
	}
	if got := ext4test.SHA256(t, entry); got != entrySum {
		t.Fatal("the cache entry changed under a guest writing to /")
	}
	if got := ext4test.SHA256(t, image); got != imageSum {
		t.Fatal("the image changed")
	}
	before := fileSize(t, ws)
	q.ok("start", "start", a)
	if grown := fileSize(t, ws); grown < before+64<<20 {
		t.Fatalf("overlay %d -> %d bytes after / was filled: want it grown by at least 64 MiB", before, grown)
	}
	if warn := q.ok("events", "events", "--type", "warning.raised", "--sandbox", a); !strings.Contains(warn, "OverlayDiskFull") {
		t.Fatalf("journaled warnings after / was filled: %q", warn)
	}
	q.ready(a)
	if got := string(q.cat(a, "/root-file")); got != rootText {
		t.Errorf("/root-file after the recovered start: %q", got)
	}
	if got := string(q.cat(a, "/etc/nexus-image")); got != "changed by the guest\n" {
		t.Errorf("the guest's own /etc/nexus-image after start: %q", got)
	}
	if filler := q.cat(a, "/fill"); int64(len(filler)) != fill {
		t.Errorf("/fill after start: %d bytes, want %d", len(filler), fill)
	}
	q.exec(a, "write", "/after", "written after the recovery", "sync")
	if got := ext4test.SHA256(t, entry); got != entrySum {
		t.Fatal("the cache entry changed")
	}
	q.finish(a, b)
	if got := ext4test.SHA256(t, image); got != imageSum {
		t.Fatal("the image changed")
	}
}
