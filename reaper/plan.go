package reaper

import (
	"github.com/nexus-sandbox/nexus/events"
	"github.com/nexus-sandbox/nexus/layout"
)

// Kinds are the kinds of resource a reap judges: every kind a name in
// layout.Dirs reads as, and a recorded supervisor's process.
var Kinds = append(append([]events.ResourceKind{}, layout.Kinds...), events.KindSupervisorProcess)

// HasLease says whether e is an intent, whose flock says whether its
// creator is in flight: its lease is probed before the journal is read.
func HasLease(e Entry) bool {
	return e.Kind == events.KindCreateIntent || e.Kind == events.KindShadowIntent
}

// AddLease records l, a probe of the intent e, in leases. A staged marker
// speaks for its final name too (it is flocked before it is renamed into
// place); of two probes for one name the more alive one stands.
func AddLease(leases map[string]Lease, e Entry, l Lease) {
	leases[e.Rel] = l
	final := layout.CreateIntentRel(e.ID)
	if e.Kind == events.KindShadowIntent {
		final = layout.ShadowIntentRel(e.Handle)
	}
	if final == e.Rel {
		return
	}
	if prev, ok := leases[final]; !ok || l.State > prev.State {
		leases[final] = l
	}
}

// PlanKey names an entry in a recorded plan: its kind and its path.
func PlanKey(kind events.ResourceKind, rel string) string { return string(kind) + " " + rel }

// AgainstPlan is d, judged afresh, for a reap bound to the dry run plan:
// only an orphan the plan listed (listed) may be deleted. An orphan the
// plan did not list is kept, and a listed entry that is no longer an
// orphan says it changed.
func AgainstPlan(d Decision, plan string, listed bool) (Decision, bool) {
	switch {
	case d.Verdict == Orphan && listed:
		return d, true
	case d.Verdict == Orphan:
		d.Reason = "not in plan " + plan + " (an orphan now: " + d.Reason + ")"
	case listed:
		d.Reason = "changed since plan " + plan + ": now " + string(d.Verdict) + ": " + d.Reason
	}
	return d, false
}

// IntentBeforeDelete is the intent whose presence, checked just before
// the orphan e is deleted, makes e live again: a create that reuses a
// shadow disk's handle publishes its shadow intent before it writes the
// disk. reaping says the reap is deleting that intent itself (while it
// exists no new one can be published). ok is false when nothing needs
// checking.
func IntentBeforeDelete(e Entry, reaping func(rel string) bool) (rel string, ok bool) {
	if e.Kind != events.KindShadowDisk || e.Handle == "" || e.Legacy {
		return "", false
	}
	rel = layout.ShadowIntentRel(e.Handle)
	return rel, !reaping(rel)
}

// IntentAppeared is d kept because the intent IntentBeforeDelete named
// exists now: the handle is taken again.
func IntentAppeared(d Decision) Decision {
	d.Verdict, d.Reason = Live, "shadow intent for "+d.Entry.Handle+" appeared before the delete"
	return d
}

// Resolve makes a --sandbox given as a handle match: the sandbox that
// holds the handle now, if any, and the handle's own shadow disks and
// intents either way. owner is the journal's handle index.
func (f Filter) Resolve(owner func(safeHandle string) (string, bool)) Filter {
	if f.Sandbox == "" || layout.IsULID(f.Sandbox) {
		return f
	}
	f.Sandbox, f.Handle = "", layout.SafeHandle(f.Sandbox)
	if id, ok := owner(f.Handle); ok {
		f.Sandbox = id
	}
	return f
}
