package main

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/nexus-sandbox/nexus/internal/testutil"
	"github.com/nexus-sandbox/nexus/projections"
)

// Tables print short IDs (projections.ShortID), which differ between fork
// siblings whose ULIDs share their head; every command takes a short ID or
// a unique prefix of one; --no-trunc and --json print whole IDs; PARENT
// shows where a fork child came from.
func TestShortIDs(t *testing.T) {
	testutil.StartsSandboxes(t)
	t.Parallel()
	root := shortRoot(t)
	image := makeImage(t)
	parent := createJSON(t, root, "--image", image, "--handle", "base")
	var children []jsonSandbox
	out := mustOK(t, proc(t, root, "fork", "base", "--count", "3", "--json"), "fork").stdout
	if err := json.Unmarshal([]byte(out), &children); err != nil || len(children) != 3 {
		t.Fatalf("fork --json: %v %s", err, out)
	}
	// Siblings made in one millisecond share their timestamp and more:
	// what all three share is a prefix that names each of them.
	shared := commonPrefix(commonPrefix(children[0].ID, children[1].ID), children[2].ID)
	if len(shared) < projections.MinPrefix {
		t.Fatalf("fork siblings %s, %s and %s share only %q", children[0].ID, children[1].ID, children[2].ID, shared)
	}
	shorts := map[string]bool{}
	for _, c := range children {
		if c.ShortID != projections.ShortID(c.ID) || len(c.ShortID) != projections.ShortLen {
			t.Fatalf("fork --json short_id %q of %s, want %s", c.ShortID, c.ID, projections.ShortID(c.ID))
		}
		shorts[c.ShortID] = true
	}
	if len(shorts) != len(children) {
		t.Fatalf("fork siblings' short IDs repeat: %v", shorts)
	}

	// ls: a short ID a row, the parent by its handle, no whole ID.
	table := mustOK(t, proc(t, root, "ls"), "ls").stdout
	lines := strings.Split(strings.TrimSpace(table), "\n")
	if len(lines) != 5 || !strings.Contains(lines[0], "PARENT") {
		t.Fatalf("ls:\n%s", table)
	}
	for _, sb := range append([]jsonSandbox{parent}, children...) {
		if strings.Contains(table, sb.ID) {
			t.Fatalf("ls prints the whole ID %s:\n%s", sb.ID, table)
		}
		row := ""
		for _, l := range lines[1:] {
			if strings.HasPrefix(l, projections.ShortID(sb.ID)+" ") {
				row = l
			}
		}
		if row == "" {
			t.Fatalf("ls has no row for %s (%s):\n%s", sb.ID, projections.ShortID(sb.ID), table)
		}
		if sb.ID != parent.ID && !strings.Contains(row, " base ") {
			t.Fatalf("fork child's row names no parent base: %q", row)
		}
	}
	whole := mustOK(t, proc(t, root, "ls", "--no-trunc"), "ls --no-trunc").stdout
	for _, c := range children {
		if !strings.Contains(whole, c.ID) {
			t.Fatalf("ls --no-trunc lacks %s:\n%s", c.ID, whole)
		}
	}
	for _, sb := range sandboxes(t, root) {
		if len(sb.ID) != 26 || sb.ShortID != projections.ShortID(sb.ID) {
			t.Fatalf("ls --json: id %q short_id %q", sb.ID, sb.ShortID)
		}
	}

	// Every command takes a short ID, or a unique prefix of one, any case.
	a, b := children[0], children[1]
	for _, ref := range []string{a.ShortID, a.ShortID[:projections.MinPrefix+2], strings.ToUpper(a.ShortID[:8])} {
		if got := inspectJSON(t, root, ref); got.ID != a.ID {
			t.Fatalf("inspect %s = %s, want %s", ref, got.ID, a.ID)
		}
	}
	if r := mustOK(t, proc(t, root, "stop", b.ShortID[:6]), "stop by short prefix"); !strings.HasPrefix(r.stdout, b.ID+"\tstopped") {
		t.Fatalf("stop by short prefix printed %q", r.stdout)
	}
	// The siblings' shared ID prefix names them both: refused, naming both.
	r := proc(t, root, "rm", "-f", shared)
	wantFailure(t, r, 1, "matches")
	for _, c := range children {
		if !strings.Contains(r.stderr, c.ID) {
			t.Fatalf("ambiguity does not name %s: %q", c.ID, r.stderr)
		}
	}
	// A handle that is a prefix of a live sandbox's short ID would make
	// one name mean two sandboxes.
	wantFailure(t, proc(t, root, "create", "--image", image, "--handle", a.ShortID[:6]), 1, "short ID")

	// Snapshots: short in the table, taken by a short prefix.
	snap := strings.TrimSpace(mustOK(t, proc(t, root, "snapshot", a.ShortID), "snapshot by short ID").stdout)
	snaps := mustOK(t, proc(t, root, "snapshot", "ls"), "snapshot ls").stdout
	if strings.Contains(snaps, snap) || !strings.Contains(snaps, projections.ShortID(snap)) || !strings.Contains(snaps, a.ShortID) {
		t.Fatalf("snapshot ls, want short %s of %s and sandbox %s:\n%s", projections.ShortID(snap), snap, a.ShortID, snaps)
	}
	mustOK(t, proc(t, root, "snapshot", "rm", projections.ShortID(snap)[:6]), "snapshot rm by short prefix")

	// events: a sandbox without a handle by its short ID.
	ev := mustOK(t, proc(t, root, "events", "--sandbox", a.ShortID, "--type", "sandbox.forked"), "events --sandbox short").stdout
	if !strings.Contains(ev, " "+a.ShortID+" ") || strings.Contains(ev, " "+a.ID+" ") {
		t.Fatalf("events of %s, want its short ID:\n%s", a.ID, ev)
	}

	mustOK(t, proc(t, root, "rm", "-f", a.ShortID[:5]), "rm by short prefix")
	for _, sb := range sandboxes(t, root) {
		if sb.ID == a.ID {
			t.Fatalf("rm %s left %s", a.ShortID[:5], a.ID)
		}
	}
}
