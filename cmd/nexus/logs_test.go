package main

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/oklog/ulid/v2"

	"github.com/nexus-sandbox/nexus/internal/testutil"
)

// A sandbox's logs are its resources: journaled when a boot first writes
// them, shown by `nexus logs`, removed by rm.
func TestLogsAreOwnedShownAndRemoved(t *testing.T) {
	testutil.StartsSandboxes(t)
	t.Parallel()
	root := shortRoot(t)
	sb := createJSON(t, root, "--image", makeImage(t), "--handle", "logged")
	logs := []string{"logs/" + sb.ID + ".vmm.log", "logs/" + sb.ID + ".supervisor.log", "logs/" + sb.ID + ".console.log"}
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
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, nexusBin, "--state-dir", root, "logs", sb.ID, "--follow")
	cmd.Env = append(os.Environ(), "NEXUS_STATE_DIR=")
	var out strings.Builder
	cmd.Stdout = &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	// Stopping writes to the console (the stand-in guest logs its shutdown).
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
	if err := os.WriteFile(orphan, []byte("old\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(root, "logs", "daemon.log"), []byte("{}\n"), 0o600)
	old := time.Now().Add(-48 * time.Hour)
	os.Chtimes(orphan, old, old)

	rep, _ := reapRun(t, root)
	if o := has(rep.Orphans, orphan); o == nil || o.Kind != "log" {
		t.Fatalf("orphan log not reported: orphans %v kept %v", paths(rep.Orphans), paths(rep.Kept))
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
	if exists(orphan) {
		t.Fatal("reap --apply left the orphan log")
	}
	if !exists(filepath.Join(root, "logs", live.ID+".console.log")) {
		t.Fatal("reap --apply removed a live sandbox's log")
	}
}
