package main

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/oklog/ulid/v2"

	"github.com/nexus-sandbox/nexus/host/logindex"
	"github.com/nexus-sandbox/nexus/internal/testutil"
)

// A sandbox's logs are its resources: journaled when a boot first writes
// them, shown by `nexus logs`, removed by rm.
func TestLogsAreOwnedShownAndRemoved(t *testing.T) {
	testutil.StartsSandboxes(t)
	t.Parallel()
	root := shortRoot(t)
	sb := createJSON(t, root, "--image", makeImage(t), "--handle", "logged")
	logs := []string{"logs/" + sb.ID + ".vmm.log", "logs/" + sb.ID + ".supervisor.log", "logs/" + sb.ID + ".console.log", "logs/" + sb.ID + ".console.idx"}
	owned := map[string]string{}
	for _, r := range inspect(t, root, sb.ID).Resources {
		owned[r.Path] = string(r.Kind)
	}
	for _, l := range logs {
		if owned[l] != "log" {
			t.Errorf("%s is not journaled as the sandbox's log (resources: %v)", l, owned)
		}
	}
	out := mustOK(t, proc(t, root, "logs", "logged"), "logs").stdout
	if !strings.Contains(out, "booted") {
		t.Errorf("nexus logs printed no console line: %q", out)
	}
	mustOK(t, proc(t, root, "logs", sb.ID, "--log", "supervisor"), "logs --log supervisor")
	wantFailure(t, proc(t, root, "logs", sb.ID, "--log", "kernel"), 2, "--log")
	wantFailure(t, proc(t, root, "logs", "nosuch"), 1, "no sandbox")

	// Stop and start again: the logs are kept and claimed once.
	mustOK(t, proc(t, root, "stop", sb.ID), "stop")
	mustOK(t, proc(t, root, "start", sb.ID), "start")
	n := 0
	for _, r := range inspect(t, root, sb.ID).Resources {
		if r.Path == logs[0] {
			n++
		}
	}
	if n != 1 {
		t.Errorf("the VMM log is owned %d times after a restart", n)
	}
	whole := mustOK(t, proc(t, root, "logs", sb.ID, "--log", "vmm"), "logs --log vmm").stdout
	lines := strings.SplitAfter(whole, "\n")
	if lines[len(lines)-1] == "" {
		lines = lines[:len(lines)-1]
	}
	if len(lines) < 3 {
		t.Fatalf("the VMM log after a restart has %d line(s), too few to tail: %q", len(lines), whole)
	}
	if got, want := mustOK(t, proc(t, root, "logs", sb.ID, "--log", "vmm", "--tail", "2"), "logs --tail 2").stdout, strings.Join(lines[len(lines)-2:], ""); got != want {
		t.Errorf("logs --tail 2 = %q, want the log's last two lines %q", got, want)
	}
	wantFailure(t, proc(t, root, "logs", sb.ID, "--tail", "-1"), 2, "--tail")

	mustOK(t, proc(t, root, "rm", "-f", sb.ID), "rm")
	for _, l := range logs {
		if exists(filepath.Join(root, l)) {
			t.Errorf("rm left %s", l)
		}
	}
}

// `nexus logs --follow` prints lines appended after it started and ends
// when the sandbox is removed.
func TestLogsFollowEndsWithTheSandbox(t *testing.T) {
	testutil.StartsSandboxes(t)
	t.Parallel()
	root := shortRoot(t)
	sb := createJSON(t, root, "--image", makeImage(t))
	ctx, cancel := context.WithTimeout(context.Background(), testutil.Scale(2*time.Minute))
	defer cancel()
	cmd := exec.CommandContext(ctx, nexusBin, "--state-dir", root, "logs", sb.ID, "--follow")
	cmd.Env = append(os.Environ(), "NEXUS_STATE_DIR=")
	var out testutil.Buffer
	cmd.Stdout = &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	// Once the follower has the log open (removed first, there would be
	// nothing to follow). Stopping writes to the console (the stand-in
	// guest logs its shutdown).
	waitUntil(t, "logs --follow printed the boot", func() bool { return strings.Contains(out.String(), "booted") })
	mustOK(t, proc(t, root, "stop", sb.ID), "stop")
	mustOK(t, proc(t, root, "rm", sb.ID), "rm")
	if err := cmd.Wait(); err != nil {
		t.Fatalf("logs --follow: %v (output %q)", err, out.String())
	}
	if !strings.Contains(out.String(), "booted") {
		t.Errorf("logs --follow printed %q", out.String())
	}
}

// The logs of a sandbox the journal no longer has are orphans the reaper
// deletes; the daemon's own log is no sandbox's and is never reported.
func TestReapFindsOrphanLogs(t *testing.T) {
	testutil.StartsSandboxes(t)
	t.Parallel()
	root := shortRoot(t)
	live := createJSON(t, root, "--image", makeImage(t))
	gone := ulid.Make().String()
	orphan := filepath.Join(root, "logs", gone+".vmm.log")
	orphanIndex := filepath.Join(root, "logs", gone+".console.idx")
	liveIndex := filepath.Join(root, "logs", live.ID+".console.idx")
	old := time.Now().Add(-48 * time.Hour)
	for _, p := range []string{orphan, orphanIndex} {
		if err := os.WriteFile(p, []byte("old\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		os.Chtimes(p, old, old)
	}
	os.WriteFile(filepath.Join(root, "logs", "daemon.log"), []byte("{}\n"), 0o600)

	rep, _ := reapRun(t, root)
	for _, p := range []string{orphan, orphanIndex} {
		if o := has(rep.Orphans, p); o == nil || o.Kind != "log" {
			t.Fatalf("orphan log %s not reported: orphans %v kept %v", p, paths(rep.Orphans), paths(rep.Kept))
		}
	}
	if k := has(rep.Kept, liveIndex); k == nil || k.Kind != "log" || k.Verdict != "owned" {
		t.Fatalf("the live sandbox's console index is not kept as its log: %+v (kept %v)", k, paths(rep.Kept))
	}
	for _, r := range append(rep.Orphans, rep.Kept...) {
		if r.Path == filepath.Join(root, "logs", "daemon.log") {
			t.Fatalf("the daemon's log is reported: %+v", r)
		}
		if strings.HasPrefix(r.Path, filepath.Join(root, "logs", live.ID)) && r.Verdict != "owned" {
			t.Fatalf("a live sandbox's log is not owned: %+v", r)
		}
	}
	// reapRun: an apply whose /proc scan met an exiting process keeps the
	// orphan as ambiguous, as it must; the test asserts the conclusive run.
	if _, r := reapRun(t, root, "--apply", "--kind", "log"); r.code != 0 {
		t.Fatalf("reap --apply: exit %d: %s", r.code, r.stderr)
	}
	if exists(orphan) || exists(orphanIndex) {
		t.Fatal("reap --apply left an orphan log")
	}
	if !exists(filepath.Join(root, "logs", live.ID+".console.log")) || !exists(liveIndex) {
		t.Fatal("reap --apply removed a live sandbox's log")
	}
}

// indexCovers says the console index at path holds a record at or past
// size: the supervisor has seen the console that long.
func indexCovers(path string, size int64) bool {
	b, err := os.ReadFile(path)
	if err != nil || len(b) < logindex.RecordSize {
		return false
	}
	last := b[len(b)-len(b)%logindex.RecordSize-logindex.RecordSize:]
	off, err := strconv.ParseInt(string(last[20:logindex.RecordSize-1]), 10, 64)
	return err == nil && off >= size
}

// waitIndexed waits until the supervisor has indexed the console as long
// as it is now, and returns that length.
func waitIndexed(t *testing.T, root, id string) int64 {
	t.Helper()
	console, index := filepath.Join(root, "logs", id+".console.log"), filepath.Join(root, "logs", id+".console.idx")
	fi, err := os.Stat(console)
	if err != nil {
		t.Fatal(err)
	}
	limit := testutil.Scale(30 * time.Second)
	for deadline := time.Now().Add(limit); !indexCovers(index, fi.Size()); time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			sup, _ := os.ReadFile(filepath.Join(root, "logs", id+".supervisor.log"))
			idx, _ := os.ReadFile(index)
			t.Fatalf("the console index does not reach %d bytes after %v; index:\n%s\nsupervisor log:\n%s", fi.Size(), limit, idx, sup)
		}
	}
	return fi.Size()
}

// stampedLines splits `logs --timestamps` output into times and lines.
func stampedLines(t *testing.T, out string) ([]time.Time, []string) {
	t.Helper()
	var times []time.Time
	var lines []string
	for _, l := range strings.SplitAfter(out, "\n") {
		if l == "" {
			continue
		}
		stamp, line, ok := strings.Cut(l, " ")
		ts, err := time.Parse(time.RFC3339, stamp)
		if !ok || err != nil {
			t.Fatalf("line %q has no time prefix (%v)", l, err)
		}
		times, lines = append(times, ts), append(lines, line)
	}
	return times, lines
}

// The console carries no times; the supervisor's index places its lines:
// --timestamps stamps every line in order, --since prints the lines seen
// at or after a time, alone, with -n and with -f; logs without an index
// refuse both.
func TestLogsSinceAndTimestamps(t *testing.T) {
	testutil.StartsSandboxes(t)
	t.Parallel()
	root := shortRoot(t)
	sb := createJSON(t, root, "--image", makeImage(t))
	console := filepath.Join(root, "logs", sb.ID+".console.log")

	// Batch A: the boot's line and a snapshot's freeze and thaw.
	mustOK(t, proc(t, root, "snapshot", sb.ID), "snapshot A")
	sizeA := waitIndexed(t, root, sb.ID)
	since := time.Now()
	// Batch B, written after since: another freeze and thaw.
	mustOK(t, proc(t, root, "snapshot", sb.ID), "snapshot B")
	waitIndexed(t, root, sb.ID)
	whole, err := os.ReadFile(console)
	if err != nil {
		t.Fatal(err)
	}
	batchB := string(whole[sizeA:])
	if !strings.Contains(string(whole[:sizeA]), "booted") || strings.Count(batchB, "thawed") != 1 {
		t.Fatalf("the console is not the two batches (A ends at %d):\n%s", sizeA, whole)
	}

	out := mustOK(t, proc(t, root, "logs", sb.ID, "--timestamps"), "logs --timestamps").stdout
	times, lines := stampedLines(t, out)
	if got := strings.Join(lines, ""); got != string(whole) {
		t.Fatalf("logs --timestamps lines are not the console's:\n%s\nconsole:\n%s", got, whole)
	}
	for i := 1; i < len(times); i++ {
		if times[i].Before(times[i-1]) {
			t.Fatalf("times go back at line %d:\n%s", i, out)
		}
	}

	sinceArg := since.UTC().Format(time.RFC3339Nano)
	if got := mustOK(t, proc(t, root, "logs", sb.ID, "--since", sinceArg), "logs --since").stdout; got != batchB {
		t.Fatalf("logs --since %s = %q, want the lines written after it %q", sinceArg, got, batchB)
	}
	bLines := strings.SplitAfter(strings.TrimSuffix(batchB, "\n"), "\n")
	if got := mustOK(t, proc(t, root, "logs", sb.ID, "--since", sinceArg, "-n", "1"), "logs --since -n 1").stdout; got != bLines[len(bLines)-1]+"\n" {
		t.Fatalf("logs --since -n 1 = %q, want B's last line", got)
	}
	out = mustOK(t, proc(t, root, "logs", sb.ID, "--since", sinceArg, "--timestamps"), "logs --since --timestamps").stdout
	times, lines = stampedLines(t, out)
	if strings.Join(lines, "") != batchB {
		t.Fatalf("logs --since --timestamps = %q, want B's lines", out)
	}
	for _, ts := range times {
		if ts.Before(since.Truncate(time.Second)) {
			t.Fatalf("a line since %s is stamped %s:\n%s", sinceArg, ts, out)
		}
	}
	if got := mustOK(t, proc(t, root, "logs", sb.ID, "--since", time.Now().Add(time.Hour).UTC().Format(time.RFC3339)), "logs --since the future").stdout; got != "" {
		t.Fatalf("logs --since an hour ahead printed %q", got)
	}
	if got := mustOK(t, proc(t, root, "logs", sb.ID, "--since", "1d"), "logs --since 1d").stdout; got != string(whole) {
		t.Fatalf("logs --since 1d = %q, want the whole console", got)
	}

	wantFailure(t, proc(t, root, "logs", sb.ID, "--log", "vmm", "--since", "1m"), 2, "no time index")
	wantFailure(t, proc(t, root, "logs", sb.ID, "--log", "supervisor", "--timestamps"), 2, "no time index")
	wantFailure(t, proc(t, root, "logs", sb.ID, "--since", "yesterday"), 2, "--since")

	// The index is the sandbox's: journaled, no divergence, nothing for
	// recover or the reaper.
	owned := map[string]string{}
	for _, r := range inspect(t, root, sb.ID).Resources {
		owned[r.Path] = string(r.Kind)
	}
	if owned["logs/"+sb.ID+".console.idx"] != "log" {
		t.Errorf("the console index is not journaled as the sandbox's log: %v", owned)
	}
	recoverClean(t, root)
	assertReapAndDiffClean(t, root)

	// -f from since: B's lines, stamped, until the sandbox is removed
	// (once they are printed: removed first, there is nothing to follow).
	ctx, cancel := context.WithTimeout(context.Background(), testutil.Scale(2*time.Minute))
	defer cancel()
	cmd := exec.CommandContext(ctx, nexusBin, "--state-dir", root, "logs", sb.ID, "--since", sinceArg, "--timestamps", "-f")
	cmd.Env = append(os.Environ(), "NEXUS_STATE_DIR=")
	var follow testutil.Buffer
	cmd.Stdout = &follow
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "logs -f printed B's lines", func() bool {
		return strings.Count(follow.String(), "\n") >= strings.Count(batchB, "\n")
	})
	mustOK(t, proc(t, root, "rm", "-f", "--with-snapshots", sb.ID), "rm")
	if err := cmd.Wait(); err != nil {
		t.Fatalf("logs -f: %v (output %q)", err, follow.String())
	}
	if _, lines := stampedLines(t, follow.String()); !strings.HasPrefix(strings.Join(lines, ""), batchB) {
		t.Fatalf("logs --since -f printed %q, want B's lines first", follow.String())
	}
	if exists(filepath.Join(root, "logs", sb.ID+".console.idx")) {
		t.Fatal("rm left the console index")
	}
}
