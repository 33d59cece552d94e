package main

import (
	"encoding/json"
	"slices"
	"strings"
	"testing"

	"github.com/nexus-sandbox/nexus/internal/testutil"
)

// TestForkHandleTemplateAndRestoreHandle: fork --handle with {n} names
// each of --count children; without {n} it names one, so a count above 1
// is a usage error; a fork one of whose handles is taken makes no child
// and names the holder. restore --handle names the restored sandbox,
// under the same rule.
func TestForkHandleTemplateAndRestoreHandle(t *testing.T) {
	testutil.StartsSandboxes(t)
	t.Parallel()
	root, image := shortRoot(t), makeImage(t)
	parent := createJSON(t, root, "--image", image, "--no-wait", "--handle", "web")
	mustOK(t, proc(t, root, "stop", "web"), "stop")

	wantFailure(t, proc(t, root, "fork", "web", "--count", "2", "--handle", "web/x"), 2, `--handle "web/x" names one child: with --count 2 it needs {n}`)

	var children []jsonSandbox
	if err := json.Unmarshal([]byte(mustOK(t, proc(t, root, "fork", "web", "--count", "3", "--handle", "web/{n}", "--no-wait", "--json"), "fork").stdout), &children); err != nil || len(children) != 3 {
		t.Fatalf("fork --count 3: %v %+v", err, children)
	}
	var handles []string
	byHandle := map[string]string{}
	for _, c := range children {
		handles = append(handles, c.Handle)
		byHandle[c.Handle] = c.ID
		if c.Parent != parent.ID {
			t.Errorf("child %s has parent %s", c.ID, c.Parent)
		}
	}
	if slices.Sort(handles); !slices.Equal(handles, []string{"web/1", "web/2", "web/3"}) {
		t.Fatalf("children's handles = %v", handles)
	}
	for h, id := range byHandle {
		if got := inspectJSON(t, root, h).ID; got != id {
			t.Errorf("%s names %s, want %s", h, got, id)
		}
	}
	// web/1 and web/2 are taken: the fork makes no child.
	before := ids(t, proc(t, root, "ls", "-q"), "ls")
	wantFailure(t, proc(t, root, "fork", "web", "--count", "2", "--handle", "web/{n}"), 1, `handle "web/1" is already in use by sandbox `+byHandle["web/1"])
	if after := ids(t, proc(t, root, "ls", "-q"), "ls"); !slices.Equal(after, before) {
		t.Fatalf("a refused fork left sandboxes: %v, before %v", after, before)
	}
	// One child, the template's {n} is 1.
	var one []jsonSandbox
	json.Unmarshal([]byte(mustOK(t, proc(t, root, "fork", "web", "--handle", "solo-{n}", "--no-wait", "--json"), "fork").stdout), &one)
	if len(one) != 1 || one[0].Handle != "solo-1" {
		t.Fatalf("fork --handle solo-{n}: %+v", one)
	}

	snap := strings.TrimSpace(mustOK(t, proc(t, root, "snapshot", "web"), "snapshot").stdout)
	wantFailure(t, proc(t, root, "restore", snap, "--handle", "web/2"), 1, `handle "web/2" is already in use by sandbox `+byHandle["web/2"])
	var restored jsonSandbox
	if err := json.Unmarshal([]byte(mustOK(t, proc(t, root, "restore", snap, "--handle", "web/restored", "--no-wait", "--json"), "restore").stdout), &restored); err != nil || restored.Handle != "web/restored" {
		t.Fatalf("restore --handle: %v %+v", err, restored)
	}
	if got := inspectJSON(t, root, "web/restored").ID; got != restored.ID {
		t.Fatalf("web/restored names %s, want %s", got, restored.ID)
	}
}
