package main

import (
	"crypto/sha256"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/nexus-sandbox/nexus/internal/testutil"
)

func fileSum(t *testing.T, path string) [32]byte {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	return sha256.Sum256(data)
}

// TestHandlesDifferingBySlashAndUnderscore: "a/b" and "a_b" must map to
// different safe handles, or their shadow disks and intents collide and a
// failed create of one deletes the other's shadow disk.
func TestHandlesDifferingBySlashAndUnderscore(t *testing.T) {
	testutil.StartsSandboxes(t)
	t.Parallel()
	root, image := shortRoot(t), makeImage(t)
	src := filepath.Join(t.TempDir(), "cfg.img")
	if err := os.WriteFile(src, []byte("shadow source"), 0o600); err != nil {
		t.Fatal(err)
	}
	slash := createJSON(t, root, "--image", image, "--handle", "a/b", "--shadow", "cfg="+src)
	slashDisk := filepath.Join(root, "disks", "a_b.shadow.cfg.ext4") // SPEC.md: "/" -> "_"
	if !owns(slash, "disks/a_b.shadow.cfg.ext4") {
		t.Fatalf("a/b does not own its shadow disk: %+v", slash.Resources)
	}
	before := fileSum(t, slashDisk)

	// A create of a_b that fails after its shadow disk exists: its
	// compensation removes its own disk, never a/b's.
	r := nexusEnv(t, root, []string{"NEXUS_FAIL_APPEND=sandbox.created"}, "--driver", "process",
		"create", "--image", image, "--handle", "a_b", "--shadow", "cfg="+src)
	if _, err := os.Lstat(slashDisk); err != nil || fileSum(t, slashDisk) != before {
		t.Fatalf("a failed create of a_b removed or changed a/b's shadow disk: %v", err)
	}
	wantFailure(t, r, 1, "injected failure")
	if _, err := os.Lstat(filepath.Join(root, "disks", "a+b.shadow.cfg.ext4")); !os.IsNotExist(err) {
		t.Fatalf("the failed create left its own shadow disk: %v", err)
	}

	under := createJSON(t, root, "--image", image, "--handle", "a_b", "--shadow", "cfg="+src)
	if !owns(under, "disks/a+b.shadow.cfg.ext4") || owns(under, "disks/a_b.shadow.cfg.ext4") {
		t.Fatalf("a_b's resources: %+v", under.Resources)
	}
	assertClean(t, root)

	// A leftover file at a handle's shadow path that this create did not
	// make: the step refuses it (O_EXCL) and the undo leaves it alone.
	stray := filepath.Join(root, "disks", "c+d.shadow.cfg.ext4")
	if err := os.WriteFile(stray, []byte("not this saga's"), 0o600); err != nil {
		t.Fatal(err)
	}
	r = proc(t, root, "create", "--image", image, "--handle", "c_d", "--shadow", "cfg="+src)
	if data, err := os.ReadFile(stray); err != nil || string(data) != "not this saga's" {
		t.Fatalf("the compensation removed or changed a file it did not make: %q, %v", data, err)
	}
	wantFailure(t, r, 1, "not this saga's")
	os.Remove(stray)

	// A handle whose shadow disk is a path the journal already gives to
	// another sandbox (here a fork child's copy of a/b's shadow disk) is
	// refused before anything is written.
	forked := mustOK(t, proc(t, root, "fork", slash.ID, "--json"), "fork")
	var children []jsonSandbox
	if err := json.Unmarshal([]byte(forked.stdout), &children); err != nil || len(children) != 1 {
		t.Fatalf("fork made %d children", len(children))
	}
	child := children[0].ID
	wantFailure(t, proc(t, root, "create", "--image", image, "--handle", child+"-a/b", "--shadow", "cfg="+src), 1, "already owned by sandbox "+child)
	wantFailure(t, proc(t, root, "create", "--image", image, "--handle", child+"-other"), 1, "names fork copies")
	assertClean(t, root)

	for _, sb := range []string{slash.ID, under.ID, child} {
		mustOK(t, proc(t, root, "rm", "-f", "--with-snapshots", sb), "rm "+sb)
	}
	assertClean(t, root)
}

// TestRecoverKeepsAShadowDiskAnotherSandboxOwns: recover deletes what an
// uncommitted create's intent covers; a marker whose handle and cover name
// another sandbox's shadow disk (damaged, planted, or written by a nexus
// with the lossy mapping) must not make recover delete it.
func TestRecoverKeepsAShadowDiskAnotherSandboxOwns(t *testing.T) {
	testutil.StartsSandboxes(t)
	t.Parallel()
	root, image := shortRoot(t), makeImage(t)
	src := filepath.Join(t.TempDir(), "cfg.img")
	if err := os.WriteFile(src, []byte("shadow source"), 0o600); err != nil {
		t.Fatal(err)
	}
	owner := createJSON(t, root, "--image", image, "--handle", "a/b", "--shadow", "cfg="+src)
	disk := filepath.Join(root, "disks", "a_b.shadow.cfg.ext4")
	before := fileSum(t, disk)
	crashAt(t, root, "create.workspace-disk", "create", "--image", image)

	matches, _ := filepath.Glob(filepath.Join(root, "disks", "*.create-intent.json"))
	if len(matches) != 1 {
		t.Fatalf("want the crashed create's intent, found %v", matches)
	}
	data, err := os.ReadFile(matches[0])
	if err != nil {
		t.Fatal(err)
	}
	var in map[string]any
	if err := json.Unmarshal(data, &in); err != nil {
		t.Fatal(err)
	}
	in["handle"] = "a/b"
	in["covers"] = append(in["covers"].([]any), "disks/a_b.shadow.cfg.ext4")
	data, _ = json.Marshal(in)
	if err := os.WriteFile(matches[0], data, 0o600); err != nil {
		t.Fatal(err)
	}

	mustOK(t, proc(t, root, "recover"), "recover")
	if _, err := os.Lstat(disk); err != nil || fileSum(t, disk) != before {
		t.Fatalf("recover removed or changed the shadow disk sandbox %s owns: %v", owner.ID, err)
	}
	if r := nexus(t, root, "events", "--type", "warning.raised"); !strings.Contains(r.stdout, "which sandbox "+owner.ID+" owns") {
		t.Fatalf("want a ForeignIntentCover warning naming %s, got:\n%s", owner.ID, r.stdout)
	}
	assertClean(t, root)
	mustOK(t, proc(t, root, "rm", "-f", "--with-snapshots", owner.ID), "rm")
}
