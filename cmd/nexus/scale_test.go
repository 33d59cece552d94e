package main

import (
	"context"
	"encoding/json"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/oklog/ulid/v2"

	"github.com/nexus-sandbox/nexus/control"
	"github.com/nexus-sandbox/nexus/control/wire"
	"github.com/nexus-sandbox/nexus/events"
	"github.com/nexus-sandbox/nexus/internal/testutil"
	"github.com/nexus-sandbox/nexus/projections"
	"github.com/nexus-sandbox/nexus/store"
)

// fillRoot journals n committed sandboxes (two disk resources each, no files
// behind them) into root, as a root that has been used for a long time.
func fillRoot(t testing.TB, root string, n int) {
	t.Helper()
	ctx := context.Background()
	nd, err := store.Open(ctx, root, store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	for from := 0; from < n; from += 500 {
		evs := make([]events.Event, min(500, n-from))
		for i := range evs {
			id := ulid.Make().String()
			evs[i] = events.New(ulid.Make(), time.Now(), id, events.SandboxCreatedEvent{
				Image: "filler", Driver: "process",
				Resources: []events.Resource{{Kind: events.KindRawDisk, Path: "disks/" + id + ".raw"}, {Kind: events.KindRawDisk, Path: "disks/" + id + "-workspace.ext4"}},
			})
		}
		if _, err := nd.Append(ctx, evs...); err != nil {
			t.Fatal(err)
		}
	}
	if err := nd.Close(); err != nil {
		t.Fatal(err)
	}
}

// TestSingleSandboxCommandsAreConstantCost is the structural O(1) test,
// counted rather than timed: on a root of 2,000 sandboxes, each
// single-sandbox command through the daemon (restore and snapshot rm of one
// snapshot, by its ID or by a prefix of its ID or short ID, and completing
// a full ID or a prefix, included) makes the daemon encode a
// bounded number of sandbox records (wire.Stats), however many the root
// holds. A flow that fetched the sandbox list, or the image cache's list of
// every user, would encode all 2,000.
func TestSingleSandboxCommandsAreConstantCost(t *testing.T) {
	testutil.StartsSandboxes(t)
	const sandboxes = 2000
	// A command touches its own sandbox a few times (lookup, decide, re-read
	// after its saga, record); nothing near the root's size.
	const bound = 16
	root := shortRoot(t)
	fillRoot(t, root, sandboxes)
	startDaemon(t, root)
	c := control.NewClient(filepath.Join(root, wire.SocketName))
	defer c.Close()
	ctx := context.Background()
	served := func() int64 {
		t.Helper()
		st, err := c.Stats(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return st.Sandboxes
	}
	image := makeImage(t)
	var snap, restored, restoredByPrefix, forked string
	steps := []struct {
		name string
		args func() []string
	}{
		{"create", func() []string { return []string{"create", "--image", image, "--handle", "one"} }},
		{"inspect", func() []string { return []string{"inspect", "one"} }},
		{"stop", func() []string { return []string{"stop", "one"} }},
		{"start", func() []string { return []string{"start", "one"} }},
		{"snapshot", func() []string { return []string{"snapshot", "one"} }},
		{"restore", func() []string { return []string{"restore", snap, "-q"} }},
		{"completion of a snapshot ID", func() []string { return []string{"__complete", "restore", snap} }},
		{"completion of a snapshot ID's prefix", func() []string { return []string{"__complete", "restore", strings.ToLower(snap[:len(snap)-2])} }},
		{"snapshot rm --dry-run by a prefix", func() []string {
			return []string{"snapshot", "rm", "--dry-run", strings.ToLower(snap[:len(snap)-2])}
		}},
		{"snapshot rm --dry-run by a short ID", func() []string { return []string{"snapshot", "rm", "--dry-run", projections.ShortID(snap)} }},
		{"restore by a prefix of a short ID", func() []string { return []string{"restore", projections.ShortID(snap)[:8], "-q"} }},
		{"completion of a sandbox ID", func() []string { return []string{"__complete", "inspect", restored} }},
		{"fork", func() []string { return []string{"fork", "one"} }},
		{"snapshot rm --dry-run", func() []string { return []string{"snapshot", "rm", "--dry-run", strings.ToLower(snap)} }},
		{"snapshot rm", func() []string { return []string{"snapshot", "rm", snap} }},
		{"rm", func() []string { return []string{"rm", "-f", "--with-snapshots", "one"} }},
	}
	for _, s := range steps {
		before := served()
		r := mustOK(t, proc(t, root, s.args()...), s.name)
		switch s.name {
		case "snapshot":
			snap = strings.TrimSpace(r.stdout)
		case "restore":
			restored = strings.TrimSpace(r.stdout)
		case "restore by a prefix of a short ID":
			restoredByPrefix = strings.TrimSpace(r.stdout)
		case "completion of a snapshot ID's prefix":
			if want := snap + "\t"; !strings.HasPrefix(r.stdout, want) {
				t.Errorf("%s offered %q, want %s first", s.name, r.stdout, want)
			}
		case "snapshot rm --dry-run by a prefix", "snapshot rm --dry-run by a short ID":
			if !strings.Contains(r.stdout, "would remove snapshot "+snap) {
				t.Errorf("%s printed %q, want it to name %s", s.name, r.stdout, snap)
			}
		case "fork":
			forked = strings.Fields(r.stdout)[0]
		case "completion of a snapshot ID", "completion of a sandbox ID":
			// Each offers the one thing typed in full, found per entity.
			if want := s.args()[2] + "\t"; !strings.HasPrefix(r.stdout, want) {
				t.Errorf("%s offered %q, want %s first", s.name, r.stdout, want)
			}
		}
		if d := served() - before; d > bound {
			t.Errorf("%s of one sandbox made the daemon encode %d sandbox records (root of %d; bound %d)", s.name, d, sandboxes, bound)
		} else {
			t.Logf("%s: %d sandbox records encoded", s.name, d)
		}
	}
	mustOK(t, proc(t, root, "rm", "-f", forked, restored, restoredByPrefix), "rm of the fork and restore children")
	// The counter counts: a listing encodes every sandbox.
	before := served()
	mustOK(t, nexus(t, root, "ls"), "ls")
	if d := served() - before; d < sandboxes {
		t.Fatalf("ls encoded %d sandbox records, want at least %d: the counter does not count", d, sandboxes)
	}
}

// TestLsPages: ls reads the sandboxes a page at a time, through the daemon
// (no answer holds more than a page, wire.Stats) and without one, and
// prints every sandbox once, in ID order, the same either way; --limit
// and --after page by hand.
func TestLsPages(t *testing.T) {
	const sandboxes = 1234
	root := shortRoot(t)
	fillRoot(t, root, sandboxes)
	local := nexusEnv(t, root, []string{"NEXUS_NO_AUTO_DAEMON=1"}, "ls", "--json")
	mustOK(t, local, "ls without a daemon")
	var all []jsonSandbox
	if err := json.Unmarshal([]byte(local.stdout), &all); err != nil {
		t.Fatalf("ls --json: %v", err)
	}
	if len(all) != sandboxes || !slices.IsSortedFunc(all, func(a, b jsonSandbox) int { return strings.Compare(a.ID, b.ID) }) {
		t.Fatalf("ls --json printed %d sandboxes (sorted: %v), want %d in ID order", len(all), slices.IsSortedFunc(all, func(a, b jsonSandbox) int { return strings.Compare(a.ID, b.ID) }), sandboxes)
	}
	text := mustOK(t, nexusEnv(t, root, []string{"NEXUS_NO_AUTO_DAEMON=1"}, "ls"), "ls")
	if rows := strings.Count(text.stdout, "\n"); rows != sandboxes+1 {
		t.Fatalf("ls printed %d lines, want a header and %d rows", rows, sandboxes)
	}

	startDaemon(t, root)
	c := control.NewClient(filepath.Join(root, wire.SocketName))
	defer c.Close()
	viaDaemon := mustOK(t, nexus(t, root, "ls", "--json"), "ls through the daemon")
	if viaDaemon.stdout != local.stdout {
		t.Fatalf("ls --json through the daemon differs from ls without one")
	}
	mustOK(t, nexus(t, root, "ls"), "ls through the daemon")
	st, err := c.Stats(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if st.MostInOneAnswer > 500 || st.Sandboxes < sandboxes {
		t.Fatalf("ls through the daemon: %d records in its largest answer (want a page, at most 500), %d in all", st.MostInOneAnswer, st.Sandboxes)
	}

	page := mustOK(t, nexus(t, root, "ls", "--json", "--limit", "10"), "ls --limit")
	var first []jsonSandbox
	json.Unmarshal([]byte(page.stdout), &first)
	next := mustOK(t, nexus(t, root, "ls", "--json", "--limit", "10", "--after", strings.ToLower(first[9].ID)), "ls --after")
	var second []jsonSandbox
	json.Unmarshal([]byte(next.stdout), &second)
	if len(first) != 10 || len(second) != 10 || first[0].ID != all[0].ID || second[0].ID != all[10].ID || second[9].ID != all[19].ID {
		t.Fatalf("--limit 10 then --after: %d and %d sandboxes, not ls's first 20 in order", len(first), len(second))
	}
	wantFailure(t, nexus(t, root, "ls", "--limit", "-1"), 2, "--limit")
}

// TestLsJSONCopiesStoredRecords: `ls --json` of a root of stopped
// sandboxes (testfill's, with snapshots and volumes) and one whose VMM was
// killed prints what the decoding path prints (`--filter driver=process`,
// every sandbox here), through the daemon and without one, while the
// daemon decodes no stored record but the one that records a process: the
// listing is the store's bytes copied, not each record decoded and
// encoded again. The filtered listing decoding every record shows the
// counter counts.
func TestLsJSONCopiesStoredRecords(t *testing.T) {
	testutil.StartsSandboxes(t)
	const sandboxes = 1200
	root := shortRoot(t)
	noDaemon := []string{"NEXUS_NO_AUTO_DAEMON=1"}
	mustOK(t, nexusEnv(t, root, noDaemon, "testfill", "--sandboxes", strconv.Itoa(sandboxes)), "testfill")
	id := strings.TrimSpace(mustOK(t, nexusEnv(t, root, noDaemon, "--driver", "process", "create", "--image", makeImage(t), "-q"), "create").stdout)
	sb := inspectJSON(t, root, id)
	if sb.VMM == nil {
		t.Fatalf("running sandbox %s records no VMM", id)
	}
	if err := syscall.Kill(sb.VMM.Pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	testutil.WaitUntil(t, 30*time.Second, "shown exited after its VMM was killed", func() bool {
		return inspectJSON(t, root, id).State == projections.StateExited
	})
	local := mustOK(t, nexusEnv(t, root, noDaemon, "ls", "--json"), "ls --json without a daemon")
	decodedPath := mustOK(t, nexusEnv(t, root, noDaemon, "ls", "--json", "--filter", "driver=process"), "ls --json --filter")
	if local.stdout != decodedPath.stdout {
		t.Fatalf("ls --json differs from the decoding path's listing of the same sandboxes:\n%.600s\nwant\n%.600s", local.stdout, decodedPath.stdout)
	}
	var all []jsonSandbox
	if err := json.Unmarshal([]byte(local.stdout), &all); err != nil || len(all) != sandboxes+1 {
		t.Fatalf("ls --json: %d sandboxes (%v), want %d", len(all), err, sandboxes+1)
	}
	if got := all[len(all)-1]; got.ID != id || got.State != projections.StateExited {
		t.Fatalf("ls --json lists %s as %s, want %s exited (its VMM was killed)", got.ID, got.State, id)
	}

	startDaemon(t, root)
	c := control.NewClient(filepath.Join(root, wire.SocketName))
	defer c.Close()
	decoded := func() uint64 {
		t.Helper()
		st, err := c.Stats(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		return st.Decoded
	}
	before := decoded()
	viaDaemon := mustOK(t, nexus(t, root, "ls", "--json"), "ls --json through the daemon")
	if d := decoded() - before; d > 1 {
		t.Errorf("ls --json of %d stopped sandboxes and one exited made the daemon decode %d stored records, want at most the one that records a process", sandboxes, d)
	}
	if viaDaemon.stdout != local.stdout {
		t.Fatalf("ls --json through the daemon differs from ls without one")
	}
	before = decoded()
	mustOK(t, nexus(t, root, "ls", "--json", "--filter", "driver=process"), "ls --json --filter through the daemon")
	if d := decoded() - before; d < sandboxes {
		t.Fatalf("the filtered listing decoded %d stored records, want at least %d: the counter does not count", d, sandboxes)
	}
}
