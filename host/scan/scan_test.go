package scan

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/nexus-sandbox/nexus/events"
)

const id = "01HZZZZZZZZZZZZZZZZZZZZZZB"

func touch(t *testing.T, root, rel string) {
	t.Helper()
	p := filepath.Join(root, rel)
	if err := os.MkdirAll(filepath.Dir(p), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
}

// TestReap_NeverTouchesVolumes guards the structural exclusion of named
// volumes: the scan boundary must never reach volumes/ (nor images/ or
// caches/), even when they hold names that look exactly like reapable
// resources.
func TestReap_NeverTouchesVolumes(t *testing.T) {
	root := t.TempDir()
	for _, rel := range []string{
		"volumes/data/disk.ext4", "volumes/" + id + "/" + id + ".raw", "volumes/disks/" + id + ".raw",
		"caches/buildkit.ext4", "images/" + id + ".raw", "disks/" + id + ".raw",
	} {
		touch(t, root, rel)
	}
	res, err := Root(root)
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range res.Opened {
		if d == "volumes" || d == "caches" || d == "images" || strings.HasPrefix(d, "volumes/") {
			t.Fatalf("scan opened %s", d)
		}
	}
	if len(res.Entries) != 1 || res.Entries[0].Rel != "disks/"+id+".raw" || res.Entries[0].Kind != events.KindRawDisk {
		t.Fatalf("scan found %+v, want only disks/%s.raw", res.Entries, id)
	}
	for _, e := range res.Entries {
		if strings.HasPrefix(e.Rel, "volumes") || strings.HasPrefix(e.Rel, "caches") || strings.HasPrefix(e.Rel, "images") {
			t.Fatalf("scan listed %s", e.Rel)
		}
	}
}

func TestScanStatsWithoutFollowing(t *testing.T) {
	root, outside := t.TempDir(), t.TempDir()
	big := filepath.Join(outside, "big")
	os.WriteFile(big, make([]byte, 1<<20), 0o600)
	touch(t, root, "disks/"+id+"-workspace.ext4")
	os.Symlink(big, filepath.Join(root, "disks", id+".raw"))
	os.MkdirAll(filepath.Join(root, "supervisors", id), 0o700)
	os.WriteFile(filepath.Join(root, "supervisors", id, "mitm-ca.pem"), make([]byte, 64<<10), 0o600)
	// A whole scanned directory that is a link is not entered.
	os.Symlink(outside, filepath.Join(root, "snapshots"))
	res, err := Root(root)
	if err != nil {
		t.Fatal(err)
	}
	byRel := map[string]bool{}
	for _, e := range res.Entries {
		byRel[e.Rel] = true
		if e.Rel == "disks/"+id+".raw" && (!e.Symlink || e.Allocated >= 1<<20) {
			t.Fatalf("link measured through: %+v", e)
		}
		if e.Rel == "disks/"+id+"-workspace.ext4" && e.Allocated == 0 {
			t.Fatalf("allocated bytes missing: %+v", e)
		}
	}
	if len(res.Errors) != 1 || !strings.Contains(res.Errors[0], "snapshots") {
		t.Fatalf("a linked snapshots/ must be an error, got %v", res.Errors)
	}
	if got := TreeAllocated(root, "supervisors/"+id); got < 64<<10 {
		t.Fatalf("tree allocated %d, want at least 64 KiB", got)
	}
	if !byRel["supervisors/"+id] {
		t.Fatal("supervisor dir not listed")
	}
}

// A directory's entries are listed in name order, whatever order the
// directory keeps them in: the reaper asks their owners batch by batch,
// and in this order each batch reads one stretch of the store's index.
func TestScanListsInNameOrder(t *testing.T) {
	root := t.TempDir()
	var want []string
	for i := range 200 {
		rel := fmt.Sprintf("disks/%03d-%d.raw", (i*37)%200, i)
		touch(t, root, rel)
		want = append(want, rel)
	}
	slices.Sort(want)
	res, err := Root(root)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, e := range res.Entries {
		got = append(got, e.Rel)
	}
	if !slices.Equal(got, want) {
		t.Fatalf("scan listed disks/ as %v..., want name order", got[:5])
	}
}
