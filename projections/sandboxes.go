package projections

import (
	"path"
	"slices"
	"sort"
	"time"

	"github.com/vmihailenco/msgpack/v5"

	"github.com/nexus-sandbox/nexus/events"
)

// State is where a sandbox is in its lifecycle.
type State string

const (
	StateCreating State = "creating" // a create saga is under way, nothing committed
	StateStopped  State = "stopped"  // committed, no VMM
	StateRunning  State = "running"
	StateExited   State = "exited" // its VMM ended without a stop: nothing deleted, nothing running
	StateError    State = "error"
)

// Process identifies a host process by pid and start time; a pid alone can
// be reused by an unrelated process.
type Process struct {
	Pid        int    `msgpack:"pid"`
	StartTicks uint64 `msgpack:"start"`
	// Exited says the process ended without a stop (vmm.exited,
	// supervisor.exited, or pid + start time at read time): it stays
	// recorded so that stop, rm, recover and start know what to settle.
	Exited bool `msgpack:"exited,omitempty"`
}

// Condition is a Kubernetes-style status condition (Ready=False, reason).
type Condition struct {
	Type    string `msgpack:"type"`
	Status  string `msgpack:"status"`
	Reason  string `msgpack:"reason"`
	Message string `msgpack:"message"`
}

// Attachment is a named volume attached to a sandbox.
type Attachment struct {
	Name      string `msgpack:"name"`
	GuestPath string `msgpack:"guest"`
	ReadOnly  bool   `msgpack:"ro,omitempty"`
}

// Sandbox is the journal's view of one sandbox: the fold's state, and by
// its msgpack tags the store's store encoding. What the daemon sends
// (wire.Sandbox) and what commands print (docs/json.md) are types of
// their own, each made from this one in one place.
type Sandbox struct {
	ID         string       `msgpack:"id"`
	Handle     string       `msgpack:"handle,omitempty"`
	Image      string       `msgpack:"image,omitempty"`
	Driver     string       `msgpack:"driver,omitempty"`
	Parent     string       `msgpack:"parent,omitempty"`
	Snapshot   string       `msgpack:"snapshot,omitempty"`
	State      State        `msgpack:"state"`
	Saga       string       `msgpack:"saga,omitempty"`
	CreatedAt  time.Time    `msgpack:"created"`
	UpdatedAt  time.Time    `msgpack:"updated"`
	VMM        *Process     `msgpack:"vmm,omitempty"`
	Supervisor *Process     `msgpack:"sup,omitempty"`
	Volumes    []Attachment `msgpack:"vols,omitempty"`
	Conditions []Condition  `msgpack:"conds,omitempty"`
	Snapshots  []string     `msgpack:"snaps,omitempty"`
	// Resources is what the journal says this sandbox owns right now,
	// including resources of a create still in flight.
	Resources []events.Resource `msgpack:"res,omitempty"`
	// Bootstrap is the image cache entry the sandbox's OS disk came from
	// (zero if its create recorded none), for the cache's references: kept
	// with the sandbox, so a cache question about one sandbox reads one
	// record.
	Bootstrap events.Bootstrap `msgpack:"boot,omitempty"`
	// BootConfig is how the sandbox boots besides its Driver (zero fields:
	// not recorded, events.BootConfig).
	BootConfig events.BootConfig `msgpack:"bootcfg,omitempty"`
	LastRun    string            `msgpack:"run,omitempty"`
	FlushedRun string            `msgpack:"flushed,omitempty"`
	Seq        uint64            `msgpack:"seq"`
	// Rev is the sequence of the last event about this sandbox (any event
	// carrying its id): the entity sequence a decision expects (core.Expect).
	Rev uint64 `msgpack:"rev"`
	// BootAt is when the last run's VMM answered (sandbox.started), and
	// ReadyAt when that run's guest became Ready (sandbox.ready; zero:
	// not yet). IsReady says whether the sandbox is Ready now.
	BootAt  time.Time `msgpack:"boot_at,omitempty"`
	ReadyAt time.Time `msgpack:"ready_at,omitempty"`
	// Labels are the operator's, given when the sandbox was made.
	Labels events.Labels `msgpack:"labels,omitempty"`
}

// Sandboxes is every sandbox that exists or is being created. Removed
// sandboxes leave the view; their history stays in the journal.
type Sandboxes struct {
	seq  uint64
	byID map[string]*Sandbox
	// ids is every key of byID in order, or nil once a sandbox came or
	// went: rebuilt on the next List or Page, so paging through the view
	// sorts it once, not once per page.
	ids []string
	// handles and owners index the view by handle and by owned path, so
	// ByHandle and OwnerOf (the daemon's per-entity answers) cost the
	// sandboxes they name, not a scan of every sandbox. Apply keeps them
	// (reindex); UnmarshalState rebuilds them.
	handles multimap // handle → ids carrying it (one, unless a history was made by hand)
	owners  multimap // path → ids owning it
	dirs    multimap // directory below the top level → ids owning a path under it
	// snaps indexes the view by snapshot ID, so restore and snapshot rm
	// find a snapshot's sandbox without the list (SnapshotOwner).
	snaps multimap // snapshot → ids holding it
}

// multimap maps a key to a set of sandbox IDs. A path or handle has one
// sandbox almost always, so the first ID is a plain map value and only the
// rest go to more: a map or slice per key would cost several times the
// view's own memory at 100k sandboxes (measured: +139 MiB as maps).
type multimap struct {
	one  map[string]string
	more map[string][]string
}

func newMultimap() multimap {
	return multimap{one: map[string]string{}, more: map[string][]string{}}
}

// add never sees a (key, id) it holds: reindex removes every entry of a
// sandbox before adding what it holds now, and a sandbox's paths are
// distinct (claim).
func (m multimap) add(key, id string) {
	if _, taken := m.one[key]; !taken {
		m.one[key] = id
		return
	}
	m.more[key] = append(m.more[key], id)
}

func (m multimap) del(key, id string) {
	extra := m.more[key]
	if m.one[key] == id {
		if len(extra) == 0 {
			delete(m.one, key)
			return
		}
		m.one[key], extra = extra[0], extra[1:]
	} else if i := slices.Index(extra, id); i >= 0 {
		extra = append(extra[:i:i], extra[i+1:]...)
	}
	if len(extra) == 0 {
		delete(m.more, key)
	} else {
		m.more[key] = extra
	}
}

func (m multimap) has(key, id string) bool {
	return m.one[key] == id || slices.Contains(m.more[key], id)
}

// least is the smallest of key's IDs other than except (List order).
func (m multimap) least(key, except string) (id string, found bool) {
	first, ok := m.one[key]
	if !ok {
		return "", false
	}
	if first != except {
		id, found = first, true
	}
	for _, owner := range m.more[key] {
		if owner != except && (!found || owner < id) {
			id, found = owner, true
		}
	}
	return id, found
}

// NewSandboxes returns an empty view.
func NewSandboxes() *Sandboxes { return NewSandboxesAt(0) }

// NewSandboxesAt returns an empty view that has folded the journal up to
// seq: the overlay a store keeps over its stored records, which holds only
// the sandboxes touched since.
func NewSandboxesAt(seq uint64) *Sandboxes {
	return &Sandboxes{seq: seq, byID: map[string]*Sandbox{}, handles: newMultimap(), owners: newMultimap(), dirs: newMultimap(), snaps: newMultimap()}
}

// Put adds sb to the view as it is, replacing any record of its ID: a
// store seeds its overlay with a stored record before folding an event
// about that sandbox. The view keeps sb; the caller must not.
func (s *Sandboxes) Put(sb *Sandbox) {
	before := s.indexedOf(sb.ID)
	if _, had := s.byID[sb.ID]; !had {
		s.ids = nil
	}
	s.byID[sb.ID] = sb
	s.reindexAll(sb.ID, before)
}

// indexed is what the indexes hold of one sandbox. Resources and
// snapshots are the slices as they were: claim and a snapshot append past
// their length, release and dropSnapshot copy (append(r[:i:i], ...)), so an
// old slice header still reads the old values.
type indexed struct {
	handle    string
	resources []events.Resource
	snapshots []string
}

func (s *Sandboxes) indexedOf(id string) indexed {
	if sb := s.byID[id]; sb != nil {
		return indexed{sb.Handle, sb.Resources, sb.Snapshots}
	}
	return indexed{}
}

// same says whether a and b are the same slice as seen by indexed: one
// length and one first element (see indexed).
func same[T any](a, b []T) bool {
	return len(a) == len(b) && (len(a) == 0 || &a[0] == &b[0])
}

// reindex moves id's index entries from what they were (before) to what
// the sandbox holds now.
func (s *Sandboxes) reindex(id string, before indexed) {
	now := s.indexedOf(id)
	if now.handle == before.handle && same(now.resources, before.resources) && same(now.snapshots, before.snapshots) {
		return // the common event: neither handle, resources nor snapshots changed
	}
	s.reindexAll(id, before)
}

// reindexAll is reindex without its shortcut, for a record replaced whole.
func (s *Sandboxes) reindexAll(id string, before indexed) {
	if before.handle != "" {
		s.handles.del(before.handle, id)
	}
	for _, r := range before.resources {
		s.owners.del(r.Path, id)
	}
	for _, d := range ownedDirs(before.resources) {
		s.dirs.del(d, id)
	}
	for _, snap := range before.snapshots {
		s.snaps.del(snap, id)
	}
	s.index(id, s.indexedOf(id))
}

func (s *Sandboxes) index(id string, x indexed) {
	if x.handle != "" {
		s.handles.add(x.handle, id)
	}
	for _, r := range x.resources {
		s.owners.add(r.Path, id)
	}
	for _, d := range ownedDirs(x.resources) {
		s.dirs.add(d, id)
	}
	for _, snap := range x.snapshots {
		s.snaps.add(snap, id)
	}
}

func (*Sandboxes) Name() string  { return "sandboxes" }
func (s *Sandboxes) Seq() uint64 { return s.seq }

// Get returns the sandbox with id, or nil.
func (s *Sandboxes) Get(id string) *Sandbox { return s.byID[id] }

// ByHandle returns the sandbox carrying handle (the oldest, should a
// history made by hand give two the same one), or nil.
func (s *Sandboxes) ByHandle(handle string) *Sandbox {
	if id, ok := s.handles.least(handle, ""); ok && handle != "" {
		return s.byID[id]
	}
	return nil
}

// OwnerOf returns the first sandbox, in List order, other than except
// that owns one of paths, and that path. The daemon answers with it so a
// command asking "is this path taken" gets one answer, not every sandbox.
func (s *Sandboxes) OwnerOf(paths []string, except string) (id, path string, found bool) {
	for _, p := range paths {
		if owner, ok := s.owners.least(p, except); ok && (!found || owner < id) {
			id, found = owner, true
		}
	}
	if !found {
		return "", "", false
	}
	for _, p := range paths {
		if s.owners.has(p, id) {
			return id, p, true
		}
	}
	return "", "", false // unreachable: id owns one of paths
}

// PathOwner is the sandbox the view gives rel to, by PathOwner's rule.
func (s *Sandboxes) PathOwner(rel string) (string, bool) {
	id, ok, _ := PathOwner(rel, s.OwnerExact, s.OwnerBelow)
	return id, ok
}

// OwnerExact is the first sandbox, in List order, owning exactly path p.
func (s *Sandboxes) OwnerExact(p string) (string, bool, error) {
	id, ok := s.owners.least(p, "")
	return id, ok, nil
}

// OwnerBelow is the first sandbox, in List order, owning a path under
// directory dir (not one of the root's top-level directories).
func (s *Sandboxes) OwnerBelow(dir string) (string, bool, error) {
	id, ok := s.dirs.least(dir, "")
	return id, ok, nil
}

// SnapshotOwner returns the sandbox holding snapshot snap (the oldest,
// should a history made by hand give two the same one), or nil: the
// daemon's per-entity answer for restore and snapshot rm.
func (s *Sandboxes) SnapshotOwner(snap string) *Sandbox {
	if id, ok := s.snaps.least(snap, ""); ok {
		return s.byID[id]
	}
	return nil
}

// List returns every sandbox, oldest first.
func (s *Sandboxes) List() []*Sandbox {
	return s.Page("", len(s.byID))
}

// Page returns at most limit sandboxes (none if limit <= 0) whose IDs sort
// after after ("" from the first), oldest first: `ls` reads the view a page
// at a time, so what one answer holds is bounded by the page.
func (s *Sandboxes) Page(after string, limit int) []*Sandbox {
	if s.ids == nil {
		s.ids = make([]string, 0, len(s.byID))
		for id := range s.byID {
			s.ids = append(s.ids, id)
		}
		sort.Strings(s.ids)
	}
	i := sort.SearchStrings(s.ids, after)
	if i < len(s.ids) && s.ids[i] == after {
		i++
	}
	out := make([]*Sandbox, 0, max(0, min(limit, len(s.ids)-i)))
	for ; i < len(s.ids) && len(out) < limit; i++ {
		out = append(out, s.byID[s.ids[i]])
	}
	return out
}

// bumpRev records seq as the last event about id, if id is in the view.
func (s *Sandboxes) bumpRev(id string, seq uint64) {
	if sb := s.byID[id]; sb != nil {
		sb.Rev = seq
	}
}

// Len is the number of sandboxes in the view.
func (s *Sandboxes) Len() int { return len(s.byID) }

func (s *Sandboxes) Apply(seq uint64, e events.Event) {
	s.seq = seq
	if e.Sandbox == "" {
		return
	}
	defer s.reindex(e.Sandbox, s.indexedOf(e.Sandbox))
	s.apply(seq, e)
}

func (s *Sandboxes) apply(seq uint64, e events.Event) {
	sb := s.byID[e.Sandbox]
	defer s.bumpRev(e.Sandbox, seq)
	touch := func() {
		sb.UpdatedAt = e.Time
		sb.Seq = seq
	}
	switch p := e.Payload.(type) {
	case events.SagaStartedEvent:
		if sb == nil && p.Kind.CreatesSandbox() {
			sb = &Sandbox{ID: e.Sandbox, State: StateCreating, Saga: e.Saga, CreatedAt: e.Time}
			s.byID[e.Sandbox] = sb
			s.ids = nil
			touch()
		}
		return
	case events.SagaCompensatedEvent:
		// A create that was rolled back never produced a sandbox.
		if sb != nil && sb.State == StateCreating && sb.Saga == e.Saga {
			delete(s.byID, e.Sandbox)
			s.ids = nil
		}
		return
	case events.SandboxCreatedEvent:
		sb = s.commit(e, p.Handle, p.Image, p.Driver)
		sb.Bootstrap, sb.BootConfig, sb.Labels = p.Bootstrap, p.Boot, p.Labels
	case events.SandboxForkedEvent:
		sb = s.commit(e, p.Handle, p.Image, p.Driver)
		sb.Parent, sb.Bootstrap, sb.BootConfig, sb.Labels = p.Parent, p.Bootstrap, p.Boot, p.Labels
	case events.SandboxRestoredEvent:
		// The bootstrap is from the snapshot's manifest; a snapshot older
		// than the cache records none, and the sandbox then protects every
		// entry.
		sb = s.commit(e, p.Handle, p.Image, p.Driver)
		sb.Parent, sb.Snapshot, sb.Bootstrap, sb.BootConfig, sb.Labels = p.Source, p.Snapshot, p.Bootstrap, p.Boot, p.Labels
	case events.SandboxRemovedEvent:
		delete(s.byID, e.Sandbox)
		s.ids = nil
		return
	}
	if sb == nil {
		return // an event about a sandbox the view has not seen committed
	}
	// Which resources an event claims or releases is events.Effects's
	// rule; this fold only scopes it to the sandbox.
	claimed, released := events.Effects(e)
	sb.claim(claimed...)
	for _, r := range released {
		sb.release(r.Path)
	}
	switch p := e.Payload.(type) {
	case events.SandboxStartedEvent:
		sb.State = StateRunning
		sb.VMM = &Process{Pid: p.VMMPid, StartTicks: p.VMMStart}
		sb.LastRun = p.RunMarker
		sb.Conditions = nil
		sb.BootAt, sb.ReadyAt = e.Time, time.Time{}
	case events.SandboxReadyEvent:
		// Only the current run's guest can be Ready; a late report of an
		// older run, or of one that ended, says nothing about this one.
		if sb.currentRun(p.Run) {
			sb.ReadyAt = e.Time
			sb.dropCondition(ConditionReady)
		}
	case events.SandboxNotReadyEvent:
		if sb.currentRun(p.Run) && sb.ReadyAt.IsZero() {
			sb.setCondition(Condition{Type: ConditionReady, Status: "False", Reason: p.Reason, Message: p.Message})
		}
	case events.SandboxStoppedEvent:
		sb.State = StateStopped
		sb.VMM = nil
	case events.SandboxFailedEvent:
		sb.State = StateError
		sb.VMM = nil
		sb.Conditions = []Condition{{Type: "Ready", Status: "False", Reason: p.Reason, Message: p.Message}}
	case events.VMMExitedEvent:
		sb.vmmExited(events.ProcessExit(p), "")
	case events.SupervisorExitedEvent:
		sb.supervisorExited(events.ProcessExit(p), "")
	case events.SupervisorStartedEvent:
		sb.Supervisor = &Process{Pid: p.Pid, StartTicks: p.Start}
		sb.dropCondition(ConditionSupervisor)
	case events.SupervisorStoppedEvent:
		sb.Supervisor = nil
	case events.VolumeAttachedEvent:
		sb.Volumes = append(sb.Volumes, Attachment{Name: p.Name, GuestPath: p.GuestPath, ReadOnly: p.ReadOnly})
	case events.VolumeDetachedEvent:
		kept := sb.Volumes[:0]
		for _, v := range sb.Volumes {
			if v.Name != p.Name {
				kept = append(kept, v)
			}
		}
		sb.Volumes = kept
		if len(sb.Volumes) == 0 {
			sb.Volumes = nil
		}
	case events.SnapshotTakenEvent:
		sb.Snapshots = append(sb.Snapshots, p.SnapshotID)
	case events.ResourceReclaimedEvent:
		if p.Resource.Kind == events.KindSnapshot {
			sb.dropSnapshot(path.Base(p.Resource.Path))
		}
	case events.SandboxRenamedEvent:
		sb.Handle = p.Handle
	case events.FlushPendingEvent:
		sb.LastRun = p.Run
	case events.FlushAcknowledgedEvent:
		// Only an acknowledgement of the current run counts; a late one
		// for an older run must not vouch for the newer one.
		if p.Run == sb.LastRun {
			sb.FlushedRun = p.Run
		}
	case events.FlushRestoredEvent:
		if sb.LastRun == p.Run {
			sb.LastRun, sb.FlushedRun = p.Previous, p.PreviousFlushed
		}
	}
	touch()
}

// currentRun says whether run is the sandbox's running run.
func (sb *Sandbox) currentRun(run string) bool {
	return sb.State == StateRunning && sb.VMM != nil && !sb.VMM.Exited && run == sb.LastRun
}

// IsReady says whether the sandbox is Ready: running, and its current
// run's guest reported Ready (its agent answered, or, booted without
// one, its VMM runs).
func (sb Sandbox) IsReady() bool {
	return sb.currentRun(sb.LastRun) && !sb.ReadyAt.IsZero()
}

// Readiness is IsReady with, when not Ready, why: the Ready=False
// condition's reason (AgentNotReady, VMMExited, ...), ReasonBooting for a
// running guest not Ready yet, else ReasonNotRunning.
func (sb Sandbox) Readiness() (bool, string) {
	if sb.IsReady() {
		return true, ""
	}
	for _, c := range sb.Conditions {
		if c.Type == ConditionReady && c.Status == "False" {
			return false, c.Reason
		}
	}
	if sb.currentRun(sb.LastRun) {
		return false, ReasonBooting
	}
	return false, ReasonNotRunning
}

// dropSnapshot forgets snapshot id (its directory, snapshots/<sandbox>/<id>,
// was reclaimed); the reclaimed parent directory names no snapshot.
func (sb *Sandbox) dropSnapshot(id string) {
	for i, s := range sb.Snapshots {
		if s == id {
			sb.Snapshots = append(sb.Snapshots[:i:i], sb.Snapshots[i+1:]...)
			break
		}
	}
	if len(sb.Snapshots) == 0 {
		sb.Snapshots = nil
	}
}

func (sb *Sandbox) claim(rs ...events.Resource) {
	for _, r := range rs {
		if r.Path != "" && !sb.Owns(r.Path) {
			sb.Resources = append(sb.Resources, r)
		}
	}
}

func (sb *Sandbox) release(path string) {
	for i, r := range sb.Resources {
		if r.Path == path {
			sb.Resources = append(sb.Resources[:i:i], sb.Resources[i+1:]...)
			break
		}
	}
	if len(sb.Resources) == 0 {
		sb.Resources = nil
	}
}

// Owns reports whether the sandbox owns the resource at path.
func (sb *Sandbox) Owns(path string) bool {
	for _, r := range sb.Resources {
		if r.Path == path {
			return true
		}
	}
	return false
}

// commit turns a creating (or unseen) sandbox into a committed, stopped one.
func (s *Sandboxes) commit(e events.Event, handle, image, driver string) *Sandbox {
	sb := s.byID[e.Sandbox]
	if sb == nil {
		sb = &Sandbox{ID: e.Sandbox, CreatedAt: e.Time}
		s.byID[e.Sandbox] = sb
		s.ids = nil
	}
	sb.Handle, sb.Image, sb.Driver = handle, image, driver
	sb.State, sb.Saga = StateStopped, ""
	return sb
}

// EncodeSandbox is one sandbox record as a store keeps it (the encoding
// of one element of MarshalState's list).
func EncodeSandbox(sb *Sandbox) ([]byte, error) { return msgpack.Marshal(sb) }

// DecodeSandbox reads a record EncodeSandbox wrote, as UnmarshalState
// reads each element of a snapshot.
func DecodeSandbox(data []byte) (*Sandbox, error) {
	var sb Sandbox
	if err := events.StrictUnmarshal(data, &sb); err != nil {
		return nil, err
	}
	sb.CreatedAt, sb.UpdatedAt, sb.BootAt, sb.ReadyAt = sb.CreatedAt.UTC(), sb.UpdatedAt.UTC(), sb.BootAt.UTC(), sb.ReadyAt.UTC()
	return &sb, nil
}

func (s *Sandboxes) MarshalState() ([]byte, error) {
	return msgpack.Marshal(s.List())
}

func (s *Sandboxes) UnmarshalState(seq uint64, data []byte) error {
	var list []*Sandbox
	if err := events.StrictUnmarshal(data, &list); err != nil {
		return err
	}
	byID := make(map[string]*Sandbox, len(list))
	for _, sb := range list {
		sb.CreatedAt, sb.UpdatedAt, sb.BootAt, sb.ReadyAt = sb.CreatedAt.UTC(), sb.UpdatedAt.UTC(), sb.BootAt.UTC(), sb.ReadyAt.UTC()
		byID[sb.ID] = sb
	}
	s.seq, s.byID, s.ids = seq, byID, nil
	s.handles, s.owners, s.dirs, s.snaps = newMultimap(), newMultimap(), newMultimap(), newMultimap()
	for id := range byID {
		s.index(id, s.indexedOf(id))
	}
	return nil
}
