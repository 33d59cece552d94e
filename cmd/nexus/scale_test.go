package main

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/oklog/ulid/v2"

	"github.com/nexus-sandbox/nexus/control"
	"github.com/nexus-sandbox/nexus/events"
	"github.com/nexus-sandbox/nexus/node"
)

// fillRoot journals n committed sandboxes (two disk resources each, no files
// behind them) into root, as a root that has been used for a long time.
func fillRoot(t testing.TB, root string, n int) {
	t.Helper()
	ctx := context.Background()
	nd, err := node.Open(ctx, root, node.Options{})
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

// TestSingleSandboxCommandsAreConstantCost is issue 21's structural O(1)
// test, counted rather than timed: on a root of 2,000 sandboxes, each
// single-sandbox command through the daemon makes the daemon encode a
// bounded number of sandbox records (control.Stats), however many the root
// holds. A flow that fetched the sandbox list, or the image cache's list of
// every user, would encode all 2,000.
func TestSingleSandboxCommandsAreConstantCost(t *testing.T) {
	const sandboxes = 2000
	// A command touches its own sandbox a few times (lookup, decide, re-read
	// after its saga, record); nothing near the root's size.
	const bound = 16
	root := shortRoot(t)
	fillRoot(t, root, sandboxes)
	startDaemon(t, root)
	c := control.NewClient(filepath.Join(root, control.SocketName))
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
	steps := []struct {
		name string
		args []string
	}{
		{"create", []string{"create", "--image", image, "--handle", "one"}},
		{"inspect", []string{"inspect", "one"}},
		{"stop", []string{"stop", "one"}},
		{"start", []string{"start", "one"}},
		{"snapshot", []string{"snapshot", "one"}},
		{"fork", []string{"fork", "one"}},
		{"rm", []string{"rm", "-f", "--with-snapshots", "one"}},
	}
	for _, s := range steps {
		before := served()
		mustOK(t, proc(t, root, s.args...), s.name)
		if d := served() - before; d > bound {
			t.Errorf("%s of one sandbox made the daemon encode %d sandbox records (root of %d; bound %d)", s.name, d, sandboxes, bound)
		} else {
			t.Logf("%s: %d sandbox records encoded", s.name, d)
		}
	}
	// The counter counts: a listing encodes every sandbox.
	before := served()
	mustOK(t, nexus(t, root, "ls"), "ls")
	if d := served() - before; d < sandboxes {
		t.Fatalf("ls encoded %d sandbox records, want at least %d: the counter does not count", d, sandboxes)
	}
}
