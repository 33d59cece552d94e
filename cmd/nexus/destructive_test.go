package main

import (
	"bytes"
	"encoding/json"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nexus-sandbox/nexus/internal/testutil"
	"github.com/nexus-sandbox/nexus/lifecycle"
)

// onTerminal runs nexus with a pseudo-terminal as stdin, stdout and stderr
// (util-linux script), typing answer; it returns what the terminal showed
// and the exit code.
func onTerminal(t *testing.T, root, answer string, args ...string) (string, int) {
	t.Helper()
	stopDaemonsAtEnd(t, root)
	var line []string
	for _, a := range append([]string{nexusBin, "--state-dir", root, "--driver", "process"}, args...) {
		line = append(line, "'"+strings.ReplaceAll(a, "'", `'\''`)+"'")
	}
	cmd := exec.Command("script", "-qec", strings.Join(line, " "), "/dev/null")
	cmd.Env = append(os.Environ(), "NEXUS_STATE_DIR=")
	cmd.Stdin = strings.NewReader(answer)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	return out.String(), code
}

func volumeExists(t *testing.T, root, name string) bool {
	t.Helper()
	_, err := os.Stat(filepath.Join(root, "volumes", name, "disk.ext4"))
	return err == nil
}

// TestVolumeDeletionIsConfirmed: deleting volumes (user data) names them
// and asks on a terminal; without one, only --yes deletes, and a prune
// deletes only the volumes it named.
func TestVolumeDeletionIsConfirmed(t *testing.T) {
	testutil.StartsSandboxes(t)
	root := shortRoot(t)
	for _, v := range []string{"data", "spare", "keep"} {
		mustOK(t, proc(t, root, "volume", "create", v, "--size", "16M"), "volume create "+v)
	}
	sb := createJSON(t, root, "--image", makeImage(t), "--volume", "keep:/keep")

	// No terminal, no --yes: refused as a usage error naming the volume.
	wantFailure(t, proc(t, root, "volume", "rm", "data"), 2, "data")
	if !volumeExists(t, root, "data") {
		t.Fatal("volume rm without --yes deleted the volume")
	}
	if r := mustOK(t, proc(t, root, "volume", "rm", "--dry-run", "data"), "volume rm --dry-run"); !strings.Contains(r.stdout, "would remove volume data") || !volumeExists(t, root, "data") {
		t.Fatalf("volume rm --dry-run: %q", r.stdout)
	}
	wantFailure(t, proc(t, root, "volume", "rm", "--dry-run", "keep"), 1, "attached")

	// On a terminal: the prompt names the volume; anything but yes keeps it.
	out, code := onTerminal(t, root, "n\n", "volume", "rm", "data")
	if code != 1 || !strings.Contains(out, "  data") || !strings.Contains(out, "nothing deleted") || !volumeExists(t, root, "data") {
		t.Fatalf("declined volume rm on a terminal: exit %d, %q", code, out)
	}
	out, code = onTerminal(t, root, "y\n", "volume", "rm", "data")
	if code != 0 || !strings.Contains(out, "removed volume data") || volumeExists(t, root, "data") {
		t.Fatalf("confirmed volume rm on a terminal: exit %d, %q", code, out)
	}

	// prune: the dry run names what --apply --include-detached deletes.
	r := mustOK(t, proc(t, root, "volume", "prune", "--include-detached"), "volume prune dry run")
	if !strings.Contains(r.stdout, "would delete volume spare") || strings.Contains(r.stdout, "volume keep") || !volumeExists(t, root, "spare") {
		t.Fatalf("volume prune --include-detached (dry): %q", r.stdout)
	}
	wantFailure(t, proc(t, root, "volume", "prune", "--apply", "--dry-run"), 2, "exclude each other")
	wantFailure(t, proc(t, root, "volume", "prune", "--apply", "--include-detached"), 2, "spare")
	if !volumeExists(t, root, "spare") {
		t.Fatal("volume prune --apply --include-detached without --yes deleted a volume")
	}
	// Clearing stale attachments deletes no user data: no question.
	mustOK(t, proc(t, root, "volume", "prune", "--apply"), "volume prune --apply")
	out, code = onTerminal(t, root, "\n", "volume", "prune", "--apply", "--include-detached")
	if code != 1 || !strings.Contains(out, "  spare") || !volumeExists(t, root, "spare") {
		t.Fatalf("declined prune on a terminal: exit %d, %q", code, out)
	}
	r = mustOK(t, proc(t, root, "volume", "prune", "--apply", "--include-detached", "--yes", "--json"), "volume prune --yes")
	var rep lifecycle.PruneReport
	if err := json.Unmarshal([]byte(r.stdout), &rep); err != nil || len(rep.Removed) != 1 || rep.Removed[0] != "spare" {
		t.Fatalf("volume prune --apply --include-detached --yes: %v %s", err, r.stdout)
	}
	if volumeExists(t, root, "spare") || !volumeExists(t, root, "keep") {
		t.Fatal("prune deleted the wrong volumes")
	}
	mustOK(t, proc(t, root, "rm", "-f", sb.ID), "rm")
}

// TestDryRunEverywhere: every removing command takes --dry-run, names
// what it would remove, and removes nothing.
func TestDryRunEverywhere(t *testing.T) {
	testutil.StartsSandboxes(t)
	root := shortRoot(t)
	sb := createJSON(t, root, "--image", makeImage(t), "--handle", "dry/one")
	snap := strings.TrimSpace(mustOK(t, proc(t, root, "snapshot", sb.ID), "snapshot").stdout)

	wantFailure(t, proc(t, root, "rm", "--dry-run", sb.ID), 1, "refused")
	wantFailure(t, proc(t, root, "rm", "-f", "--dry-run", sb.ID), 1, "--with-snapshots")
	r := mustOK(t, proc(t, root, "rm", "-f", "--with-snapshots", "--dry-run", "dry/one"), "rm --dry-run")
	if !strings.Contains(r.stdout, "would remove "+sb.ID) || !strings.Contains(r.stdout, "snapshot "+snap) || !strings.Contains(r.stdout, "disks/") {
		t.Fatalf("rm --dry-run printed %q: want the sandbox, its disks and its snapshot", r.stdout)
	}
	var plan lifecycle.Removed
	json.Unmarshal([]byte(mustOK(t, proc(t, root, "rm", "-f", "--with-snapshots", "--dry-run", "--json", sb.ID), "rm --dry-run --json").stdout), &plan)
	if plan.ID != sb.ID || plan.Resources == 0 || len(plan.Snapshots) != 1 || plan.AllocatedBytes <= 0 {
		t.Fatalf("rm --dry-run --json: %+v", plan)
	}
	if r := mustOK(t, proc(t, root, "snapshot", "rm", "--dry-run", snap[:12]), "snapshot rm --dry-run"); !strings.Contains(r.stdout, "would remove snapshot "+snap) {
		t.Fatalf("snapshot rm --dry-run printed %q", r.stdout)
	}
	if r := mustOK(t, proc(t, root, "snapshot", "ls", "-q"), "snapshot ls"); r.stdout != snap+"\n" {
		t.Fatalf("after the dry runs snapshot ls -q printed %q", r.stdout)
	}
	if r := mustOK(t, proc(t, root, "ls", "-q"), "ls"); r.stdout != sb.ID+"\n" {
		t.Fatalf("after the dry runs ls -q printed %q", r.stdout)
	}
	wantFailure(t, proc(t, root, "reap", "--apply", "--dry-run"), 2, "exclude each other")
	mustOK(t, proc(t, root, "reap", "--dry-run"), "reap --dry-run")
	mustOK(t, proc(t, root, "ledger", "sweep", "--dry-run"), "ledger sweep --dry-run")

	// What the dry run named is what is then removed.
	r = mustOK(t, proc(t, root, "rm", "-f", "--with-snapshots", "--json", sb.ID), "rm")
	var done lifecycle.Removed
	json.Unmarshal([]byte(r.stdout), &done)
	if done.ID != plan.ID || done.Resources != plan.Resources || !slices.Equal(done.Snapshots, plan.Snapshots) {
		t.Fatalf("rm removed %+v, the dry run said %+v", done, plan)
	}
}

// TestVolumePruneDeletesOnlyWhatItNamed: a volume detached while the
// prompt waits (after the list was shown) is not deleted by the yes.
func TestVolumePruneDeletesOnlyWhatItNamed(t *testing.T) {
	testutil.StartsSandboxes(t)
	root := shortRoot(t)
	for _, v := range []string{"spare", "late"} {
		mustOK(t, proc(t, root, "volume", "create", v, "--size", "16M"), "volume create "+v)
	}
	sb := createJSON(t, root, "--image", makeImage(t), "--volume", "late:/late")
	stopDaemonsAtEnd(t, root)
	cmd := exec.Command("script", "-qec", strings.Join([]string{nexusBin, "--state-dir", root, "--driver", "process", "volume", "prune", "--apply", "--include-detached"}, " "), "/dev/null")
	cmd.Env = append(os.Environ(), "NEXUS_STATE_DIR=")
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out := &testutil.Buffer{}
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill() })
	deadline := time.Now().Add(testutil.Scale(20 * time.Second))
	for !strings.Contains(out.String(), "[y/N]") {
		if time.Now().After(deadline) {
			t.Fatalf("no prompt: %q", out.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
	if s := out.String(); !strings.Contains(s, "  spare") || strings.Contains(s, "late") {
		t.Fatalf("the prompt must name spare only: %q", s)
	}
	mustOK(t, proc(t, root, "rm", "-f", sb.ID), "rm detaches late while the prompt waits")
	io.WriteString(in, "y\n")
	in.Close()
	if err := cmd.Wait(); err != nil {
		t.Fatalf("prune: %v: %q", err, out.String())
	}
	if volumeExists(t, root, "spare") || !volumeExists(t, root, "late") {
		t.Fatalf("prune must delete spare (named) and keep late (detached after the prompt): %q", out.String())
	}
}

// TestLedgerSweepDryRunNamesWhatItWouldRemove: sweep --dry-run (and ls)
// name the sandboxes a sweep of a dead run would remove, and remove none.
func TestLedgerSweepDryRunNamesWhatItWouldRemove(t *testing.T) {
	testutil.StartsSandboxes(t)
	root := shortRoot(t)
	a := createJSON(t, root, "--image", makeImage(t))
	dir := filepath.Join(root, "runs")
	os.MkdirAll(dir, 0o700)
	writeHand(t, dir, "dead-run.json", handRecord("dead-run", goneProcessPid(t), time.Now().UnixMilli(), "process"))
	writeHand(t, dir, "dead-run.sandboxes", a.ID+"\n")

	r := mustOK(t, proc(t, root, "ledger", "sweep", "--dry-run"), "ledger sweep --dry-run")
	if !strings.Contains(r.stdout, "dead-run") || !strings.Contains(r.stdout, "would remove "+a.ID) {
		t.Fatalf("ledger sweep --dry-run printed %q: want the run and the sandbox it would remove", r.stdout)
	}
	var planned []struct {
		Run         string   `json:"run"`
		Verdict     string   `json:"verdict"`
		WouldRemove []string `json:"would_remove"`
	}
	json.Unmarshal([]byte(mustOK(t, proc(t, root, "ledger", "ls", "--json"), "ledger ls").stdout), &planned)
	if len(planned) != 1 || planned[0].Verdict != "sweep" || !slices.Equal(planned[0].WouldRemove, []string{a.ID}) {
		t.Fatalf("ledger ls --json: %+v", planned)
	}
	if r := mustOK(t, proc(t, root, "ls", "-q"), "ls"); r.stdout != a.ID+"\n" {
		t.Fatalf("the dry run removed the sandbox: ls -q %q", r.stdout)
	}
	if _, err := os.Stat(filepath.Join(dir, "dead-run.json")); err != nil {
		t.Fatalf("the dry run removed the ledger: %v", err)
	}
	out := sweepJSON(t, root)
	if len(out) != 1 || !slices.Equal(out[0].Removed, []string{a.ID}) {
		t.Fatalf("the sweep removed %+v, the dry run named %s", out, a.ID)
	}
}
