package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/nexus-sandbox/nexus/internal/testutil"
)

// A command on root A never reaches root B's daemon: a symlink at
// A/nexus.sock is refused before any request, and a hard link to B's
// socket (which no path rule can see) is refused by the daemon's answer
// to which root it serves, naming both roots. B's sandbox is untouched
// and B's journal has no removal.
func TestClientRefusesAnotherRootsDaemon(t *testing.T) {
	testutil.StartsSandboxes(t)
	t.Parallel()
	a, b := shortRoot(t), shortRoot(t)
	startDaemon(t, b)
	victim := createJSON(t, b, "--image", makeImage(t), "--handle", "victim")
	bSock := filepath.Join(b, "nexus.sock")
	aSock := filepath.Join(a, "nexus.sock")
	untouched := func(what string) {
		t.Helper()
		sb := listed(t, b, victim.ID)
		if sb == nil || sb.State != "running" {
			t.Fatalf("%s: B's sandbox is now %+v", what, sb)
		}
		if ev := mustOK(t, nexus(t, b, "events", "--sandbox", victim.ID), "events"); strings.Contains(ev.stdout, "sandbox.removed") || strings.Contains(ev.stdout, `"kind":"rm"`) {
			t.Fatalf("%s: B's journal records a removal:\n%s", what, ev.stdout)
		}
	}

	if err := os.Symlink(bSock, aSock); err != nil {
		t.Fatal(err)
	}
	r := proc(t, a, "rm", "-f", "victim")
	wantFailure(t, r, 1, "symbolic link")
	if !strings.Contains(r.stderr, aSock) {
		t.Fatalf("the refusal does not name the socket: %q", r.stderr)
	}
	untouched("symlinked socket")

	if err := os.Remove(aSock); err != nil {
		t.Fatal(err)
	}
	if err := os.Link(bSock, aSock); err != nil {
		t.Fatal(err)
	}
	r = proc(t, a, "rm", "-f", "victim")
	wantFailure(t, r, 1, "serves the state root "+b)
	if !strings.Contains(r.stderr, "not "+a) {
		t.Fatalf("the refusal does not name this root: %q", r.stderr)
	}
	untouched("hard-linked socket")
	r = nexus(t, a, "daemon", "status")
	wantFailure(t, r, 1, "serves the state root "+b)
}
