package main

import (
	"context"
	"encoding/json"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/oklog/ulid/v2"

	"github.com/nexus-sandbox/nexus/events"
	"github.com/nexus-sandbox/nexus/host/journal"
	"github.com/nexus-sandbox/nexus/projections"
)

// Creates of one handle at once, one of them stalled between its decision
// (the handle was free) and its first write: exactly one commits, every
// other is refused, the stalled one naming the winner, and nothing of the
// refused ones is left on disk or open in the journal. A fork child and a
// restore named with the taken handle are refused the same way.
func TestCreatesOfOneHandleAtOnce(t *testing.T) {
	t.Parallel()
	root := shortRoot(t)
	image := makeImage(t)
	startDaemon(t, root)

	stalled := pauseAt(t, root, "create.decided", "create", "--image", image, "--handle", "d9")
	const others = 5
	results := make([]result, others)
	var wg sync.WaitGroup
	for i := range results {
		wg.Add(1)
		go func() {
			defer wg.Done()
			results[i] = proc(t, root, "create", "--image", image, "--handle", "d9")
		}()
	}
	wg.Wait()
	stalledCode := stalled.resume(t, 0)

	var holders []jsonSandbox
	for _, sb := range sandboxes(t, root) {
		if sb.Handle == "d9" {
			holders = append(holders, sb)
		}
	}
	if len(holders) != 1 {
		t.Fatalf("%d sandboxes hold d9, want 1: %+v", len(holders), holders)
	}
	winner := holders[0].ID
	committed := 0
	for i, r := range results {
		if r.code == 0 {
			committed++
			continue
		}
		wantFailure(t, r, 1, "d9")
		// Refused by the winner's commit (naming it) or, while a create of
		// d9 was in flight, by its intent (naming that create's sandbox).
		if !strings.Contains(r.stderr, winner) && !strings.Contains(r.stderr, "in flight") {
			t.Errorf("create %d refused without naming the winner %s: %s", i, winner, r.stderr)
		}
	}
	if committed != 1 {
		t.Fatalf("%d of the concurrent creates committed, want 1", committed)
	}
	if stalledCode != 1 || !strings.Contains(stalled.stderr.String(), "held by sandbox "+winner) {
		t.Fatalf("stalled create: exit %d, stderr %q; want 1 naming the winner %s", stalledCode, stalled.stderr, winner)
	}
	journalMatchesDisk(t, root)

	// A fork child and a restore named d9 are refused; named otherwise they
	// take their handle.
	mustOK(t, proc(t, root, "stop", winner), "stop")
	wantFailure(t, proc(t, root, "fork", winner, "--handle", "d9"), 1, "already in use by sandbox "+winner)
	snap := strings.TrimSpace(mustOK(t, proc(t, root, "snapshot", winner), "snapshot").stdout)
	wantFailure(t, proc(t, root, "restore", snap, "--handle", "d9"), 1, "already in use by sandbox "+winner)
	wantFailure(t, proc(t, root, "fork", winner, "--handle", "x", "--count", "2"), 2, `--handle "x" names one child`)
	var child []projections.Sandbox
	json.Unmarshal([]byte(mustOK(t, proc(t, root, "fork", winner, "--handle", "d9-fork", "--json"), "fork").stdout), &child)
	var restored projections.Sandbox
	json.Unmarshal([]byte(mustOK(t, proc(t, root, "restore", snap, "--handle", "d9-restored", "--json"), "restore").stdout), &restored)
	if len(child) != 1 || child[0].Handle != "d9-fork" || restored.Handle != "d9-restored" {
		t.Fatalf("fork child %+v, restored %+v: want handles d9-fork, d9-restored", child, restored)
	}
	journalMatchesDisk(t, root)
}

// replay verify reports a journal in which two live sandboxes hold one
// handle, written by hand (no nexus would).
func TestReplayVerifyReportsAShareHandle(t *testing.T) {
	t.Parallel()
	root := shortRoot(t)
	mustOK(t, nexus(t, root, "ls"), "ls") // makes the state root and its journal
	stopDaemons(root)
	j, err := journal.Open(context.Background(), journal.Options{Dir: filepath.Join(root, "journal")})
	if err != nil {
		t.Fatal(err)
	}
	a, b := ulid.Make().String(), ulid.Make().String()
	for _, e := range []events.Event{
		events.New(ulid.Make(), time.Now(), a, events.SandboxCreatedEvent{Handle: "d9", Image: "img", Driver: "process"}),
		events.New(ulid.Make(), time.Now(), b, events.SandboxCreatedEvent{Handle: "d9", Image: "img", Driver: "process"}),
	} {
		data, err := events.Encode(e)
		if err != nil {
			t.Fatal(err)
		}
		subject, _ := e.Subject()
		if _, err := j.Append(context.Background(), journal.Message{Subject: subject, ID: e.DedupID(), Data: data}); err != nil {
			t.Fatal(err)
		}
	}
	if err := j.Close(); err != nil {
		t.Fatal(err)
	}
	r := nexus(t, root, "replay", "verify")
	if r.code != 1 || !strings.Contains(r.stdout, "handles held by two live sandboxes: 1") || !strings.Contains(r.stdout, b) {
		t.Fatalf("replay verify of two live sandboxes named d9: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
}
