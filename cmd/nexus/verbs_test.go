package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"

	"github.com/nexus-sandbox/nexus/events"
	"github.com/nexus-sandbox/nexus/internal/testutil"
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
	testutil.StartsSandboxes(t)
	t.Parallel()
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
	var got []jsonSandbox
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
	// And a removed sandbox's events by its handle, as its timeline.
	if r := mustOK(t, proc(t, root, "events", "--sandbox", "web", "--type", "sandbox.removed"), "events --sandbox of a removed handle"); strings.Count(r.stdout, "\n") != 1 || !strings.Contains(r.stdout, " web ") {
		t.Fatalf("events --sandbox web after its removal: %q", r.stdout)
	}
	// The default view: what happened to web, by its handle, without the
	// bookkeeping --all adds.
	story := strings.Split(strings.TrimSpace(mustOK(t, proc(t, root, "events", "--sandbox", "web"), "events --sandbox web").stdout), "\n")
	all := strings.Count(mustOK(t, proc(t, root, "events", "--all", "-q", "--sandbox", "web"), "events --all").stdout, "\n")
	var types []string
	for _, line := range story {
		f := strings.Fields(line)
		if len(f) < 4 || f[3] != "web" || !slices.Contains(events.Notable(), f[2]) {
			t.Fatalf("events --sandbox web: line %q is not a notable event of web", line)
		}
		types = append(types, f[2])
	}
	if want := "sandbox.created,sandbox.started,sandbox.ready,snapshot.taken,sandbox.stopped,sandbox.removed"; strings.Join(types, ",") != want || all <= 2*len(story) {
		t.Fatalf("events --sandbox web: %v (of %d with --all), want %s", types, all, want)
	}
}

// Several IDs per stop/start/rm/inspect: each is reported, the others are
// still done, and the command fails if any failed. stop and start are
// idempotent; rm refuses a running sandbox without -f and says what it
// removed.
func TestSeveralIDsIdempotenceAndRm(t *testing.T) {
	testutil.StartsSandboxes(t)
	t.Parallel()
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
	for _, sb := range []jsonSandbox{a, b} {
		if cur := listed(t, root, sb.ID); cur == nil || cur.State != projections.StateStopped {
			t.Fatalf("stop A missing B did not stop %s: %+v", sb.ID, cur)
		}
	}
	r = mustOK(t, proc(t, root, "stop", "a", b.ID), "stop of stopped sandboxes")
	if r.stdout != a.ID+" already stopped\n"+b.ID+" already stopped\n" {
		t.Fatalf("stop of stopped sandboxes printed %q", r.stdout)
	}
	r = mustOK(t, proc(t, root, "start", "--json", a.ID, b.ID), "start two")
	var started []jsonSandbox
	if err := json.Unmarshal([]byte(r.stdout), &started); err != nil || len(started) != 2 || started[0].State != projections.StateRunning || started[1].State != projections.StateRunning {
		t.Fatalf("start --json A B: %v %s", err, r.stdout)
	}

	// inspect of several: a JSON array of those found; one missing fails.
	r = nexus(t, root, "inspect", "--json", a.ID, missing, b.ID)
	var found []jsonSandbox
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
	for _, sb := range []jsonSandbox{a, b} {
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

// Snapshots are listed and removed on their own, each removal journaled
// through a saga; rm refuses to drop them without --with-snapshots.
func TestSnapshotLsRmAndRmWithSnapshots(t *testing.T) {
	testutil.StartsSandboxes(t)
	t.Parallel()
	root := shortRoot(t)
	sb := createJSON(t, root, "--image", makeImage(t), "--handle", "snappy")
	other := createJSON(t, root, "--image", makeImage(t))
	s1 := strings.TrimSpace(mustOK(t, proc(t, root, "snapshot", sb.ID), "snapshot").stdout)
	mustOK(t, proc(t, root, "stop", sb.ID), "stop")
	s2 := strings.TrimSpace(mustOK(t, proc(t, root, "snapshot", "snappy"), "snapshot").stdout)

	ls := func(args ...string) []map[string]any {
		t.Helper()
		r := mustOK(t, proc(t, root, append([]string{"snapshot", "ls", "--json"}, args...)...), "snapshot ls")
		var out []map[string]any
		if err := json.Unmarshal([]byte(r.stdout), &out); err != nil {
			t.Fatalf("snapshot ls --json: %v\n%s", err, r.stdout)
		}
		return out
	}
	got := ls("snappy")
	if len(got) != 2 || got[0]["id"] != s1 || got[1]["id"] != s2 || got[0]["sandbox"] != sb.ID || got[0]["handle"] != "snappy" {
		t.Fatalf("snapshot ls snappy: %v", got)
	}
	if n, _ := got[0]["allocated_bytes"].(float64); n <= 0 {
		t.Fatalf("snapshot ls shows no bytes for a snapshot with disks: %v", got[0])
	}
	if got := ls(other.ID); got == nil || len(got) != 0 {
		t.Fatalf("snapshot ls of a sandbox without any: %v, want []", got)
	}
	if len(ls()) != 2 {
		t.Fatal("snapshot ls lists other than the two snapshots")
	}
	if r := mustOK(t, proc(t, root, "snapshot", "ls"), "snapshot ls"); !strings.Contains(r.stdout, projections.ShortID(s1)) || !strings.HasPrefix(r.stdout, "SNAPSHOT") {
		t.Fatalf("snapshot ls table: %q", r.stdout)
	}

	wantFailure(t, proc(t, root, "snapshot", "rm"), 2, "requires at least 1 arg")
	wantFailure(t, proc(t, root, "snapshot", "ls", sb.ID, other.ID), 2, "at most 1 arg")
	wantFailure(t, proc(t, root, "snapshot", "rm", "01ZZZZ"), 1, `no snapshot "01ZZZZ"`)

	// rm refuses to drop them, naming them, and leaves everything.
	wantFailure(t, proc(t, root, "rm", sb.ID), 1, "--with-snapshots")
	if len(ls("snappy")) != 2 {
		t.Fatal("a refused rm dropped snapshots")
	}

	// snapshot rm by a unique prefix; the directory goes and the journal says so.
	prefix := strings.ToLower(s1[:len(commonPrefix(s1, s2))+1])
	r := mustOK(t, proc(t, root, "snapshot", "rm", prefix), "snapshot rm")
	if !strings.HasPrefix(r.stdout, "removed snapshot "+s1+" of "+sb.ID) {
		t.Fatalf("snapshot rm printed %q", r.stdout)
	}
	if _, err := os.Stat(filepath.Join(root, "snapshots", sb.ID, s1)); !os.IsNotExist(err) {
		t.Fatalf("snapshot directory still there: %v", err)
	}
	ev := mustOK(t, nexus(t, root, "events", "--sandbox", sb.ID, "--type", "resource.reclaimed"), "events").stdout
	if !strings.Contains(ev, "snapshots/"+sb.ID+"/"+s1) || !strings.Contains(ev, "saga=") {
		t.Fatalf("snapshot rm not journaled in a saga: %q", ev)
	}
	if got := ls("snappy"); len(got) != 1 || got[0]["id"] != s2 {
		t.Fatalf("after snapshot rm: %v", got)
	}
	wantFailure(t, proc(t, root, "restore", s1), 1, "no snapshot")
	r = proc(t, root, "snapshot", "rm", s1, s2)
	if r.code != 1 || !strings.Contains(r.stderr, "no snapshot") || !strings.Contains(r.stdout, "removed snapshot "+s2) {
		t.Fatalf("snapshot rm gone+live: exit %d, stdout %q stderr %q", r.code, r.stdout, r.stderr)
	}
	mustOK(t, proc(t, root, "rm", sb.ID), "rm of a stopped sandbox without snapshots")
	mustOK(t, proc(t, root, "rm", "-f", other.ID), "rm -f")
	if left := untracked(t, root); left != nil {
		t.Fatalf("left behind: %v", left)
	}
	if r := mustOK(t, nexus(t, root, "replay", "verify"), "replay verify"); r.code != 0 {
		t.Fatal(r.stderr)
	}
}

// A snapshot rm killed before or after its event is finished by recover:
// the directory is gone, the view forgets the snapshot, nothing is left.
func TestCrashDuringSnapshotRm(t *testing.T) {
	testutil.StartsSandboxes(t)
	t.Parallel()
	for _, phase := range []string{":before", ""} {
		t.Run("delete"+phase, func(t *testing.T) {
			t.Parallel()
			root := shortRoot(t)
			sb := createJSON(t, root, "--image", makeImage(t))
			snap := strings.TrimSpace(mustOK(t, proc(t, root, "snapshot", sb.ID), "snapshot").stdout)
			crashAt(t, root, "snapshot-rm.delete:"+snap+phase, "snapshot", "rm", snap)
			recoverClean(t, root)
			if _, err := os.Stat(filepath.Join(root, "snapshots", sb.ID, snap)); !os.IsNotExist(err) {
				t.Fatalf("snapshot directory survived recover: %v", err)
			}
			if cur := inspectJSON(t, root, sb.ID); len(cur.Snapshots) != 0 || cur.State != projections.StateRunning {
				t.Fatalf("after recover: snapshots %v, state %s", cur.Snapshots, cur.State)
			}
			mustOK(t, proc(t, root, "rm", "-f", sb.ID), "rm -f")
			assertNothingLeft(t, root)
		})
	}
}

// rm reports the bytes it freed, each counted once: the sum of the
// blocks of every file and directory under the root that bears the
// sandbox's ID (its disks, snapshots, records), measured independently
// before. Counting the snapshots directory and each snapshot in it
// separately would report the snapshots twice.
func TestRmReportsBytesOnce(t *testing.T) {
	testutil.StartsSandboxes(t)
	t.Parallel()
	root := shortRoot(t)
	sb := createJSON(t, root, "--image", makeImage(t))
	mustOK(t, proc(t, root, "snapshot", sb.ID), "snapshot")
	mustOK(t, proc(t, root, "snapshot", sb.ID), "snapshot")
	// The console's index takes its first block once the supervisor has
	// seen the console: before the count, not between it and rm's.
	waitIndexed(t, root, sb.ID)
	var want int64
	filepath.WalkDir(root, func(path string, d os.DirEntry, err error) error {
		rel, _ := filepath.Rel(root, path)
		// The runner lease is bookkeeping, not the sandbox's resource in
		// the journal; its logs (logs/<id>.*.log) are.
		if err != nil || strings.HasPrefix(rel, "leases/") || !strings.Contains(rel, sb.ID) {
			return nil
		}
		var st syscall.Stat_t
		if syscall.Lstat(path, &st) == nil {
			want += st.Blocks * 512
		}
		return nil
	})
	r := mustOK(t, proc(t, root, "rm", "-f", "--with-snapshots", "--json", sb.ID), "rm --json")
	var rm struct {
		ID        string   `json:"id"`
		Snapshots []string `json:"snapshots"`
		Bytes     int64    `json:"allocated_bytes"`
		Resources int      `json:"resources"`
	}
	if err := json.Unmarshal([]byte(r.stdout), &rm); err != nil || rm.ID != sb.ID || len(rm.Snapshots) != 2 || rm.Resources == 0 {
		t.Fatalf("rm --json: %v %s", err, r.stdout)
	}
	if want == 0 || rm.Bytes != want {
		t.Fatalf("rm reported %d bytes, the files held %d", rm.Bytes, want)
	}
}
