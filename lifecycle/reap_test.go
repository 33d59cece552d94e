package lifecycle

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/oklog/ulid/v2"

	"github.com/nexus-sandbox/nexus/events"
	"github.com/nexus-sandbox/nexus/host/proc"
	"github.com/nexus-sandbox/nexus/internal/testutil"
	"github.com/nexus-sandbox/nexus/layout"
)

// localManager is a Manager on a fresh short root (testutil.ShortRoot:
// its processes never outlive the test) with its own in-memory journal:
// the reaper's and recover's tests drive them in process, without the
// binary.
func localManager(t *testing.T) (*Manager, string) {
	t.Helper()
	root := testutil.ShortRoot(t)
	return &Manager{Root: layout.Root(root), B: newMemJournal()}, root
}

// A detached supervisor the journal recorded for a sandbox that is
// gone is killed by reap --apply, but only when its pid AND start time
// still match; a process under a recorded pid with another start time is
// someone else and is left alone (and, naming the sandbox, keeps its state).
func TestReapKillsOrphanedSupervisorOnlyOnIdentityMatch(t *testing.T) {
	ctx := context.Background()
	m, root := localManager(t)
	spawn := func(id string) proc.Identity {
		t.Helper()
		dir := filepath.Join(root, "supervisors", id)
		if err := os.MkdirAll(dir, 0o700); err != nil {
			t.Fatal(err)
		}
		os.WriteFile(filepath.Join(dir, "mitm-ca.pem"), []byte("key"), 0o600)
		// The test binary idling (TestMain), not a shell running sleep: a
		// shell's child names the sandbox too until it execs, and a reap
		// that sees it (a busy host can make that window long) rightly keeps
		// the state dir live.
		who, err := proc.SpawnDetached([]string{os.Args[0], "idle", "supervisor", "--sandbox", id, "--state-dir", dir}, nil, filepath.Join(root, id+".log"))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { proc.Terminate(who, time.Second) })
		return who
	}
	record := func(id string, who proc.Identity) {
		t.Helper()
		for _, p := range []events.Payload{
			events.SandboxCreatedEvent{Image: "img", Driver: "process"},
			events.SupervisorStartedEvent{Pid: who.Pid, Start: who.StartTicks, Socket: "supervisors/" + id + "/supervisor.sock", StateDir: events.Resource{Kind: events.KindSupervisorState, Path: "supervisors/" + id}},
			events.SandboxRemovedEvent{}, // removed without the supervisor ever stopping
		} {
			if _, err := m.B.Append(ctx, events.New(ulid.Make(), time.Now(), id, p)); err != nil {
				t.Fatal(err)
			}
		}
	}
	orphan, reused := ulid.Make().String(), ulid.Make().String()
	orphanWho := spawn(orphan)
	record(orphan, orphanWho)
	reusedWho := spawn(reused)
	record(reused, proc.Identity{Pid: reusedWho.Pid, StartTicks: reusedWho.StartTicks + 1})

	dry := reapSettled(t, m, ReapOptions{})
	var sawProc bool
	for _, o := range dry.Orphans {
		if o.Kind == events.KindSupervisorProcess {
			sawProc = o.Owner == orphan
		}
	}
	if !sawProc {
		t.Fatalf("dry run did not list the orphaned supervisor: %+v", dry.Orphans)
	}
	if alive, _ := proc.Alive(orphanWho); !alive {
		t.Fatal("dry run killed a process")
	}

	rep := reapSettled(t, m, ReapOptions{Apply: true})
	if len(rep.Failed) != 0 {
		t.Fatalf("failed: %+v", rep.Failed)
	}
	if alive, _ := proc.Alive(orphanWho); alive {
		t.Fatal("orphaned supervisor with matching pid and start time survived")
	}
	if _, err := os.Lstat(filepath.Join(root, "supervisors", orphan)); !os.IsNotExist(err) {
		t.Fatalf("the killed supervisor's state dir was not reclaimed in the same pass (orphan supervisor pid %d, reused %d): kept %+v", orphanWho.Pid, reusedWho.Pid, rep.Kept)
	}
	if alive, _ := proc.Alive(reusedWho); !alive {
		t.Fatal("a process whose start time does not match the record was killed")
	}
	if _, err := os.Lstat(filepath.Join(root, "supervisors", reused)); err != nil {
		t.Fatal("state dir named by a live process was deleted")
	}
	var kept bool
	for _, k := range rep.Kept {
		if k.Path == filepath.Join(root, "supervisors", reused) && k.Verdict == "live" {
			kept = true
		}
	}
	if !kept {
		t.Fatalf("state dir of %s not kept live: %+v", reused, rep.Kept)
	}
	// Nothing left to do.
	again, err := m.Reap(ctx, ReapOptions{Apply: true})
	if err != nil || len(again.Deleted) != 0 {
		t.Fatalf("second pass deleted %+v (%v)", again.Deleted, err)
	}
}

// reapSettled runs m.Reap until no entry is kept only because its /proc
// scan was inconclusive (testutil.ReapUntilConclusive), and returns that
// run, with what earlier runs deleted (and its Allocated, for an apply)
// carried over.
func reapSettled(t *testing.T, m *Manager, o ReapOptions) ReapReport {
	t.Helper()
	var deleted []ReapItem
	var freed int64
	var rep ReapReport
	testutil.ReapUntilConclusive(t, "reap", func() (bool, string) {
		var err error
		rep, err = m.Reap(context.Background(), o)
		if err != nil {
			t.Fatal(err)
		}
		deleted = append(deleted, rep.Deleted...)
		if o.Apply {
			freed += rep.Allocated
		}
		for _, k := range rep.Kept {
			if testutil.KeptInconclusive(string(k.Verdict), k.Reason) {
				return true, fmt.Sprintf("%+v", rep.Kept)
			}
		}
		return false, ""
	})
	rep.Deleted = deleted
	if o.Apply {
		rep.Allocated = freed
	}
	return rep
}

// A supervisor state dir whose own supervisor.sock answers is kept
// live even when nothing else names its sandbox; once the socket is gone it
// is reclaimed (its CA key with it).
func TestReapKeepsStateDirWithLiveSupervisorSocket(t *testing.T) {
	m, root := localManager(t)
	id := ulid.Make().String()
	dir := filepath.Join(root, "supervisors", id)
	os.MkdirAll(dir, 0o700)
	os.WriteFile(filepath.Join(dir, "mitm-ca.pem"), []byte("key"), 0o600)
	l, err := net.Listen("unix", filepath.Join(dir, "supervisor.sock"))
	if err != nil {
		t.Fatal(err)
	}
	rep := reapSettled(t, m, ReapOptions{Apply: true})
	if len(rep.Kept) != 1 || rep.Kept[0].Verdict != "live" || !strings.Contains(rep.Kept[0].Reason, "supervisor socket answers") {
		t.Fatalf("kept %+v deleted %+v", rep.Kept, rep.Deleted)
	}
	l.Close()
	if rep = reapSettled(t, m, ReapOptions{Apply: true}); len(rep.Deleted) != 1 {
		t.Fatalf("after the supervisor went: %+v", rep)
	}
	if _, err := os.Lstat(dir); !os.IsNotExist(err) {
		t.Fatal("state dir survived")
	}
}

// A dry run that counts the owned entries (ReapOptions.CountOwned)
// reports what one that lists them does, every owned entry counted and
// none listed: the same scan, orphans, other keeps, counts and plan.
func TestReapCountingOwnedReportsWhatListingDoes(t *testing.T) {
	ctx := context.Background()
	m, root := localManager(t)
	disks := filepath.Join(root, "disks")
	if err := os.MkdirAll(disks, 0o700); err != nil {
		t.Fatal(err)
	}
	const owned = 5
	for range owned {
		id := ulid.Make().String()
		rel := "disks/" + id + ".raw"
		if err := os.WriteFile(filepath.Join(root, rel), nil, 0o600); err != nil {
			t.Fatal(err)
		}
		p := events.SandboxCreatedEvent{Image: "img", Driver: "process", Resources: []events.Resource{{Kind: events.KindRawDisk, Path: rel}}}
		if _, err := m.B.Append(ctx, events.New(ulid.Make(), time.Now(), id, p)); err != nil {
			t.Fatal(err)
		}
	}
	orphan := filepath.Join(disks, ulid.Make().String()+".raw")
	if err := os.WriteFile(orphan, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	// Kept, and not owned: names of no sandbox's shape, in two places.
	for _, p := range []string{filepath.Join(disks, "stray.bin"), filepath.Join(root, "snapshots", "stray")} {
		if err := os.MkdirAll(filepath.Dir(p), 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, nil, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	listed := reapSettled(t, m, ReapOptions{})
	counted := reapSettled(t, m, ReapOptions{CountOwned: true})
	if listed.OwnedCounted != 0 || listed.OwnedCount() != owned {
		t.Fatalf("listing: %d counted, %d owned; want 0 and %d", listed.OwnedCounted, listed.OwnedCount(), owned)
	}
	if counted.OwnedCounted != owned || counted.OwnedCount() != owned || counted.KeptCount() != listed.KeptCount() {
		t.Fatalf("counting: %d counted, %d owned, %d kept; want %d, %d and %d",
			counted.OwnedCounted, counted.OwnedCount(), counted.KeptCount(), owned, owned, listed.KeptCount())
	}
	notOwned := func(items []ReapItem) (out []string) {
		for _, it := range items {
			if it.Owned() {
				continue
			}
			out = append(out, it.Path+" "+string(it.Verdict)+" "+it.Reason)
		}
		return out
	}
	if got, want := notOwned(counted.Kept), notOwned(listed.Kept); len(got) != 2 || strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("counting kept, besides the owned:\n%s\nlisting kept:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	if len(counted.Kept) != len(notOwned(counted.Kept)) {
		t.Fatalf("counting listed owned entries: %+v", counted.Kept)
	}
	if len(counted.Orphans) != 1 || len(listed.Orphans) != 1 || counted.Orphans[0].Path != orphan || counted.Allocated != listed.Allocated {
		t.Fatalf("orphans: counting %+v, listing %+v; want %s", counted.Orphans, listed.Orphans, orphan)
	}
	for _, r := range []ReapReport{listed, counted} {
		if planned := planEvents(r, false)[0].(events.ReapDecidedEvent).Owned; planned != owned {
			t.Fatalf("the plan of %+v records %d owned, want %d", r, planned, owned)
		}
	}
}
