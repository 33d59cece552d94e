package main

import (
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/nexus-sandbox/nexus/internal/testutil"
	"github.com/nexus-sandbox/nexus/replay"
)

// treeSum hashes every file's path, mode and bytes under dir.
func treeSum(t *testing.T, dir string) string {
	t.Helper()
	h := sha256.New()
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		fmt.Fprintf(h, "%s %v\n", p, info.Mode())
		if info.Mode().IsRegular() {
			data, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			h.Write(data)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return fmt.Sprintf("%x", h.Sum(nil))
}

// TestReplayAuditsACrashedCreate is the audit walk-through of docs/audit.md
// as a test: a create killed right before its commit, audited on the state
// root and on a copy taken elsewhere, before and after recover. No replay
// command changes a byte of the journal it reads.
func TestReplayAuditsACrashedCreate(t *testing.T) {
	testutil.StartsSandboxes(t)
	t.Parallel()
	root := shortRoot(t)
	crashAt(t, root, "create.commit:before", "create", "--image", makeImage(t), "--handle", "audit/me")
	// The journal is audited at rest: the create's on-demand daemon writes
	// the stream's state files when it stops, and idling out it could do
	// so between the two sums below on a slow machine. None of the replay
	// commands between them starts one.
	mustOK(t, nexus(t, root, "daemon", "stop"), "daemon stop")
	journalDir := filepath.Join(root, "journal")
	before := treeSum(t, journalDir)

	r := nexus(t, root, "replay", "verify", "--json")
	var rep replay.Report
	if err := json.Unmarshal([]byte(r.stdout), &rep); err != nil || r.code != 1 {
		t.Fatalf("verify of a crashed journal: exit %d, %v\n%s%s", r.code, err, r.stdout, r.stderr)
	}
	if !rep.OK() || len(rep.OpenSagas) != 1 || rep.OpenSagas[0].Kind != "create" {
		t.Fatalf("verify report: %+v", rep)
	}
	id := rep.OpenSagas[0].Sandbox

	copyDir := filepath.Join(t.TempDir(), "incident-journal")
	if out, err := exec.Command("cp", "-a", journalDir, copyDir).CombinedOutput(); err != nil {
		t.Fatalf("cp -a: %v %s", err, out)
	}
	copySum := treeSum(t, copyDir)
	tl := mustOK(t, nexus(t, t.TempDir(), "replay", "timeline", id, "--journal", copyDir, "--json"), "timeline --journal")
	var entries []struct{ Step string }
	if err := json.Unmarshal([]byte(tl.stdout), &entries); err != nil {
		t.Fatal(err)
	}
	var steps []string
	for _, e := range entries {
		steps = append(steps, e.Step)
	}
	if got := strings.Join(steps, ","); got != "saga.started,intents,intents#2,image-cache,image-cache#2,workspace-disk,supervisor-state,record-dir" {
		t.Fatalf("timeline steps of the crashed create: %s", got)
	}
	at := mustOK(t, nexus(t, root, "replay", "at", "3", "--json"), "at 3")
	var st replay.State
	if err := json.Unmarshal([]byte(at.stdout), &st); err != nil || st.Seq != 3 {
		t.Fatalf("at 3: %v %+v", err, st)
	}
	if treeSum(t, journalDir) != before || treeSum(t, copyDir) != copySum {
		t.Fatal("replay modified a journal it audited")
	}
	wantFailure(t, nexus(t, root, "replay", "at", "yesterday"), 2, "want a sequence (42), an RFC 3339 time")
	// An age reads as --since reads one: a day ago is before the first event.
	dayAgo := mustOK(t, nexus(t, root, "replay", "at", "1d", "--json"), "at 1d")
	if err := json.Unmarshal([]byte(dayAgo.stdout), &st); err != nil || st.Seq != 0 || len(st.Sandboxes) != 0 {
		t.Fatalf("at 1d: %v %+v", err, st)
	}
	wantFailure(t, nexus(t, root, "replay", "verify", "--journal", t.TempDir()), 1, "not a nexus journal")

	wantFailure(t, nexus(t, root, "replay", "diff"), 1, "disagree")

	recoverClean(t, root)
	mustOK(t, nexus(t, root, "replay", "verify"), "verify after recover")
	mustOK(t, nexus(t, root, "replay", "diff"), "diff after recover")
	if r := mustOK(t, nexus(t, root, "replay", "timeline", id), "timeline after recover"); !strings.Contains(r.stdout, "saga.compensated") {
		t.Fatalf("timeline after recover lacks the compensation:\n%s", r.stdout)
	}
}
