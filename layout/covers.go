package layout

import "github.com/nexus-sandbox/nexus/events"

// CoveredBy reports whether rel, a path relative to the state root that an
// intent of sandbox id (created with handle, "" for none) says it covers,
// is a path that create, fork or restore of that sandbox can make. Recovery
// deletes what an uncommitted intent covers, so an intent is trusted only
// for its own sandbox's names: a damaged or planted marker naming a volume,
// the journal, another sandbox's disk or anything outside the root covers
// nothing.
func CoveredBy(rel, id, handle string) bool {
	n, ok := Parse(rel)
	if !ok || !IsULID(id) {
		return false
	}
	switch n.Kind {
	case events.KindSupervisorState, events.KindRecord, events.KindSnapshot, events.KindBuilderSupervisor,
		events.KindRawDisk, events.KindWorkspaceDisk:
		return n.ID == id
	case events.KindShadowDisk:
		if n.ID != "" {
			// A fork or restore child's copy of a parent's shadow disk.
			return n.ID == id
		}
		// The handle-keyed shadow disk of a create with a handle.
		return handle != "" && n.Handle == SafeHandle(handle)
	}
	return false
}
