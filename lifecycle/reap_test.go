package lifecycle_test

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/oklog/ulid/v2"

	"github.com/nexus-sandbox/nexus/control/local"
	"github.com/nexus-sandbox/nexus/events"
	"github.com/nexus-sandbox/nexus/host/proc"
	"github.com/nexus-sandbox/nexus/internal/testutil"
	"github.com/nexus-sandbox/nexus/layout"
	"github.com/nexus-sandbox/nexus/lifecycle"
	"github.com/nexus-sandbox/nexus/store"
)

// shortRoot: a state root whose processes never outlive the test
// (testutil.ShortRoot).
var shortRoot = testutil.ShortRoot

// localManager is a Manager on a fresh short root with its own store, closed
// when the test ends: the reaper's and recover's tests drive them in
// process, without the binary.
func localManager(t *testing.T) (*lifecycle.Manager, string) {
	t.Helper()
	root := shortRoot(t)
	n, err := store.Open(context.Background(), root, store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.Close() })
	return &lifecycle.Manager{Root: layout.Root(root), B: local.Backend{Store: n}}, root
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

	dry := reapSettled(t, m, lifecycle.ReapOptions{})
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

	rep := reapSettled(t, m, lifecycle.ReapOptions{Apply: true})
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
	again, err := m.Reap(ctx, lifecycle.ReapOptions{Apply: true})
	if err != nil || len(again.Deleted) != 0 {
		t.Fatalf("second pass deleted %+v (%v)", again.Deleted, err)
	}
}

// reapSettled runs m.Reap until no entry is kept only because its /proc
// scan was inconclusive (testutil.ReapUntilConclusive), and returns that
// run, with what earlier runs deleted (and its Allocated, for an apply)
// carried over.
func reapSettled(t *testing.T, m *lifecycle.Manager, o lifecycle.ReapOptions) lifecycle.ReapReport {
	t.Helper()
	var deleted []lifecycle.ReapItem
	var freed int64
	var rep lifecycle.ReapReport
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
	rep := reapSettled(t, m, lifecycle.ReapOptions{Apply: true})
	if len(rep.Kept) != 1 || rep.Kept[0].Verdict != "live" || !strings.Contains(rep.Kept[0].Reason, "supervisor socket answers") {
		t.Fatalf("kept %+v deleted %+v", rep.Kept, rep.Deleted)
	}
	l.Close()
	if rep = reapSettled(t, m, lifecycle.ReapOptions{Apply: true}); len(rep.Deleted) != 1 {
		t.Fatalf("after the supervisor went: %+v", rep)
	}
	if _, err := os.Lstat(dir); !os.IsNotExist(err) {
		t.Fatal("state dir survived")
	}
}

// BenchmarkReapApply10k measures `reap --apply` of 10,000 orphans end to
// end against a real journal (scan, judge, plan and result events, the
// batched symlink-safe deletes, the verify pass, the directory fsync)
// against `rm -rf` of the same 10,000 files, in the same run.
func BenchmarkReapApply10k(b *testing.B) {
	const orphans = 10000
	ctx := context.Background()
	var reapT, rmT time.Duration
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		root := b.TempDir()
		n, err := store.Open(ctx, root, store.Options{})
		if err != nil {
			b.Fatal(err)
		}
		m := &lifecycle.Manager{Root: layout.Root(root), B: local.Backend{Store: n}}
		other := filepath.Join(b.TempDir(), "disks")
		os.MkdirAll(filepath.Join(root, "disks"), 0o700)
		os.MkdirAll(other, 0o700)
		for k := 0; k < orphans; k++ {
			name := ulid.Make().String() + ".raw"
			os.WriteFile(filepath.Join(root, "disks", name), []byte("x"), 0o600)
			os.WriteFile(filepath.Join(other, name), []byte("x"), 0o600)
		}
		b.StartTimer()
		t0 := time.Now()
		rep, err := m.Reap(ctx, lifecycle.ReapOptions{Apply: true})
		reapT += time.Since(t0)
		b.StopTimer()
		if err != nil || len(rep.Deleted) != orphans || len(rep.Failed) != 0 {
			b.Fatalf("apply: %v deleted %d failed %d kept %d", err, len(rep.Deleted), len(rep.Failed), len(rep.Kept))
		}
		n.Close()
		t1 := time.Now()
		if out, err := exec.Command("rm", "-rf", other).CombinedOutput(); err != nil {
			b.Fatalf("rm -rf: %v %s", err, out)
		}
		rmT += time.Since(t1)
		b.StartTimer()
	}
	b.ReportMetric(float64(reapT.Nanoseconds())/float64(b.N), "reap-ns/op")
	b.ReportMetric(float64(rmT.Nanoseconds())/float64(b.N), "rm-ns/op")
	b.ReportMetric(float64(reapT)/float64(rmT), "reap/rm")
}
