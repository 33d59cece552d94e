package replay

import (
	"slices"
	"testing"
	"time"

	"github.com/oklog/ulid/v2"

	"github.com/nexus-sandbox/nexus/events"
)

func TestDiff(t *testing.T) {
	recs, a, b, t0 := history(t)
	// a was created owning disks/<a>.raw and later removed; b's create saga
	// is still open. A later sandbox c owns two disks, and a reap deletes
	// one of them while c still owns it.
	c := ulid.Make().String()
	raw := events.Resource{Kind: events.KindRawDisk, Path: "disks/" + c + ".raw"}
	ws := events.Resource{Kind: events.KindWorkspaceDisk, Path: "disks/" + c + "-workspace.ext4"}
	more := []events.Event{
		events.New(ulid.Make(), t0.Add(5*time.Second), c, events.SandboxCreatedEvent{Image: "img", Driver: "process", Resources: []events.Resource{raw, ws}}),
		events.New(ulid.Make(), t0.Add(6*time.Second), "", events.ReapAppliedEvent{Plan: "p", Part: 1, Parts: 1,
			Deleted: []events.ReapEntry{{Kind: events.KindWorkspaceDisk, Path: ws.Path, Verdict: "orphan"}, {Kind: events.KindRawDisk, Path: "disks/" + a + ".raw", Verdict: "orphan"}}}),
	}
	for i, e := range more {
		recs = append(recs, rec(t, uint64(len(recs)+i+1), e))
	}
	onDisk := []string{"disks/" + c + ".raw", "disks/stray.raw", "supervisors/" + c}
	present := func(rel string) bool { return slices.Contains(onDisk, rel) }
	d, err := Diff(recs, onDisk, present)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(d.Untracked, []string{"disks/stray.raw", "supervisors/" + c}) {
		t.Errorf("untracked = %v", d.Untracked)
	}
	if len(d.Missing) != 1 || d.Missing[0].Path != ws.Path || d.Missing[0].Sandbox != c {
		t.Errorf("missing = %+v", d.Missing)
	}
	if len(d.OpenSagas) != 1 || d.OpenSagas[0].Sandbox != b {
		t.Errorf("open sagas = %+v", d.OpenSagas)
	}
	// Deleting a's disk after a was removed was right; deleting c's
	// workspace while c owned it was not.
	if len(d.ReapedOwned) != 1 || d.ReapedOwned[0].Path != ws.Path || d.ReapedOwned[0].Owner != c {
		t.Errorf("reaped while owned = %+v", d.ReapedOwned)
	}
	if d.Empty() {
		t.Error("a divergent root reported empty")
	}

	clean, err := Diff(recs[:3], nil, func(string) bool { return true })
	if err != nil || !clean.Empty() {
		t.Fatalf("a root matching its journal: %+v %v", clean, err)
	}
}
