package main

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/nexus-sandbox/nexus/projections"
)

// commonPrefix is the longest prefix two IDs share.
func commonPrefix(a, b string) string {
	n := 0
	for n < len(a) && n < len(b) && a[n] == b[n] {
		n++
	}
	return a[:n]
}

// Every command that takes a sandbox takes an ID, a handle or a unique ID
// prefix (projections.Match), and an ambiguous prefix is one line naming
// the candidates.
func TestIDPrefixAndHandleEverywhere(t *testing.T) {
	root := shortRoot(t)
	image := makeImage(t)
	a := createJSON(t, root, "--image", image, "--handle", "web")
	b := createJSON(t, root, "--image", image)
	shared := commonPrefix(a.ID, b.ID)
	if len(shared) < 4 {
		t.Fatalf("IDs %s and %s made a moment apart share only %q", a.ID, b.ID, shared)
	}
	uniqueB := strings.ToLower(b.ID[:len(shared)+1])

	r := mustOK(t, nexus(t, root, "inspect", "--json", "web", uniqueB), "inspect by handle and prefix")
	var got []projections.Sandbox
	if err := json.Unmarshal([]byte(r.stdout), &got); err != nil || len(got) != 2 || got[0].ID != a.ID || got[1].ID != b.ID {
		t.Fatalf("inspect web %s = %v %s", uniqueB, err, r.stdout)
	}
	for _, args := range [][]string{{"inspect", shared[:4]}, {"stop", shared}, {"rm", "-f", shared}, {"fork", shared}, {"snapshot", shared}} {
		r := proc(t, root, args...)
		wantFailure(t, r, 1, "matches 2 sandboxes")
		if !strings.Contains(r.stderr, a.ID) || !strings.Contains(r.stderr, b.ID) {
			t.Fatalf("%v: ambiguity does not name both candidates: %q", args, r.stderr)
		}
	}
	wantFailure(t, proc(t, root, "stop", "01ZZZZ"), 1, `no sandbox "01ZZZZ"`)
	wantFailure(t, proc(t, root, "inspect", shared[:3]), 1, "no sandbox") // shorter than projections.MinPrefix

	if r := mustOK(t, proc(t, root, "stop", uniqueB), "stop by prefix"); !strings.HasPrefix(r.stdout, b.ID+"\tstopped") {
		t.Fatalf("stop by prefix printed %q", r.stdout)
	}
	snap := strings.TrimSpace(mustOK(t, proc(t, root, "snapshot", "web"), "snapshot by handle").stdout)
	if sb := inspectJSON(t, root, a.ID); len(sb.Snapshots) != 1 || sb.Snapshots[0] != snap {
		t.Fatalf("snapshot by handle: %+v", sb.Snapshots)
	}
	if r := mustOK(t, proc(t, root, "events", "--sandbox", "web", "--type", "snapshot.taken"), "events --sandbox handle"); strings.Count(r.stdout, "\n") != 1 || !strings.Contains(r.stdout, a.ID) {
		t.Fatalf("events --sandbox web: %q", r.stdout)
	}
	mustOK(t, proc(t, root, "rm", "-f", "--with-snapshots", uniqueB), "rm by prefix")
	// A removed sandbox is still found by a prefix in the journal's history.
	if r := mustOK(t, nexus(t, root, "replay", "timeline", uniqueB), "timeline by prefix"); !strings.Contains(r.stdout, "sandbox.removed") {
		t.Fatalf("timeline of a removed sandbox by prefix: %q", r.stdout)
	}
	mustOK(t, proc(t, root, "rm", "-f", "--with-snapshots", "web"), "rm by handle")
}

// Several IDs per stop/start/rm/inspect: each is reported, the others are
// still done, and the command fails if any failed. stop and start are
// idempotent; rm refuses a running sandbox without -f and says what it
// removed.
func TestSeveralIDsIdempotenceAndRm(t *testing.T) {
	root := shortRoot(t)
	image := makeImage(t)
	a := createJSON(t, root, "--image", image, "--handle", "a")
	b := createJSON(t, root, "--image", image)
	const missing = "01JDQ4Z6X1M9A3Y0C5TB2R8NKW"

	r := mustOK(t, proc(t, root, "start", a.ID), "start of a running sandbox")
	if r.stdout != a.ID+" already running\n" {
		t.Fatalf("start of a running sandbox printed %q", r.stdout)
	}
	r = proc(t, root, "stop", a.ID, missing, b.ID)
	if r.code != 1 || !strings.Contains(r.stderr, "nexus: "+missing+": ") || !strings.Contains(r.stderr, "1 of 3 failed") {
		t.Fatalf("stop with one unknown ID: exit %d, stderr %q", r.code, r.stderr)
	}
	for _, sb := range []projections.Sandbox{a, b} {
		if cur := listed(t, root, sb.ID); cur == nil || cur.State != projections.StateStopped {
			t.Fatalf("stop A missing B did not stop %s: %+v", sb.ID, cur)
		}
	}
	r = mustOK(t, proc(t, root, "stop", "a", b.ID), "stop of stopped sandboxes")
	if r.stdout != a.ID+" already stopped\n"+b.ID+" already stopped\n" {
		t.Fatalf("stop of stopped sandboxes printed %q", r.stdout)
	}
	r = mustOK(t, proc(t, root, "start", "--json", a.ID, b.ID), "start two")
	var started []projections.Sandbox
	if err := json.Unmarshal([]byte(r.stdout), &started); err != nil || len(started) != 2 || started[0].State != projections.StateRunning || started[1].State != projections.StateRunning {
		t.Fatalf("start --json A B: %v %s", err, r.stdout)
	}

	// inspect of several: a JSON array of those found; one missing fails.
	r = nexus(t, root, "inspect", "--json", a.ID, missing, b.ID)
	var found []projections.Sandbox
	if err := json.Unmarshal([]byte(r.stdout), &found); err != nil || r.code != 1 || len(found) != 2 || !strings.Contains(r.stderr, missing) {
		t.Fatalf("inspect A missing B: exit %d, %v, stdout %q stderr %q", r.code, err, r.stdout, r.stderr)
	}

	// Plain rm of a running sandbox is refused, pointing at rm -f.
	wantFailure(t, proc(t, root, "rm", a.ID), 1, "nexus rm -f")
	if listed(t, root, a.ID) == nil {
		t.Fatal("a refused rm removed the sandbox")
	}
	mustOK(t, proc(t, root, "stop", b.ID), "stop b")
	r = proc(t, root, "rm", "-f", a.ID, missing, b.ID)
	if r.code != 1 || !strings.Contains(r.stderr, missing) {
		t.Fatalf("rm -f A missing B: exit %d, stderr %q", r.code, r.stderr)
	}
	for _, sb := range []projections.Sandbox{a, b} {
		if !strings.Contains(r.stdout, "removed "+sb.ID+" (") || listed(t, root, sb.ID) != nil {
			t.Fatalf("rm -f A missing B: %s not removed or not reported: %q", sb.ID, r.stdout)
		}
	}
	if !strings.Contains(r.stdout, "removed "+a.ID+" (a): ") {
		t.Fatalf("rm does not name the handle: %q", r.stdout)
	}
	if untracked(t, root) != nil {
		t.Fatalf("rm left files behind: %v", untracked(t, root))
	}
}
