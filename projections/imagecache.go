package projections

import (
	"sort"

	"github.com/vmihailenco/msgpack/v5"

	"github.com/nexus-sandbox/nexus/events"
)

// CacheEntry is what the journal knows about one prepared image disk.
type CacheEntry struct {
	CacheID   string `msgpack:"id" json:"cache_id"`
	Ref       string `msgpack:"ref,omitempty" json:"image_ref,omitempty"`
	Identity  string `msgpack:"identity,omitempty" json:"identity,omitempty"`
	Layout    int    `msgpack:"layout,omitempty" json:"layout_version,omitempty"`
	Path      string `msgpack:"path,omitempty" json:"path,omitempty"`
	LastUseMs int64  `msgpack:"last,omitempty" json:"last_use_ms,omitempty"`
}

// CacheUser is a persisted sandbox and the cache entry its OS disk came
// from. A zero Bootstrap means the sandbox predates the cache metadata.
// Root is its root mode (events.BootConfig.Root): with RootOverlay the
// entry is its OS disk, booted on read-only; else it holds a copy.
type CacheUser struct {
	Sandbox   string           `msgpack:"sb" json:"sandbox"`
	Bootstrap events.Bootstrap `msgpack:"boot,omitempty" json:"bootstrap,omitempty"`
	Root      string           `msgpack:"root,omitempty" json:"root,omitempty"`
}

// BootsOn says whether the user's guest boots on the entry itself.
func (u CacheUser) BootsOn() bool { return u.Root == events.RootOverlay }

// PendingSaga is a create, fork or restore the journal shows started and
// not yet finished or compensated: the sandbox state it will leave is not
// known, so prune must not guess.
type PendingSaga struct {
	Saga    string          `msgpack:"saga" json:"saga"`
	Kind    events.SagaKind `msgpack:"kind" json:"kind"`
	Sandbox string          `msgpack:"sb" json:"sandbox"`
}

// ImageCacheState is the image cache projection as a plain value, the form
// it crosses the daemon socket in.
type ImageCacheState struct {
	Entries []CacheEntry  `msgpack:"entries" json:"entries"`
	Users   []CacheUser   `msgpack:"users" json:"users"`
	Pending []PendingSaga `msgpack:"pending" json:"pending"`
}

// ImageCache folds the journal into the image cache's entries (prepared
// and not pruned) and the sandbox-producing sagas still open. Which entry
// each persisted sandbox came from is the sandbox's own Bootstrap
// (Sandboxes), so this view grows with the cache, not with the sandboxes;
// CacheUsers joins the two into the state's Users.
type ImageCache struct {
	seq     uint64
	entries map[string]*CacheEntry
	pending map[string]PendingSaga
}

func NewImageCache() *ImageCache {
	return &ImageCache{entries: map[string]*CacheEntry{}, pending: map[string]PendingSaga{}}
}

// CacheUsers are the persisted sandboxes of list (stopped ones included:
// only sandbox.removed ends a reference) with the entry each came from:
// the Users of an ImageCacheState. A sandbox still being created is not
// one; its saga is Pending.
func CacheUsers(list []*Sandbox) []CacheUser {
	out := make([]CacheUser, 0, len(list))
	for _, sb := range list {
		if sb.State != StateCreating {
			out = append(out, CacheUser{Sandbox: sb.ID, Bootstrap: sb.Bootstrap, Root: sb.BootConfig.Root})
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Sandbox < out[j].Sandbox })
	return out
}

func (*ImageCache) Name() string  { return "imagecache" }
func (c *ImageCache) Seq() uint64 { return c.seq }

func (c *ImageCache) Apply(seq uint64, e events.Event) {
	c.seq = seq
	switch p := e.Payload.(type) {
	case events.ImageCachePreparedEvent:
		old := c.entries[p.CacheID]
		ent := &CacheEntry{CacheID: p.CacheID, Ref: p.Ref, Identity: p.Identity, Layout: p.Layout, Path: p.Path}
		if old != nil {
			ent.LastUseMs = old.LastUseMs
		}
		c.entries[p.CacheID] = ent
	case events.ImageCacheUsedEvent:
		if ent := c.entries[p.CacheID]; ent != nil && p.LastUseMs > ent.LastUseMs {
			ent.LastUseMs = p.LastUseMs
		}
	case events.ImageCachePrunedEvent:
		delete(c.entries, p.CacheID)
	case events.SagaStartedEvent:
		if p.Kind.CreatesSandbox() {
			c.pending[e.Saga] = PendingSaga{Saga: e.Saga, Kind: p.Kind, Sandbox: e.Sandbox}
		}
	case events.SagaFinishedEvent, events.SagaCompensatedEvent:
		delete(c.pending, e.Saga)
	}
}

// State returns a copy of the projection, sorted for stable output, with
// users (CacheUsers of the sandboxes) as its Users.
func (c *ImageCache) State(users []CacheUser) ImageCacheState {
	st := ImageCacheState{
		Entries: make([]CacheEntry, 0, len(c.entries)),
		Users:   users,
		Pending: make([]PendingSaga, 0, len(c.pending)),
	}
	if st.Users == nil {
		st.Users = []CacheUser{}
	}
	for _, ent := range c.entries {
		st.Entries = append(st.Entries, *ent)
	}
	for _, p := range c.pending {
		st.Pending = append(st.Pending, p)
	}
	sort.Slice(st.Entries, func(i, j int) bool { return st.Entries[i].CacheID < st.Entries[j].CacheID })
	sort.Slice(st.Pending, func(i, j int) bool { return st.Pending[i].Saga < st.Pending[j].Saga })
	return st
}

// Entry returns what the journal knows about cacheID, or nil.
func (c *ImageCache) Entry(cacheID string) *CacheEntry {
	if ent := c.entries[cacheID]; ent != nil {
		cp := *ent
		return &cp
	}
	return nil
}

// References maps each cache ID to the sandboxes whose disk came from it
// or is it (an overlay root boots on the entry); Unattributed lists the
// sandboxes that recorded no entry and so conservatively reference all
// of them.
func (st ImageCacheState) References() (byID map[string][]string, unattributed []string) {
	byID = map[string][]string{}
	for _, u := range st.Users {
		if u.Bootstrap.CacheID == "" {
			unattributed = append(unattributed, u.Sandbox)
			continue
		}
		byID[u.Bootstrap.CacheID] = append(byID[u.Bootstrap.CacheID], u.Sandbox)
	}
	return byID, unattributed
}

// Bootstrap returns the cache entry sandbox sb recorded (zero if none).
func (st ImageCacheState) Bootstrap(sb string) events.Bootstrap {
	for _, u := range st.Users {
		if u.Sandbox == sb {
			return u.Bootstrap
		}
	}
	return events.Bootstrap{}
}

func (c *ImageCache) MarshalState() ([]byte, error) { return msgpack.Marshal(c.State(nil)) }

func (c *ImageCache) UnmarshalState(seq uint64, data []byte) error {
	var st ImageCacheState
	if err := events.StrictUnmarshal(data, &st); err != nil {
		return err
	}
	n := NewImageCache()
	for _, ent := range st.Entries {
		ent := ent
		n.entries[ent.CacheID] = &ent
	}
	for _, p := range st.Pending {
		n.pending[p.Saga] = p
	}
	c.seq, c.entries, c.pending = seq, n.entries, n.pending
	return nil
}
