package lifecycle

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"sort"
	"time"

	"github.com/oklog/ulid/v2"

	"github.com/nexus-sandbox/nexus/core"
	"github.com/nexus-sandbox/nexus/events"
	"github.com/nexus-sandbox/nexus/host/disk"
	"github.com/nexus-sandbox/nexus/host/fsx"
	"github.com/nexus-sandbox/nexus/host/imagecache"
	"github.com/nexus-sandbox/nexus/host/lease"
	"github.com/nexus-sandbox/nexus/projections"
	"github.com/nexus-sandbox/nexus/sagas"
)

// cacheLeaseWait bounds how long a create waits for a prune to finish.
const cacheLeaseWait = 30 * time.Second

// shareCache takes the image cache lease shared, for a create or a
// preparation: while any holds it, no prune can take it exclusively.
func (m *Manager) shareCache(ctx context.Context) (*lease.Lease, error) {
	if err := m.ensureDirs("images"); err != nil {
		return nil, err
	}
	wctx, cancel := context.WithTimeout(ctx, cacheLeaseWait)
	defer cancel()
	l, err := lease.AcquireShared(wctx, m.Root.ImageLease())
	if errors.Is(err, lease.ErrHeld) {
		return nil, fmt.Errorf("%w: image cache is being pruned: %v", ErrRefused, err)
	}
	if err != nil {
		// Only a held lease is a prune: an I/O error (EIO, a planted
		// file) is said as what it is, with the path.
		return nil, fmt.Errorf("image cache lease %s: %w", m.Root.ImageLease(), err)
	}
	return l, nil
}

// bootstrapOf is the cache entry sandbox id's OS disk came from, as the
// journal recorded it (zero if it recorded none).
func (m *Manager) bootstrapOf(ctx context.Context, id string) (events.Bootstrap, error) {
	return m.B.Bootstrap(ctx, id)
}

// teedDisk is a sandbox OS disk the image-cache step wrote on a miss, in
// the same pass that prepared the entry, for the os-disk step to adopt.
type teedDisk struct {
	path    string      // where to write it
	method  disk.Method // how it was made; "" if it was not
	adopted bool        // the os-disk step took it over (and its undo)
}

// imageCacheStep prepares plan's image into the cache unless a committed
// entry of the same identity exists, and journals the entry and its use.
// On a miss it also writes the sandbox's OS disk (tee) from the same read
// of the image, so a miss copies the image once, not image → entry →
// disk. An entry is shared, owned by no sandbox, and prunable once nothing
// references it, so the undo never touches it; it only removes a teed disk
// the os-disk step did not take over (the intent covers it until then).
func (m *Manager) imageCacheStep(plan createPlan, tee *teedDisk) sagas.Step {
	return sagas.Step{
		Name: "image-cache",
		Do: func(ctx context.Context) ([]events.Payload, error) {
			now := nowUTC().UnixMilli()
			id := imagecache.Identity{CacheID: plan.boot.CacheID, Ref: plan.image, Identity: plan.boot.Identity,
				Layout: imagecache.LayoutVersion, PreparedMs: now}
			update, end := m.copyProgress("image cache entry of " + plan.image)
			also := ""
			if tee != nil {
				// O_EXCL below; the os-disk step's check for a path that is
				// not this saga's runs here too, before anything is written.
				if there, err := fsx.Lexists(string(m.Root), m.rel(tee.path)); err == nil && !there {
					also = tee.path
				}
			}
			_, _, method, err := imagecache.PrepareAlso(m.Root, plan.image, id, also, update)
			end()
			if err != nil {
				return nil, err
			}
			if tee != nil {
				tee.method = method
			}
			// Journaled on every use, not only when this create committed the
			// entry: folding it again is harmless, and it adopts an entry a
			// create killed before journaling left behind, without fetching
			// the whole cache projection to find out.
			ps := []events.Payload{events.ImageCachePreparedEvent{CacheID: id.CacheID, Ref: id.Ref, Identity: id.Identity,
				Layout: id.Layout, Path: m.rel(m.Root.ImageEntry(id.CacheID))}}
			return append(ps, events.ImageCacheUsedEvent{CacheID: id.CacheID, LastUseMs: now}), nil
		},
		Undo: func(context.Context) ([]events.Payload, error) {
			if tee == nil || tee.method == "" || tee.adopted {
				return nil, nil
			}
			if err := fsx.Remove(string(m.Root), m.rel(tee.path)); err != nil && !errors.Is(err, fs.ErrNotExist) {
				return nil, err
			}
			tee.method = ""
			return nil, nil
		},
	}
}

// CacheListing is one row of `nexus image-cache list`. Nil fields are
// unknown: the entry was created without metadata.
type CacheListing struct {
	CacheID   string  `json:"cache_id"`
	Ref       *string `json:"image_ref"`
	Allocated int64   `json:"allocated_bytes"`
	Apparent  int64   `json:"apparent_bytes"`
	// LastUsedAt is the last create that cloned the entry (journaled in
	// milliseconds), nil when no create is known to have used it.
	LastUsedAt *time.Time `json:"last_used_at"`
	Layout     *int       `json:"layout_version"`
	Sandboxes  []string   `json:"sandboxes"`

	usedMs int64 // last use, else preparation, else the disk's mtime (Unix ms)
}

// ImageCacheList joins the committed entries on disk with what the journal
// knows about them. It takes no lease. An entry the journal does not know
// (prepared by a create that died before journaling it) falls back to its
// identity file; one with neither shows unknowns.
func (m *Manager) ImageCacheList(ctx context.Context) ([]CacheListing, []imagecache.Skipped, error) {
	st, err := m.B.ImageCache(ctx)
	if err != nil {
		return nil, nil, err
	}
	list, skipped, err := m.listWith(st)
	return list, skipped, err
}

func (m *Manager) listWith(st projections.ImageCacheState) ([]CacheListing, []imagecache.Skipped, error) {
	found, skipped, err := imagecache.Scan(m.Root)
	if err != nil {
		return nil, nil, err
	}
	known := make(map[string]*projections.CacheEntry, len(st.Entries))
	for i := range st.Entries {
		known[st.Entries[i].CacheID] = &st.Entries[i]
	}
	refs, unattributed := st.References()
	out := make([]CacheListing, 0, len(found))
	for _, e := range found {
		l := CacheListing{CacheID: e.CacheID, Allocated: e.Allocated, Apparent: e.Apparent, usedMs: e.ModMs}
		if ent := known[e.CacheID]; ent != nil {
			if ent.Ref != "" {
				l.Ref = &ent.Ref
			}
			if ent.Layout != 0 {
				l.Layout = &ent.Layout
			}
			if ent.LastUseMs != 0 {
				t := time.UnixMilli(ent.LastUseMs).UTC()
				l.LastUsedAt = &t
				l.usedMs = ent.LastUseMs
			}
		} else if id, err := imagecache.ReadIdentity(m.Root, e.CacheID); err == nil {
			if id.Ref != "" {
				l.Ref = &id.Ref
			}
			if id.Layout != 0 {
				l.Layout = &id.Layout
			}
			if id.PreparedMs != 0 {
				l.usedMs = id.PreparedMs
			}
		}
		l.Sandboxes = append(append([]string{}, refs[e.CacheID]...), unattributed...)
		sort.Strings(l.Sandboxes)
		out = append(out, l)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].CacheID < out[j].CacheID })
	return out, skipped, nil
}

// CachePruneOptions is `image-cache prune --unused [--dry-run] [--older-than]
// [--max-bytes]`.
type CachePruneOptions struct {
	DryRun    bool
	OlderThan time.Duration // 0: any age
	MaxBytes  int64         // -1: no size target
}

// KeptEntry is an entry prune left, and why.
type KeptEntry struct {
	CacheID string `json:"cache_id"`
	Reason  string `json:"reason"`
}

// CachePruneReport is what prune removed (or, dry, would remove).
type CachePruneReport struct {
	DryRun         bool                 `json:"dry_run"`
	Removed        []CacheListing       `json:"removed"`
	AllocatedBytes int64                `json:"allocated_bytes"` // before removal
	Kept           []KeptEntry          `json:"kept"`
	Skipped        []imagecache.Skipped `json:"skipped"`
	CacheBytes     int64                `json:"cache_after_bytes"`
}

// PruneImageCache removes committed entries no persisted sandbox
// references. A real prune holds the cache lease exclusively (refusing,
// with the holders named, if a create holds it), reads the references
// only once it holds it, and journals each removal; it works whether or
// not the daemon runs, because both coordinate through the lease and the
// journal. A dry run takes no lease and changes nothing.
func (m *Manager) PruneImageCache(ctx context.Context, opts CachePruneOptions) (CachePruneReport, error) {
	rep := CachePruneReport{DryRun: opts.DryRun}
	if !opts.DryRun {
		if ok, err := fsx.Lexists(string(m.Root), "images"); err != nil || !ok {
			return rep, err // no cache, nothing to prune
		}
		if err := m.ensureDirs("images"); err != nil {
			return rep, err // images/ is a symlink: the lease is never opened through it
		}
		l, err := lease.TryAcquireNaming(m.Root.ImageLease())
		if err != nil {
			if errors.Is(err, lease.ErrHeld) {
				return rep, fmt.Errorf("%w: image cache is in use: %v", ErrRefused, err)
			}
			return rep, err
		}
		defer l.Release()
	}
	st, err := m.B.ImageCache(ctx)
	if err != nil {
		return rep, err
	}
	list, skipped, err := m.listWith(st)
	if err != nil {
		return rep, err
	}
	rep.Skipped = skipped
	entries := make([]core.CachedImage, len(list))
	byID := make(map[string]CacheListing, len(list))
	for i, l := range list {
		entries[i] = core.CachedImage{CacheID: l.CacheID, Allocated: l.Allocated, UsedMs: l.usedMs}
		byID[l.CacheID] = l
	}
	ids, kept, err := core.PrunePlan(entries, st, core.PruneLimits{OlderThan: opts.OlderThan, MaxBytes: opts.MaxBytes}, nowUTC().UnixMilli())
	if err != nil {
		return rep, fmt.Errorf("%w: %w", ErrRefused, err)
	}
	for _, k := range kept {
		rep.Kept = append(rep.Kept, KeptEntry(k))
	}
	var remove []CacheListing
	for _, id := range ids {
		remove = append(remove, byID[id])
	}
	for _, l := range list {
		rep.CacheBytes += l.Allocated
	}
	if opts.DryRun {
		rep.Removed = remove
		for _, r := range remove {
			rep.AllocatedBytes += r.Allocated
			rep.CacheBytes -= r.Allocated
		}
		return rep, nil
	}
	if err := imagecache.RemoveLeftovers(m.Root); err != nil {
		return rep, err
	}
	for _, r := range remove {
		if err := imagecache.Remove(m.Root, r.CacheID); err != nil {
			return rep, err
		}
		rep.Removed = append(rep.Removed, r)
		rep.AllocatedBytes += r.Allocated
		rep.CacheBytes -= r.Allocated
		if err := m.appendCache(ctx, events.ImageCachePrunedEvent{CacheID: r.CacheID, AllocatedBytes: r.Allocated}); err != nil {
			return rep, err
		}
	}
	// Entries the journal still lists but the disk no longer holds (a prune
	// killed between delete and journal): with the lease held exclusively
	// no create can be preparing them, so the journal is told.
	onDisk := make(map[string]bool, len(list))
	for _, l := range list {
		onDisk[l.CacheID] = true
	}
	for _, ent := range st.Entries {
		if onDisk[ent.CacheID] {
			continue
		}
		if ok, err := fsx.Lexists(string(m.Root), "images/"+ent.CacheID); err == nil && !ok {
			if err := m.appendCache(ctx, events.ImageCachePrunedEvent{CacheID: ent.CacheID}); err != nil {
				return rep, err
			}
		}
	}
	return rep, nil
}

func (m *Manager) appendCache(ctx context.Context, p events.Payload) error {
	_, err := m.B.Append(ctx, events.New(ulid.Make(), nowUTC(), "", p))
	return err
}
