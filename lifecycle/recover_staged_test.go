package lifecycle

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/oklog/ulid/v2"
	"golang.org/x/sys/unix"

	"github.com/nexus-sandbox/nexus/core"
	"github.com/nexus-sandbox/nexus/host/driver"
	"github.com/nexus-sandbox/nexus/host/intent"
	"github.com/nexus-sandbox/nexus/host/proc"
	"github.com/nexus-sandbox/nexus/host/sagalease"
	"github.com/nexus-sandbox/nexus/host/supervisor"
)

// An intent its creator died staging (killed between intent.Publish's
// create and rename, as a fork copying children concurrently can be) is
// removed by recover when its lease is free, and kept while a creator
// holds it; other dot files are not intents and stay.
func TestRecoverSweepsStagedIntents(t *testing.T) {
	ctx := context.Background()
	m, _ := localManager(t)
	disks := m.Root.Disks()
	if err := os.MkdirAll(disks, 0o700); err != nil {
		t.Fatal(err)
	}
	plant := func(name string) string {
		t.Helper()
		p := filepath.Join(disks, name)
		if err := os.WriteFile(p, []byte(`{"sandbox":"x"}`), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	deadID := ulid.Make().String()
	deadCreate := plant("." + deadID + ".create-intent.json.stage-1445947824")
	leaveRunnerTrace(t, string(m.Root), deadID)
	deadShadow := plant(".dev_one.shadow-intent.json.stage-77")
	liveCreate := plant("." + ulid.Make().String() + ".create-intent.json.stage-12")
	other := plant(".notes.stage-1")
	// A running creator holds its staged intent's flock (another open
	// file description than recover's probe, so it conflicts).
	f, err := os.Open(liveCreate)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		t.Fatal(err)
	}

	rep, err := m.Recover(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{deadCreate, deadShadow} {
		if _, err := os.Lstat(p); !os.IsNotExist(err) {
			t.Fatalf("%s: a staged intent whose creator died is still there (%v)", filepath.Base(p), err)
		}
		if !slices.Contains(rep.Intents, filepath.Base(p)) {
			t.Fatalf("report's intents %v miss %s", rep.Intents, filepath.Base(p))
		}
	}
	for _, p := range []string{liveCreate, other} {
		if _, err := os.Lstat(p); err != nil {
			t.Fatalf("%s removed: %v", filepath.Base(p), err)
		}
	}
	if len(rep.Intents) != 2 {
		t.Fatalf("report's intents: %v", rep.Intents)
	}
}

// A VMM its creator spawned just before dying, still starting (no socket
// yet, as under load for seconds), is found by its command line and
// stopped by recover's undo of the uncommitted create, not left to bind
// its socket after the cleanup and outlive the sandbox.
func TestRecoverStopsAVMMStillStarting(t *testing.T) {
	ctx := context.Background()
	m, root := localManager(t)
	for _, d := range []string{m.Root.Disks(), m.Root.RunDir()} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	id := ulid.Make().String()
	// The creator published its intent, spawned the VMM, and died: the
	// intent's lease is free, no saga reached the journal.
	held, err := intent.Publish(m.Root.CreateIntent(id), intent.Intent{Kind: "create", Sandbox: id, Saga: ulid.Make().String()})
	if err != nil {
		t.Fatal(err)
	}
	if err := held.Release(); err != nil {
		t.Fatal(err)
	}
	leaveRunnerTrace(t, string(m.Root), id)
	env := append(os.Environ(), slowEnv+"=1")
	argv := driver.Driver{Name: driver.Process, Exe: os.Args[0]}.Argv(m.Root.APISocket(id))
	who, err := proc.SpawnDetached(argv, env, filepath.Join(root, "vmm.log"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { proc.Terminate(who, time.Second) })

	rep, err := m.Recover(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(rep.Intents, id) {
		t.Fatalf("recover did not undo the create of %s: %+v", id, rep)
	}
	if alive, _ := proc.Alive(who); alive {
		t.Fatalf("the VMM still starting for %s (pid %d) outlived recover", id, who.Pid)
	}
}

// A supervisor its creator spawned just before dying, still starting (not
// answering yet), is found by its command line and stopped by recover's
// undo of the uncommitted create.
func TestRecoverStopsASupervisorStillStarting(t *testing.T) {
	ctx := context.Background()
	m, root := localManager(t)
	for _, d := range []string{m.Root.Disks(), m.Root.RunDir()} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	id := ulid.Make().String()
	held, err := intent.Publish(m.Root.CreateIntent(id), intent.Intent{Kind: "create", Sandbox: id, Saga: ulid.Make().String()})
	if err != nil {
		t.Fatal(err)
	}
	if err := held.Release(); err != nil {
		t.Fatal(err)
	}
	leaveRunnerTrace(t, string(m.Root), id)
	env := append(os.Environ(), slowEnv+"=1")
	argv := supervisor.Argv(os.Args[0], supervisor.ServeOptions{SandboxID: id, StateDir: m.Root.SupervisorDir(id), IIDSocket: m.Root.IIDSocket(id)})
	who, err := proc.SpawnDetached(argv, env, filepath.Join(root, "supervisor.log"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { proc.Terminate(who, time.Second) })

	rep, err := m.Recover(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(rep.Intents, id) {
		t.Fatalf("recover did not undo the create of %s: %+v", id, rep)
	}
	if alive, _ := proc.Alive(who); alive {
		t.Fatalf("the supervisor still starting for %s (pid %d) outlived recover", id, who.Pid)
	}
}

// leaveRunnerTrace leaves what a create-like runner of sandbox id leaves
// when it dies: its lease file, no longer held.
func leaveRunnerTrace(t *testing.T, root, id string) {
	t.Helper()
	l, err := sagalease.Acquire(context.Background(), root, string(core.Sandbox(id)), sagalease.Holder{Kind: "create"}, false)
	if err != nil {
		t.Fatal(err)
	}
	l.Abandon()
}
