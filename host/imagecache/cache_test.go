package imagecache

import (
	"errors"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"github.com/nexus-sandbox/nexus/host/fsx"
	"github.com/nexus-sandbox/nexus/layout"
)

func testImage(t *testing.T) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "base.raw")
	f, err := os.Create(p)
	if err != nil {
		t.Fatal(err)
	}
	f.WriteAt([]byte("boot sector"), 0)
	f.WriteAt([]byte("rootfs"), 8<<20)
	f.Truncate(16 << 20)
	f.Close()
	return p
}

func identityFor(t *testing.T, image string) Identity {
	t.Helper()
	ident, id, err := IdentityOf(image)
	if err != nil {
		t.Fatal(err)
	}
	return Identity{CacheID: id, Ref: image, Identity: ident, Layout: LayoutVersion, PreparedMs: 1}
}

// TestPrepareConcurrent: preparers racing on one entry commit it exactly
// once, every one of them sees it checked, and no preparation dir is left.
func TestPrepareConcurrent(t *testing.T) {
	root := layout.Root(t.TempDir())
	image := testImage(t)
	id := identityFor(t, image)
	var wg sync.WaitGroup
	commits := make([]bool, 6)
	errs := make([]error, 6)
	for i := range commits {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			commits[i], _, errs[i] = Prepare(root, image, id)
		}(i)
	}
	wg.Wait()
	n := 0
	for i, c := range commits {
		if errs[i] != nil {
			t.Fatal(errs[i])
		}
		if c {
			n++
		}
	}
	if n != 1 {
		t.Fatalf("%d preparers committed, want exactly 1", n)
	}
	if err := Check(root, id); err != nil {
		t.Fatal(err)
	}
	names, _ := os.ReadDir(root.Images())
	if len(names) != 1 || names[0].Name() != id.CacheID {
		t.Fatalf("images/ holds %v, want only the entry", names)
	}
	got, err := ReadIdentity(root, id.CacheID)
	if err != nil || got != id {
		t.Fatalf("identity %+v, %v; want %+v", got, err, id)
	}
	entries, skipped, err := Scan(root)
	if err != nil || len(entries) != 1 || len(skipped) != 0 || entries[0].Apparent != 16<<20 || entries[0].Allocated <= 0 {
		t.Fatalf("scan: %+v %+v %v", entries, skipped, err)
	}
}

// TestIdentityFollowsWrites: rewriting the image gives it a new cache ID,
// so a stale entry is never reused for changed content.
func TestIdentityFollowsWrites(t *testing.T) {
	image := testImage(t)
	a := identityFor(t, image)
	f, _ := os.OpenFile(image, os.O_WRONLY, 0)
	f.WriteAt([]byte("changed"), 0)
	f.Close()
	if b := identityFor(t, image); b.CacheID == a.CacheID || b.Identity == a.Identity {
		t.Fatal("a rewritten image kept its cache identity")
	}
	if _, _, err := IdentityOf(filepath.Dir(image)); err == nil {
		t.Fatal("a directory has an image identity")
	}
}

// TestDamagedEntryStopsPrepare: an entry under the cache ID without its
// identity, or with another one, is refused rather than reused.
func TestDamagedEntryStopsPrepare(t *testing.T) {
	root := layout.Root(t.TempDir())
	image := testImage(t)
	id := identityFor(t, image)
	os.MkdirAll(root.ImageEntry(id.CacheID), 0o700)
	os.WriteFile(root.ImageDisk(id.CacheID), []byte("junk"), 0o600)
	if _, _, err := Prepare(root, image, id); !errors.Is(err, ErrDamaged) {
		t.Fatalf("prepare over an entry without identity: %v", err)
	}
	other := id
	other.Identity = "stat-sha256:other"
	if _, _, err := Prepare(root, image, other); !errors.Is(err, ErrDamaged) {
		t.Fatalf("prepare over an entry of another identity: %v", err)
	}
	// A source that vanishes fails the preparation and leaves no work dir.
	gone := identityFor(t, image)
	gone.CacheID = "img-gone"
	if _, _, err := Prepare(root, filepath.Join(t.TempDir(), "missing.raw"), gone); err == nil {
		t.Fatal("prepared from a missing image")
	}
	names, _ := os.ReadDir(root.Images())
	if len(names) != 1 {
		t.Fatalf("failed preparation left %v", names)
	}
}

// TestRemoveNeverFollows: Remove refuses an entry that is a symlink and
// unlinks links inside an entry without touching their targets.
func TestRemoveNeverFollows(t *testing.T) {
	root := layout.Root(t.TempDir())
	os.MkdirAll(root.Images(), 0o700)
	outside := t.TempDir()
	target := filepath.Join(outside, "disk.raw")
	os.WriteFile(target, []byte("precious"), 0o600)
	os.Symlink(outside, root.ImageEntry("linked"))
	if err := Remove(root, "linked"); !errors.Is(err, fsx.ErrSymlink) {
		t.Fatalf("remove of a symlinked entry: %v", err)
	}
	if err := Remove(root, "../disks"); !errors.Is(err, fsx.ErrEscapes) {
		t.Fatalf("remove of an escaping id: %v", err)
	}
	os.MkdirAll(root.ImageEntry("real"), 0o700)
	os.Symlink(target, root.ImageDisk("real"))
	if err := Remove(root, "real"); err != nil {
		t.Fatal(err)
	}
	if data, err := os.ReadFile(target); err != nil || string(data) != "precious" {
		t.Fatalf("link target touched: %q %v", data, err)
	}
	if _, err := os.Lstat(root.ImageEntry("real")); !os.IsNotExist(err) {
		t.Fatal("entry not removed")
	}
	names, _ := os.ReadDir(root.Images())
	if len(names) != 1 || names[0].Name() != "linked" {
		t.Fatalf("images/ holds %v", names)
	}
}

// TestPrepareRefusesImageChangedDuringCopy: an identity taken before the
// image was rewritten is not committed over the new content.
func TestPrepareRefusesImageChangedDuringCopy(t *testing.T) {
	root := layout.Root(t.TempDir())
	image := testImage(t)
	stale := identityFor(t, image)
	f, _ := os.OpenFile(image, os.O_WRONLY, 0)
	f.WriteAt([]byte("rewritten"), 0)
	f.Close()
	if _, _, err := Prepare(root, image, stale); err == nil {
		t.Fatal("committed an entry whose identity no longer matches the image")
	}
	if names, _ := os.ReadDir(root.Images()); len(names) != 0 {
		t.Fatalf("left %v", names)
	}
}
