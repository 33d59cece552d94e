package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/nexus-sandbox/nexus/internal/testutil"
)

// TestRename: rename gives a sandbox a new handle, which every command
// then takes; a handle another sandbox holds is refused naming the holder;
// the old handle is free at once, so a create of it succeeds; events
// shows the rename without --all.
func TestRename(t *testing.T) {
	testutil.StartsSandboxes(t)
	t.Parallel()
	root, image := shortRoot(t), makeImage(t)
	web := createJSON(t, root, "--image", image, "--no-wait", "--handle", "web")
	db := createJSON(t, root, "--image", image, "--no-wait", "--handle", "db")

	wantFailure(t, proc(t, root, "rename", web.ID), 2, "accepts 2 arg")
	wantFailure(t, proc(t, root, "rename", "web", "db"), 1, `handle "db" is already in use by sandbox `+db.ID)
	wantFailure(t, proc(t, root, "rename", "web", "web"), 1, `is already "web"`)
	// A prefix of db's ID alone: IDs made within a second share their
	// first eight characters.
	n := 8
	for strings.HasPrefix(web.ID, db.ID[:n]) {
		n++
	}
	wantFailure(t, proc(t, root, "rename", "web", db.ID[:n]), 1, "is a prefix of the ID or short ID of sandbox "+db.ID)
	if got := inspectJSON(t, root, web.ID).Handle; got != "web" {
		t.Fatalf("a refused rename changed the handle to %q", got)
	}

	var renamed jsonSandbox
	if err := json.Unmarshal([]byte(mustOK(t, proc(t, root, "rename", "web", "web/old", "--json"), "rename").stdout), &renamed); err != nil || renamed.ID != web.ID || renamed.Handle != "web/old" {
		t.Fatalf("rename --json: %v %+v", err, renamed)
	}
	if got := inspectJSON(t, root, "web/old").ID; got != web.ID {
		t.Fatalf("web/old names %s, want %s", got, web.ID)
	}
	if got := ids(t, proc(t, root, "ls", "-q", "--filter", "handle=web"), "ls"); len(got) != 0 {
		t.Fatalf("the old handle still lists %v", got)
	}

	// The old handle is free: a create of it commits, and it names the
	// new sandbox.
	again := createJSON(t, root, "--image", image, "--no-wait", "--handle", "web")
	if again.ID == web.ID || inspectJSON(t, root, "web").ID != again.ID {
		t.Fatalf("web names %s after its create", inspectJSON(t, root, "web").ID)
	}
	// And the renamed sandbox's new handle is held: neither a create nor
	// a rename of another sandbox takes it.
	wantFailure(t, proc(t, root, "create", "--image", image, "--no-wait", "--handle", "web/old"), 1, "already in use by sandbox "+web.ID)
	wantFailure(t, proc(t, root, "rename", "db", "web/old"), 1, "already in use by sandbox "+web.ID)

	events := mustOK(t, proc(t, root, "events"), "events").stdout
	var lines []string
	for _, l := range strings.Split(events, "\n") {
		if strings.Contains(l, "sandbox.renamed") {
			lines = append(lines, l)
		}
	}
	if len(lines) != 1 || !strings.Contains(lines[0], "handle=web/old") || !strings.Contains(lines[0], "old=web") {
		t.Fatalf("events shows the rename as %q:\n%s", lines, events)
	}
	// Shadow disks are named by the handle: their sandbox keeps it.
	src := filepath.Join(t.TempDir(), "cfg.img")
	if err := os.WriteFile(src, []byte("shadow source"), 0o600); err != nil {
		t.Fatal(err)
	}
	createJSON(t, root, "--image", image, "--no-wait", "--handle", "sh", "--shadow", "cfg="+src)
	wantFailure(t, proc(t, root, "rename", "sh", "sh2"), 1, `its shadow disk disks/sh.shadow.cfg.ext4 is named by its handle "sh"`)
	mustOK(t, proc(t, root, "rm", "-f", "sh"), "rm")

	// A stop and rm of the renamed sandbox by its new handle; its old
	// handle is another sandbox's now and stays so.
	mustOK(t, proc(t, root, "rm", "-f", "web/old"), "rm")
	if got := ids(t, proc(t, root, "ls", "-q"), "ls"); !slices.Equal(got, sorted(db.ID, again.ID)) {
		t.Fatalf("ls after rm = %v", got)
	}
}
