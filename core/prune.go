package core

import (
	"errors"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/nexus-sandbox/nexus/projections"
)

// ErrIncomplete marks a prune refused because a sandbox-producing saga is
// open: the sandbox it leaves, and the entry it references, are unknown.
var ErrIncomplete = errors.New("incomplete sandbox state")

// CachedImage is a committed image cache entry found on disk.
type CachedImage struct {
	CacheID   string
	Allocated int64 // bytes the entry holds on disk
	// UsedMs is when the entry was last used, in Unix milliseconds: the
	// last create that cloned it, else its preparation, else its disk's
	// modification time.
	UsedMs int64
}

// PruneLimits narrow an unused-prune: only entries unused for OlderThan
// (0: any age), and only until the cache fits in MaxBytes (-1: no size
// target).
type PruneLimits struct {
	OlderThan time.Duration
	MaxBytes  int64
}

// KeptEntry is an entry prune leaves, and why.
type KeptEntry struct {
	CacheID string
	Reason  string
}

// referenceReason says why sandboxes keep an entry: the ones booted on it
// (an overlay root: the entry is their OS disk, read-only) and the ones
// whose private copy came from it.
func referenceReason(st projections.ImageCacheState, sandboxes []string) string {
	bootsOn := map[string]bool{}
	for _, u := range st.Users {
		bootsOn[u.Sandbox] = u.BootsOn()
	}
	var on, from []string
	for _, sb := range sandboxes {
		if bootsOn[sb] {
			on = append(on, sb)
		} else {
			from = append(from, sb)
		}
	}
	var parts []string
	if len(on) > 0 {
		parts = append(parts, "the OS disk of "+strings.Join(on, ", ")+" (booted on read-only)")
	}
	if len(from) > 0 {
		parts = append(parts, "referenced by "+strings.Join(from, ", "))
	}
	return strings.Join(parts, "; ")
}

// PrunePlan decides which entries an unused-prune removes, least recently
// used first, and why it keeps each other one (sorted by id): nothing
// while a create, fork or restore is unfinished (ErrIncomplete); nothing
// while a persisted sandbox records no bootstrap (it may use any entry);
// never an entry a persisted sandbox references (its OS disk, for one
// booted on it under an overlay root, or the source of its copy); with OlderThan only
// entries unused for that long; with MaxBytes only until the whole cache
// fits.
func PrunePlan(entries []CachedImage, st projections.ImageCacheState, limits PruneLimits, nowMs int64) (remove []string, kept []KeptEntry, err error) {
	if len(st.Pending) > 0 {
		var open []string
		for _, p := range st.Pending {
			open = append(open, fmt.Sprintf("%s saga %s of sandbox %s", p.Kind, p.Saga, p.Sandbox))
		}
		return nil, nil, fmt.Errorf("%w: %s is unfinished; let it finish or run `nexus recover`", ErrIncomplete, strings.Join(open, ", "))
	}
	refs, unattributed := st.References()
	var candidates []CachedImage
	var total int64
	for _, e := range entries {
		total += e.Allocated
		switch {
		case len(unattributed) > 0:
			kept = append(kept, KeptEntry{e.CacheID, "sandbox " + strings.Join(unattributed, ", ") + " records no bootstrap identity and protects every entry"})
		case len(refs[e.CacheID]) > 0:
			kept = append(kept, KeptEntry{e.CacheID, referenceReason(st, refs[e.CacheID])})
		case limits.OlderThan > 0 && e.UsedMs > nowMs-limits.OlderThan.Milliseconds():
			kept = append(kept, KeptEntry{e.CacheID, "used within " + limits.OlderThan.String()})
		default:
			candidates = append(candidates, e)
		}
	}
	// Least recently used first; ties by id so the plan is deterministic.
	sort.SliceStable(candidates, func(i, j int) bool {
		if candidates[i].UsedMs != candidates[j].UsedMs {
			return candidates[i].UsedMs < candidates[j].UsedMs
		}
		return candidates[i].CacheID < candidates[j].CacheID
	})
	for _, c := range candidates {
		if limits.MaxBytes >= 0 && total <= limits.MaxBytes {
			kept = append(kept, KeptEntry{c.CacheID, fmt.Sprintf("cache fits in %d bytes", limits.MaxBytes)})
			continue
		}
		remove = append(remove, c.CacheID)
		total -= c.Allocated
	}
	sort.Slice(kept, func(i, j int) bool { return kept[i].CacheID < kept[j].CacheID })
	return remove, kept, nil
}
