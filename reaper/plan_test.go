package reaper

import (
	"slices"
	"testing"

	"github.com/nexus-sandbox/nexus/events"
	"github.com/nexus-sandbox/nexus/layout"
)

func TestKindsAreLayoutsAndTheSupervisorProcess(t *testing.T) {
	if len(Kinds) != len(layout.Kinds)+1 || !slices.Contains(Kinds, events.KindSupervisorProcess) {
		t.Fatalf("Kinds = %v", Kinds)
	}
	for _, k := range layout.Kinds {
		if !slices.Contains(Kinds, k) {
			t.Errorf("a reap does not judge %s, a kind of layout's", k)
		}
	}
}

// A staged intent's probe speaks for its final name too, unless that
// name's own probe found it more alive.
func TestAddLease(t *testing.T) {
	final := layout.CreateIntentRel(idB)
	staged := entry("disks", "."+idB+".create-intent.json.stage-1")
	for _, order := range [][]Entry{{staged}, {entry("disks", idB+".create-intent.json"), staged}} {
		leases := map[string]Lease{}
		for _, e := range order {
			if !HasLease(e) {
				t.Fatalf("%s has no lease", e.Rel)
			}
			l := Lease{State: LeaseFree}
			if e.Staged {
				l.State = LeaseHeld
			}
			AddLease(leases, e, l)
		}
		if leases[final].State != LeaseHeld || leases[staged.Rel].State != LeaseHeld {
			t.Errorf("leases %+v: want the staged marker's held lease for %s", leases, final)
		}
	}
	leases := map[string]Lease{}
	AddLease(leases, entry("disks", idB+".create-intent.json"), Lease{State: LeaseHeld})
	AddLease(leases, staged, Lease{State: LeaseFree})
	if leases[final].State != LeaseHeld {
		t.Errorf("a free staged marker overrode its final name's held lease: %+v", leases)
	}
	shadow := entry("disks", ".team_web.shadow-intent.json.stage-2")
	leases = map[string]Lease{}
	AddLease(leases, shadow, Lease{State: LeaseUnreadable})
	if leases[layout.ShadowIntentRel("team_web")].State != LeaseUnreadable {
		t.Errorf("a staged shadow intent does not speak for its handle's: %+v", leases)
	}
	if HasLease(entry("disks", idB+".raw")) {
		t.Error("a raw disk has a lease")
	}
}

// Bound to a plan, only an orphan the plan listed is deleted; an orphan
// it did not list is kept, and a listed entry judged otherwise now says
// it changed.
func TestAgainstPlan(t *testing.T) {
	e := entry("disks", idB+".raw")
	for _, c := range []struct {
		v       Verdict
		listed  bool
		del     bool
		mention string
	}{
		{Orphan, true, true, "dead"},
		{Orphan, false, false, "not in plan P (an orphan now: dead)"},
		{Live, true, false, "changed since plan P: now live: dead"},
		{Owned, false, false, "dead"},
	} {
		d, del := AgainstPlan(Decision{Entry: e, Owner: idB, Verdict: c.v, Reason: "dead"}, "P", c.listed)
		if del != c.del || d.Verdict != c.v || d.Reason != c.mention {
			t.Errorf("%s listed=%v: delete %v, %s %q; want delete %v, %q", c.v, c.listed, del, d.Verdict, d.Reason, c.del, c.mention)
		}
	}
	if PlanKey(events.KindRawDisk, e.Rel) != "raw-disk "+e.Rel {
		t.Errorf("PlanKey = %q", PlanKey(events.KindRawDisk, e.Rel))
	}
}

// A handle's shadow disk is deleted only once its shadow intent is checked
// absent, unless the reap deletes that intent itself.
func TestIntentBeforeDelete(t *testing.T) {
	none := func(string) bool { return false }
	disk := entry("disks", "team_web.shadow.cfg.ext4")
	rel, ok := IntentBeforeDelete(disk, none)
	if !ok || rel != layout.ShadowIntentRel("team_web") {
		t.Fatalf("shadow disk: %q %v", rel, ok)
	}
	if _, ok := IntentBeforeDelete(disk, func(r string) bool { return r == rel }); ok {
		t.Error("the reap deletes the intent itself, yet it is checked")
	}
	for _, e := range []Entry{entry("disks", "old.shadow.ext4"), entry("disks", idC+"-team_web.shadow.cfg.ext4"), entry("disks", idB+".raw")} {
		if _, ok := IntentBeforeDelete(e, none); ok {
			t.Errorf("%s: checked for a shadow intent", e.Rel)
		}
	}
	d := IntentAppeared(Decision{Entry: disk, Owner: "team_web", Verdict: Orphan, Reason: "no sandbox"})
	want(t, d, Live, "team_web", "shadow intent for team_web appeared before the delete")
}

// --sandbox HANDLE matches the sandbox holding it now and the handle's own
// shadow disks; a ULID is left as it is.
func TestFilterResolve(t *testing.T) {
	owner := func(h string) (string, bool) { return idA, h == layout.SafeHandle("team/web") }
	if f := (Filter{Sandbox: "team/web"}).Resolve(owner); f.Sandbox != idA || f.Handle != layout.SafeHandle("team/web") {
		t.Errorf("held handle: %+v", f)
	}
	if f := (Filter{Sandbox: "gone"}).Resolve(owner); f.Sandbox != "" || f.Handle != "gone" {
		t.Errorf("free handle: %+v", f)
	}
	if f := (Filter{Sandbox: idB}).Resolve(owner); f.Sandbox != idB || f.Handle != "" {
		t.Errorf("ULID: %+v", f)
	}
}
