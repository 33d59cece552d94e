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
type CacheUser struct {
	Sandbox   string           `msgpack:"sb" json:"sandbox"`
	Bootstrap events.Bootstrap `msgpack:"boot,omitempty" json:"bootstrap,omitempty"`
}

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

// ImageCache folds the journal into image cache references: the entries
// prepared and not pruned, the persisted sandboxes with the entry each came
// from (stopped sandboxes included: only sandbox.removed ends a
// reference), and the sandbox-producing sagas still open.
type ImageCache struct {
	seq     uint64
	entries map[string]*CacheEntry
	users   map[string]events.Bootstrap
	pending map[string]PendingSaga
}

func NewImageCache() *ImageCache {
	return &ImageCache{entries: map[string]*CacheEntry{}, users: map[string]events.Bootstrap{}, pending: map[string]PendingSaga{}}
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
	case events.SandboxCreatedEvent:
		c.users[e.Sandbox] = p.Bootstrap
	case events.SandboxForkedEvent:
		c.users[e.Sandbox] = p.Bootstrap
	case events.SandboxRestoredEvent:
		// From the snapshot's manifest; a snapshot older than the cache
		// records none, and the sandbox then protects every entry.
		c.users[e.Sandbox] = p.Bootstrap
	case events.SandboxRemovedEvent:
		delete(c.users, e.Sandbox)
	case events.SagaStartedEvent:
		if p.Kind.CreatesSandbox() {
			c.pending[e.Saga] = PendingSaga{Saga: e.Saga, Kind: p.Kind, Sandbox: e.Sandbox}
		}
	case events.SagaFinishedEvent, events.SagaCompensatedEvent:
		delete(c.pending, e.Saga)
	}
}

// State returns a copy of the projection, sorted for stable output.
func (c *ImageCache) State() ImageCacheState {
	st := ImageCacheState{
		Entries: make([]CacheEntry, 0, len(c.entries)),
		Users:   make([]CacheUser, 0, len(c.users)),
		Pending: make([]PendingSaga, 0, len(c.pending)),
	}
	for _, ent := range c.entries {
		st.Entries = append(st.Entries, *ent)
	}
	for sb, b := range c.users {
		st.Users = append(st.Users, CacheUser{Sandbox: sb, Bootstrap: b})
	}
	for _, p := range c.pending {
		st.Pending = append(st.Pending, p)
	}
	sort.Slice(st.Entries, func(i, j int) bool { return st.Entries[i].CacheID < st.Entries[j].CacheID })
	sort.Slice(st.Users, func(i, j int) bool { return st.Users[i].Sandbox < st.Users[j].Sandbox })
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

// BootstrapOf is the cache entry sandbox sb's OS disk came from (zero if
// the journal recorded none): one map read, where State copies every user.
func (c *ImageCache) BootstrapOf(sb string) events.Bootstrap { return c.users[sb] }

// References maps each cache ID to the sandboxes whose disk came from it;
// Unattributed lists the sandboxes that recorded no entry and so
// conservatively reference all of them.
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

func (c *ImageCache) MarshalState() ([]byte, error) { return msgpack.Marshal(c.State()) }

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
	for _, u := range st.Users {
		n.users[u.Sandbox] = u.Bootstrap
	}
	for _, p := range st.Pending {
		n.pending[p.Saga] = p
	}
	c.seq, c.entries, c.users, c.pending = seq, n.entries, n.users, n.pending
	return nil
}
