package lifecycle

import (
	"os"
	"slices"
	"testing"
)

// The cache keeps an entry a sandbox still references and prunes one none
// does: listed and planned by a dry run that changes nothing, removed and
// journaled by the real one.
func TestImageCacheListAndPrune(t *testing.T) {
	t.Parallel()
	f := newFlow(t)
	kept := f.create(CreateSpec{})
	other := f.image()
	os.WriteFile(other, []byte("another OS image"), 0o600)
	gone := f.create(CreateSpec{Image: other})
	if _, err := f.m.RemoveWith(f.ctx, gone.ID, RemoveOptions{Force: true}); err != nil {
		t.Fatal(err)
	}
	list, _, err := f.m.ImageCacheList(f.ctx)
	if err != nil || len(list) != 2 {
		t.Fatalf("list %+v, %v", list, err)
	}
	keptEntry, _ := f.j.Bootstrap(f.ctx, kept.ID)
	for _, l := range list {
		if users := l.Sandboxes; (l.CacheID == keptEntry.CacheID) != slices.Equal(users, []string{kept.ID}) || l.Ref == nil || l.LastUsedAt == nil {
			t.Fatalf("listing %+v: want the kept entry used by %s only, with its ref and last use", l, kept.ID)
		}
	}
	mark := f.j.mark()
	dry, err := f.m.PruneImageCache(f.ctx, CachePruneOptions{DryRun: true, MaxBytes: -1})
	if err != nil || len(dry.Removed) != 1 || dry.Removed[0].CacheID == keptEntry.CacheID || f.j.mark() != mark {
		t.Fatalf("dry run %+v, %v (journaled %v)", dry, err, types(f.j.since(mark)))
	}
	rep, err := f.m.PruneImageCache(f.ctx, CachePruneOptions{MaxBytes: -1})
	if err != nil || len(rep.Removed) != 1 || rep.Removed[0].CacheID != dry.Removed[0].CacheID {
		t.Fatalf("prune %+v, %v; want what the dry run planned", rep, err)
	}
	if got := types(f.j.since(mark)); !slices.Contains(got, "imagecache.pruned") {
		t.Fatalf("prune journaled %v", got)
	}
	if f.exists("images/"+rep.Removed[0].CacheID) || !f.exists("images/"+keptEntry.CacheID) {
		t.Fatalf("images left: %v", f.files("images"))
	}
}
