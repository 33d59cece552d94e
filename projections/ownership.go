package projections

import (
	"fmt"
	"sort"

	"github.com/oklog/ulid/v2"
	"github.com/vmihailenco/msgpack/v5"

	"github.com/nexus-sandbox/nexus/events"
)

// Owner is who a resource belongs to, as the journal says.
type Owner struct {
	Sandbox ulid.ULID
	Kind    events.ResourceKind
}

// owned is the compact in-memory form: a kind index instead of a string,
// so 100,000 sandboxes' worth of resources stays small.
type owned struct {
	sandbox ulid.ULID
	kind    uint8
}

// Ownership maps every resource path (relative to the state root) that the
// journal attributes to a live or in-flight sandbox to that sandbox. The
// reaper marks from it: what is here is never an orphan.
type Ownership struct {
	seq       uint64
	byPath    map[string]owned
	bySandbox map[ulid.ULID][]string
	kinds     []events.ResourceKind
	kindIndex map[events.ResourceKind]uint8
}

// NewOwnership returns an empty ownership view.
func NewOwnership() *Ownership {
	return &Ownership{
		byPath:    map[string]owned{},
		bySandbox: map[ulid.ULID][]string{},
		kindIndex: map[events.ResourceKind]uint8{},
	}
}

func (*Ownership) Name() string  { return "ownership" }
func (o *Ownership) Seq() uint64 { return o.seq }

// Owner returns the owner of path, if the journal names one.
func (o *Ownership) Owner(path string) (Owner, bool) {
	r, ok := o.byPath[path]
	if !ok {
		return Owner{}, false
	}
	return Owner{Sandbox: r.sandbox, Kind: o.kinds[r.kind]}, true
}

// Resources lists the paths owned by sandbox, in the order they were claimed.
func (o *Ownership) Resources(sandbox ulid.ULID) []string {
	return append([]string(nil), o.bySandbox[sandbox]...)
}

// Len is the number of owned resources.
func (o *Ownership) Len() int { return len(o.byPath) }

func (o *Ownership) Apply(seq uint64, e events.Event) {
	o.seq = seq
	id, err := ulid.ParseStrict(e.Sandbox)
	if err != nil {
		return // not a sandbox's event; owns nothing
	}
	// A removed sandbox gives back all it still owns, which its event
	// does not list (events.Effects).
	if _, removed := e.Payload.(events.SandboxRemovedEvent); removed {
		for _, path := range o.bySandbox[id] {
			delete(o.byPath, path)
		}
		delete(o.bySandbox, id)
		return
	}
	claimed, released := events.Effects(e)
	for _, r := range claimed {
		o.claim(id, r)
	}
	for _, r := range released {
		o.release(r.Path)
	}
}

func (o *Ownership) claim(id ulid.ULID, r events.Resource) {
	if r.Path == "" {
		return
	}
	if prev, ok := o.byPath[r.Path]; ok {
		if prev.sandbox == id {
			// Re-assigning would replace the map's key with this event's copy
			// of the string; keep the first and save the memory.
			if k := o.kindOf(r.Kind); k != prev.kind {
				o.byPath[r.Path] = owned{sandbox: id, kind: k}
			}
			return
		}
		// A path claimed again by another sandbox moves to it; the first
		// owner's teardown must no longer release it.
		o.dropFromSandbox(prev.sandbox, r.Path)
	}
	o.byPath[r.Path] = owned{sandbox: id, kind: o.kindOf(r.Kind)}
	o.bySandbox[id] = append(o.bySandbox[id], r.Path)
}

func (o *Ownership) release(path string) {
	prev, ok := o.byPath[path]
	if !ok {
		return
	}
	delete(o.byPath, path)
	o.dropFromSandbox(prev.sandbox, path)
}

func (o *Ownership) dropFromSandbox(id ulid.ULID, path string) {
	paths := o.bySandbox[id]
	for i, p := range paths {
		if p == path {
			paths = append(paths[:i], paths[i+1:]...)
			break
		}
	}
	if len(paths) == 0 {
		delete(o.bySandbox, id)
	} else {
		o.bySandbox[id] = paths
	}
}

func (o *Ownership) kindOf(k events.ResourceKind) uint8 {
	if i, ok := o.kindIndex[k]; ok {
		return i
	}
	i := uint8(len(o.kinds))
	o.kinds = append(o.kinds, k)
	o.kindIndex[k] = i
	return i
}

// ownershipState is the snapshot layout: per sandbox, its paths in claim
// order, so a restored view releases them in the same order.
type ownershipState struct {
	Sandboxes []ownedSandbox `msgpack:"s"`
}

type ownedSandbox struct {
	ID        []byte   `msgpack:"id"`
	Paths     []string `msgpack:"p"`
	PathKinds []string `msgpack:"k"`
}

func (o *Ownership) MarshalState() ([]byte, error) {
	ids := make([]ulid.ULID, 0, len(o.bySandbox))
	for id := range o.bySandbox {
		ids = append(ids, id)
	}
	sort.Slice(ids, func(i, j int) bool { return ids[i].Compare(ids[j]) < 0 })
	st := ownershipState{Sandboxes: make([]ownedSandbox, 0, len(ids))}
	for _, id := range ids {
		paths := o.bySandbox[id]
		kinds := make([]string, len(paths))
		for i, p := range paths {
			kinds[i] = string(o.kinds[o.byPath[p].kind])
		}
		st.Sandboxes = append(st.Sandboxes, ownedSandbox{ID: append([]byte(nil), id[:]...), Paths: paths, PathKinds: kinds})
	}
	return msgpack.Marshal(&st)
}

func (o *Ownership) UnmarshalState(seq uint64, data []byte) error {
	var st ownershipState
	if err := events.StrictUnmarshal(data, &st); err != nil {
		return err
	}
	fresh := NewOwnership()
	for _, s := range st.Sandboxes {
		if len(s.ID) != len(ulid.ULID{}) || len(s.Paths) != len(s.PathKinds) {
			return fmt.Errorf("ownership snapshot: malformed sandbox entry")
		}
		var id ulid.ULID
		copy(id[:], s.ID)
		for i, p := range s.Paths {
			fresh.claim(id, events.Resource{Kind: events.ResourceKind(s.PathKinds[i]), Path: p})
		}
	}
	fresh.seq = seq
	*o = *fresh
	return nil
}
