package main

import (
	"bufio"
	"encoding/json"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nexus-sandbox/nexus/internal/testutil"
)

type eventRow struct {
	Seq     uint64 `json:"seq"`
	Type    string `json:"type"`
	Sandbox string `json:"sandbox"`
}

func eventRows(t *testing.T, root string, args ...string) []eventRow {
	t.Helper()
	r := mustOK(t, nexus(t, root, append([]string{"events", "--all", "--json"}, args...)...), "events "+strings.Join(args, " "))
	var out []eventRow
	sc := bufio.NewScanner(strings.NewReader(r.stdout))
	for sc.Scan() {
		var e eventRow
		if err := json.Unmarshal(sc.Bytes(), &e); err != nil {
			t.Fatalf("events --json line %q: %v", sc.Text(), err)
		}
		out = append(out, e)
	}
	return out
}

func seqs(rows []eventRow) []uint64 {
	out := make([]uint64, len(rows))
	for i, r := range rows {
		out[i] = r.Seq
	}
	return out
}

// TestEventsSelectByPositionTimeAgeHandleAndTypes: every way of naming a
// position selects the events it names, and nothing else.
func TestEventsSelectByPositionTimeAgeHandleAndTypes(t *testing.T) {
	testutil.StartsSandboxes(t)
	t.Parallel()
	root, image := shortRoot(t), makeImage(t)
	mustOK(t, nexus(t, root, "demo"), "demo")
	demo := eventRows(t, root)[0].Sandbox
	web := createJSON(t, root, "--image", image, "--handle", "web")
	all := eventRows(t, root)
	last := all[len(all)-1].Seq

	if got := seqs(eventRows(t, root, "--tail", "3")); len(got) != 3 || got[2] != last || got[0] != last-2 {
		t.Fatalf("--tail 3 = %v, journal ends at %d", got, last)
	}
	if got := seqs(eventRows(t, root, "--since", "3", "--until", "5")); len(got) != 3 || got[0] != 3 || got[2] != 5 {
		t.Fatalf("--since 3 --until 5 = %v", got)
	}
	byHandle := eventRows(t, root, "--sandbox", "web")
	byID := eventRows(t, root, "--sandbox", strings.ToLower(web.ID))
	if len(byHandle) == 0 || len(byHandle) != len(byID) {
		t.Fatalf("--sandbox web: %d events, by id %d", len(byHandle), len(byID))
	}
	for _, e := range byHandle {
		if e.Sandbox != web.ID {
			t.Fatalf("--sandbox web printed an event of %q", e.Sandbox)
		}
	}
	if got := eventRows(t, root, "--sandbox", "web", "--tail", "1"); len(got) != 1 || got[0] != byHandle[len(byHandle)-1] {
		t.Fatalf("--sandbox web --tail 1 = %+v", got)
	}
	var want []uint64
	for _, e := range all {
		if e.Sandbox == demo && (e.Type == "saga.started" || strings.HasPrefix(e.Type, "sandbox.")) {
			want = append(want, e.Seq)
		}
	}
	got := seqs(eventRows(t, root, "--sandbox", demo, "--type", "saga.started", "--type", "sandbox", "--type", "sandbox.created"))
	if len(want) < 3 || !slices.Equal(got, want) {
		t.Fatalf("two types and a category = %v, want %v", got, want)
	}
	if got := eventRows(t, root, "--since", "1h"); len(got) != len(all) {
		t.Fatalf("--since 1h printed %d of %d events", len(got), len(all))
	}
	if got := eventRows(t, root, "--until", "1h"); len(got) != 0 {
		t.Fatalf("--until 1h printed %d events written seconds ago", len(got))
	}
	if got := eventRows(t, root, "--since", time.Now().Add(time.Hour).UTC().Format(time.RFC3339)); len(got) != 0 {
		t.Fatalf("--since a future time printed %d events", len(got))
	}
	if got := eventRows(t, root, "--until", time.Now().Add(time.Hour).UTC().Format(time.RFC3339), "--tail", "2"); len(got) != 2 || got[1].Seq != last {
		t.Fatalf("--until a future time --tail 2 = %+v", got)
	}
	wantFailure(t, nexus(t, root, "events", "--sandbox", "nosuch"), 1, `no sandbox "nosuch"`)
}
