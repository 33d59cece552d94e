package main

import (
	"encoding/json"
	"maps"
	"slices"
	"strings"
	"testing"

	"github.com/nexus-sandbox/nexus/internal/testutil"
)

// ids is the -q output of a listing, sorted.
func ids(t *testing.T, r result, what string) []string {
	t.Helper()
	out := strings.Fields(mustOK(t, r, what).stdout)
	slices.Sort(out)
	return out
}

func sorted(s ...string) []string { slices.Sort(s); return s }

func firstLine(s string) string { line, _, _ := strings.Cut(s, "\n"); return line }

// TestLabelsAndFilters: --label is journaled with what create, fork,
// restore and volume create make and shown by inspect and --json; ls,
// volume ls and snapshot ls list only what matches every --filter; a bad
// label or filter is a usage error naming what is valid.
func TestLabelsAndFilters(t *testing.T) {
	testutil.StartsSandboxes(t)
	t.Parallel()
	root, image := shortRoot(t), makeImage(t)

	wantFailure(t, proc(t, root, "create", "--image", image, "--label", "team"), 2, `--label "team": want KEY=VALUE`)
	wantFailure(t, proc(t, root, "create", "--image", image, "--label", "a=1", "--label", "a=2"), 2, `--label "a" given twice`)
	wantFailure(t, proc(t, root, "volume", "create", "v", "--size", "8M", "--label", "-x=1"), 2, `--label "-x=1": the key is`)

	web := createJSON(t, root, "--image", image, "--handle", "web1", "--label", "team=web", "--label", "tier=front")
	if !maps.Equal(web.Labels, map[string]string{"team": "web", "tier": "front"}) {
		t.Fatalf("create --json labels = %v", web.Labels)
	}
	if got := inspectJSON(t, root, "web1").Labels; !maps.Equal(got, web.Labels) {
		t.Fatalf("inspect labels = %v", got)
	}
	db := createJSON(t, root, "--image", image, "--label", "team=db")
	bare := createJSON(t, root, "--image", image)
	mustOK(t, proc(t, root, "stop", db.ID, bare.ID), "stop")

	ls := func(filters ...string) []string {
		args := []string{"ls", "-q"}
		for _, f := range filters {
			args = append(args, "--filter", f)
		}
		return ids(t, proc(t, root, args...), "ls "+strings.Join(filters, " "))
	}
	for _, c := range []struct {
		filters []string
		want    []string
	}{
		{nil, sorted(web.ID, db.ID, bare.ID)},
		{[]string{"label=team=web"}, []string{web.ID}},
		{[]string{"label=team"}, sorted(web.ID, db.ID)},
		{[]string{"label=team", "state=stopped"}, []string{db.ID}},
		{[]string{"state=stopped"}, sorted(db.ID, bare.ID)},
		{[]string{"handle=web1"}, []string{web.ID}},
		{[]string{"driver=process", "label=tier=front"}, []string{web.ID}},
		{[]string{"driver=qemu"}, nil},
		{[]string{"ready=true"}, []string{web.ID}},
		{[]string{"ready=false", "label=team"}, []string{db.ID}},
	} {
		if got := ls(c.filters...); !slices.Equal(got, c.want) {
			t.Errorf("ls --filter %q = %v, want %v", c.filters, got, c.want)
		}
	}
	// --limit counts what the filter lets through.
	if got := ids(t, proc(t, root, "ls", "-q", "--limit", "1", "--filter", "state=stopped"), "ls --limit"); len(got) != 1 || got[0] == web.ID {
		t.Errorf("ls --limit 1 --filter state=stopped = %v", got)
	}
	var listed []jsonSandbox
	if err := json.Unmarshal([]byte(mustOK(t, proc(t, root, "ls", "--json", "--filter", "label=tier"), "ls --json").stdout), &listed); err != nil || len(listed) != 1 || listed[0].Labels["team"] != "web" {
		t.Fatalf("ls --json --filter label=tier: %v %+v", err, listed)
	}
	// The table shows a LABELS column only when a row has labels; --format
	// prints them as the table does.
	if out := mustOK(t, proc(t, root, "ls"), "ls").stdout; !strings.Contains(firstLine(out), "LABELS") || !strings.Contains(out, "team=web,tier=front") {
		t.Errorf("ls with labelled sandboxes shows no LABELS column:\n%s", out)
	}
	if out := mustOK(t, proc(t, root, "ls", "--filter", "handle=web1", "--format", "{{labels .Labels}}"), "ls --format").stdout; out != "team=web,tier=front\n" {
		t.Errorf("ls --format '{{labels .Labels}}' = %q", out)
	}
	if out := mustOK(t, proc(t, root, "ls", "--filter", "state=stopped", "--filter", "label=team=web"), "ls").stdout; strings.Contains(out, "LABELS") {
		t.Errorf("ls of no labelled sandbox shows a LABELS column:\n%s", out)
	}
	if out := mustOK(t, proc(t, root, "ls", "--filter", "driver=qemu"), "ls").stdout; strings.Contains(out, "LABELS") {
		t.Errorf("an empty ls shows a LABELS column:\n%s", out)
	}
	wantFailure(t, proc(t, root, "ls", "--filter", "name=web1"), 2, `--filter "name=web1": the key is one of label, state, handle, driver or ready`)
	wantFailure(t, proc(t, root, "ls", "--filter", "state=up"), 2, "the state is one of")

	mustOK(t, proc(t, root, "volume", "create", "v1", "--size", "8M", "--label", "team=web"), "volume create")
	mustOK(t, proc(t, root, "volume", "create", "v2", "--size", "8M"), "volume create")
	if got := ids(t, proc(t, root, "volume", "ls", "-q", "--filter", "label=team=web"), "volume ls"); !slices.Equal(got, []string{"v1"}) {
		t.Errorf("volume ls --filter label=team=web = %v", got)
	}
	var vols []struct {
		Name   string            `json:"name"`
		Labels map[string]string `json:"labels"`
	}
	if err := json.Unmarshal([]byte(mustOK(t, proc(t, root, "volume", "ls", "--json"), "volume ls --json").stdout), &vols); err != nil || len(vols) != 2 || vols[0].Labels["team"] != "web" || vols[1].Labels != nil {
		t.Fatalf("volume ls --json: %v %+v", err, vols)
	}
	if out := mustOK(t, proc(t, root, "volume", "ls"), "volume ls").stdout; !strings.Contains(firstLine(out), "LABELS") || !strings.Contains(out, "team=web") {
		t.Errorf("volume ls with a labelled volume shows no LABELS column:\n%s", out)
	}
	if out := mustOK(t, proc(t, root, "volume", "ls", "--filter", "label=none"), "volume ls").stdout; strings.Contains(out, "LABELS") {
		t.Errorf("volume ls of no labelled volume shows a LABELS column:\n%s", out)
	}
	wantFailure(t, proc(t, root, "volume", "ls", "--filter", "state=running"), 2, "the key is one of label")

	snap := strings.TrimSpace(mustOK(t, proc(t, root, "snapshot", db.ID), "snapshot").stdout)
	mustOK(t, proc(t, root, "snapshot", bare.ID), "snapshot")
	if got := ids(t, proc(t, root, "snapshot", "ls", "-q", "--filter", "label=team=db"), "snapshot ls"); !slices.Equal(got, []string{snap}) {
		t.Errorf("snapshot ls --filter label=team=db = %v, want %s", got, snap)
	}
	if out := mustOK(t, proc(t, root, "snapshot", "ls"), "snapshot ls").stdout; !strings.Contains(firstLine(out), "LABELS") || !strings.Contains(out, "team=db") {
		t.Errorf("snapshot ls of a labelled sandbox's snapshot shows no LABELS column:\n%s", out)
	}
	wantFailure(t, proc(t, root, "snapshot", "ls", "--filter", "driver=process"), 2, "the key is one of label or handle")

	// A restored sandbox and a fork child have the labels their command
	// gave, not their source's.
	var restored jsonSandbox
	json.Unmarshal([]byte(mustOK(t, proc(t, root, "restore", snap, "--no-wait", "--json", "--label", "from=snap"), "restore").stdout), &restored)
	if !maps.Equal(restored.Labels, map[string]string{"from": "snap"}) {
		t.Errorf("restore --label: labels %v", restored.Labels)
	}
	var children []jsonSandbox
	json.Unmarshal([]byte(mustOK(t, proc(t, root, "fork", db.ID, "--no-wait", "--json", "--label", "role=child"), "fork").stdout), &children)
	if len(children) != 1 || !maps.Equal(children[0].Labels, map[string]string{"role": "child"}) {
		t.Errorf("fork --label: %+v", children)
	}
	if got := ls("label=team=db"); !slices.Equal(got, []string{db.ID}) {
		t.Errorf("ls --filter label=team=db after fork and restore = %v", got)
	}
}
