package lifecycle

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/oklog/ulid/v2"
	"golang.org/x/sys/unix"

	"github.com/nexus-sandbox/nexus/core"
	"github.com/nexus-sandbox/nexus/events"
	"github.com/nexus-sandbox/nexus/host/intent"
	"github.com/nexus-sandbox/nexus/host/sagalease"
	"github.com/nexus-sandbox/nexus/internal/testutil"
	"github.com/nexus-sandbox/nexus/projections"
	"github.com/nexus-sandbox/nexus/sagas"
)

// crash is the panic crashAt raises: in-process, what the end-to-end crash
// tests do with SIGKILL. Unwinding runs the flow's deferred releases, as
// the kernel drops a dead process's flocks; nothing else of it runs (no
// undo, no journal append), and the processes it started keep running.
type crash struct{ at string }

// crashAt runs run, crashing the flow at kind's step in phase.
func (f *flow) crashAt(kind events.SagaKind, step string, phase sagas.Phase, run func()) {
	f.t.Helper()
	at := fmt.Sprintf("%s/%s/%s", kind, step, phase)
	f.m.Hook = func(k, s string, p sagas.Phase) {
		if k == string(kind) && s == step && p == phase {
			panic(crash{at})
		}
	}
	crashed := func() (crashed bool) {
		defer func() {
			if r := recover(); r != nil {
				if _, ok := r.(crash); !ok {
					panic(r)
				}
				crashed = true
			}
		}()
		run()
		return false
	}()
	f.m.Hook = nil
	if !crashed {
		f.t.Fatalf("the flow never reached %s", at)
	}
	f.dropLocks()
}

// dropLocks does what the kernel does to a dead process's flocks: every
// descriptor this process holds beneath the root (a flow's leases and
// intents, which a panic may leave open) is closed, by putting /dev/null
// in its place, so that the *os.File still naming it closes nothing else.
func (f *flow) dropLocks() {
	f.t.Helper()
	null, err := os.Open(os.DevNull)
	if err != nil {
		f.t.Fatal(err)
	}
	defer null.Close()
	fds, _ := os.ReadDir("/proc/self/fd")
	for _, e := range fds {
		fd, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if target, err := os.Readlink("/proc/self/fd/" + e.Name()); err == nil && strings.HasPrefix(target, f.root+"/") {
			if err := unix.Dup3(int(null.Fd()), fd, unix.O_CLOEXEC); err != nil {
				f.t.Fatal(err)
			}
		}
	}
}

func (f *flow) recover() RecoverReport {
	f.t.Helper()
	rep, err := f.m.Recover(f.ctx)
	if err != nil {
		f.t.Fatalf("recover: %v", err)
	}
	if open, _ := f.j.OpenSagas(f.ctx); len(open) > 0 {
		f.t.Fatalf("recover left sagas open: %+v", open)
	}
	return rep
}

// A create killed at any step is finished by recover: before its commit
// nothing of it is left (files, markers, processes, view); after it the
// sandbox is kept, stopped unless its VMM was recorded running.
func TestRecoverACreateCrashedAtEachStep(t *testing.T) {
	steps := []string{"intents", "image-cache", "os-disk", "workspace-disk", "supervisor-state", "record-dir", "commit",
		"retire-intents", "logs", "run-mark", "supervisor", "vmm"}
	for i, step := range steps {
		for _, phase := range []sagas.Phase{sagas.BeforeRecord, sagas.AfterRecord} {
			t.Run(step+"/"+string(phase), func(t *testing.T) {
				// The sample crosses each verdict: compensated, kept
				// stopped, kept running.
				testutil.ShortSample(t, step == "intents" && phase == sagas.BeforeRecord || step == "commit" || step == "vmm" && phase == sagas.AfterRecord)
				f := newFlow(t)
				id := ulid.Make().String()
				img := f.image()
				f.crashAt(events.SagaCreate, step, phase, func() { f.m.Create(f.ctx, CreateSpec{Image: img, Handle: "h", ID: id}) })
				rep := f.recover()
				committed := i > slices.Index(steps, "commit") || step == "commit" && phase == sagas.AfterRecord
				// The supervisor is journaled in the VMM's append: once it
				// is, so is the VMM.
				runs := (step == "vmm" || step == "supervisor") && phase == sagas.AfterRecord
				sb, found := f.find(id)
				switch {
				case !committed:
					if found || len(rep.Compensated)+len(rep.Intents) != 1 {
						t.Fatalf("recover %+v left %+v: want the create compensated", rep, sb)
					}
					if left := f.files("disks", "supervisors", "sandboxes", "run", "snapshots"); len(left) > 0 {
						t.Fatalf("an uncommitted create left %v", left)
					}
				case runs:
					if sb.State != projections.StateRunning || !alive(sb.VMM) {
						t.Fatalf("%+v: a VMM recorded running is kept", sb)
					}
				default:
					if !found || sb.State != projections.StateStopped || sb.VMM != nil || sb.Supervisor != nil {
						t.Fatalf("%+v: want the committed sandbox kept, stopped", sb)
					}
					f.waitNoProcesses()
				}
				if found {
					for _, rel := range f.files("disks") {
						if strings.Contains(rel, "intent") {
							t.Fatalf("intent %s left", rel)
						}
					}
					// And nothing stands in the way of the next command on it.
					if _, err := f.m.RemoveWith(f.ctx, id, RemoveOptions{Force: true}); err != nil {
						t.Fatalf("rm after recover: %v", err)
					}
				}
			})
		}
	}
}

// Teardowns and a start killed at any step: recover finishes a teardown
// (rm, stop, snapshot rm) forward, compensates a start and a capture.
func TestRecoverOtherFlowsCrashedAtEachStep(t *testing.T) {
	cases := []struct {
		kind  events.SagaKind
		steps []string
		setup func(f *flow, sb projections.Sandbox) string // returns the ref of the command's target
		run   func(f *flow, ref string)
		check func(f *flow, sb projections.Sandbox, ref string)
	}{
		{kind: events.SagaRm, steps: []string{"vmm-stop", "vmm-sockets", "supervisor-stop", "reclaim", "remove"},
			run: func(f *flow, ref string) { f.m.RemoveWith(f.ctx, ref, RemoveOptions{Force: true}) },
			check: func(f *flow, sb projections.Sandbox, _ string) {
				if _, found := f.find(sb.ID); found {
					f.t.Fatal("the sandbox outlived its recovered rm")
				}
				if left := f.files("disks", "supervisors", "sandboxes", "run", "logs"); len(left) > 0 {
					f.t.Fatalf("a recovered rm left %v", left)
				}
			}},
		{kind: events.SagaStop, steps: []string{"vmm-stop", "vmm-sockets", "supervisor-stop"},
			run:   func(f *flow, ref string) { f.m.Stop(f.ctx, ref) },
			check: wantStoppedClean},
		{kind: events.SagaStart, steps: []string{"run-mark", "supervisor", "vmm"},
			setup: func(f *flow, sb projections.Sandbox) string { stop(f, sb); return sb.ID },
			run:   func(f *flow, ref string) { f.m.Start(f.ctx, ref) },
			check: func(f *flow, sb projections.Sandbox, _ string) {
				if now, _ := f.find(sb.ID); now.State == projections.StateStopped {
					wantStoppedClean(f, sb, "")
				} else if now.State != projections.StateRunning || !alive(now.VMM) {
					f.t.Fatalf("%+v: want stopped, or running with its VMM", now)
				}
			}},
		{kind: events.SagaSnapshot, steps: []string{"capture"},
			run: func(f *flow, ref string) { f.m.Snapshot(f.ctx, ref) },
			check: func(f *flow, sb projections.Sandbox, _ string) {
				now, _ := f.find(sb.ID)
				for _, rel := range f.files("snapshots") {
					if !now.Owns(rel) && !slices.ContainsFunc(now.Snapshots, func(s string) bool { return strings.Contains(rel, s) }) {
						f.t.Fatalf("snapshot file %s belongs to no recorded snapshot", rel)
					}
				}
				if f.vmState(sb.ID) != "Running" {
					f.t.Fatal("recover left the guest paused")
				}
			}},
		{kind: events.SagaSnapshotRm, steps: []string{"delete:"},
			setup: func(f *flow, sb projections.Sandbox) string {
				snap, err := f.m.Snapshot(f.ctx, sb.ID)
				if err != nil {
					f.t.Fatal(err)
				}
				return snap
			},
			run: func(f *flow, ref string) { f.m.SnapshotRemove(f.ctx, ref) },
			check: func(f *flow, sb projections.Sandbox, snap string) {
				now, _ := f.find(sb.ID)
				if slices.Contains(now.Snapshots, snap) || f.exists("snapshots/"+sb.ID+"/"+snap) {
					f.t.Fatalf("snapshot %s outlived its recovered rm", snap)
				}
			}},
	}
	for _, c := range cases {
		for _, step := range c.steps {
			for _, phase := range []sagas.Phase{sagas.BeforeRecord, sagas.AfterRecord} {
				t.Run(string(c.kind)+"/"+step+"/"+string(phase), func(t *testing.T) {
					testutil.ShortSample(t, step == c.steps[0] && phase == sagas.AfterRecord)
					f := newFlow(t)
					sb := f.create(CreateSpec{})
					ref := sb.ID
					if c.setup != nil {
						ref = c.setup(f, sb)
					}
					at := step
					if at == "delete:" {
						at += ref
					}
					f.crashAt(c.kind, at, phase, func() { c.run(f, ref) })
					f.recover()
					c.check(f, sb, ref)
				})
			}
		}
	}
}

func wantStoppedClean(f *flow, sb projections.Sandbox, _ string) {
	f.t.Helper()
	now, _ := f.find(sb.ID)
	if now.State != projections.StateStopped || now.VMM != nil || now.Supervisor != nil {
		f.t.Fatalf("%+v: want stopped", now)
	}
	f.waitNoProcesses()
	for _, sock := range []string{".sock", ".vsock", ".iid"} {
		if f.exists("run/sb-" + sb.ID + sock) {
			f.t.Fatalf("run/sb-%s%s left (RL-11)", sb.ID, sock)
		}
	}
}

// recover checks every sandbox against its processes: a dead VMM is
// journaled stopped and its orphaned supervisor killed; a dead supervisor
// of a live VMM is replaced, re-seeded with the same CA.
func TestRecoverJudgesEachSandboxByItsProcesses(t *testing.T) {
	f := newFlow(t)
	vmmGone := f.create(CreateSpec{})
	supGone := f.create(CreateSpec{})
	fine := f.create(CreateSpec{})
	kill(t, vmmGone.VMM)
	kill(t, supGone.Supervisor)
	ca := func(id string) []byte {
		data, err := os.ReadFile(filepath.Join(f.m.Root.SupervisorDir(id), "mitm-ca.pem"))
		if err != nil {
			t.Fatal(err)
		}
		return data
	}
	before := ca(supGone.ID)
	rep := f.recover()
	if !slices.Equal(rep.Stopped, []string{vmmGone.ID}) || !slices.Equal(rep.Killed, []string{vmmGone.ID}) || !slices.Equal(rep.Restarted, []string{supGone.ID}) {
		t.Fatalf("recover reported %+v: want %s stopped and its supervisor killed, %s's supervisor restarted", rep, vmmGone.ID, supGone.ID)
	}
	if now, _ := f.find(vmmGone.ID); now.State != projections.StateStopped || now.VMM != nil || now.Supervisor != nil || alive(vmmGone.Supervisor) {
		t.Fatalf("%+v: want stopped, its supervisor dead", now)
	}
	for _, sock := range []string{".sock", ".vsock", ".iid"} {
		if f.exists("run/sb-" + vmmGone.ID + sock) {
			t.Errorf("run/sb-%s%s left (RL-11)", vmmGone.ID, sock)
		}
	}
	now, _ := f.find(supGone.ID)
	if !alive(now.Supervisor) || now.Supervisor.Pid == supGone.Supervisor.Pid || !bytes.Equal(ca(supGone.ID), before) {
		t.Fatalf("supervisor %+v: want a new live one with the same CA", now.Supervisor)
	}
	if still, _ := f.find(fine.ID); still.Rev != fine.Rev {
		t.Fatalf("recover journaled about a sandbox whose processes are fine: rev %d, was %d", still.Rev, fine.Rev)
	}
	// Recover again: nothing left to do.
	mark := f.j.mark()
	f.recover()
	if got := f.j.since(mark); len(got) > 0 {
		t.Fatalf("a second recover journaled %v", types(got))
	}
}

// A saga whose runner holds its lease is alive, not interrupted: recover
// leaves it, and the sandbox, alone and says why.
func TestRecoverLeavesALiveRunnerAlone(t *testing.T) {
	f := newFlow(t)
	sb := f.create(CreateSpec{})
	f.crashAt(events.SagaStop, "vmm-stop", sagas.AfterRecord, func() { f.m.Stop(f.ctx, sb.ID) })
	l, err := sagalease.Acquire(f.ctx, f.root, string(core.Sandbox(sb.ID)), sagalease.Holder{Kind: "stop"}, false)
	if err != nil {
		t.Fatal(err)
	}
	mark := f.j.mark()
	rep, err := f.m.Recover(f.ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.InFlight) != 1 || len(rep.Skipped) != 2 || !strings.Contains(rep.Skipped[0].Reason, "its runner is alive") {
		t.Fatalf("recover reported %+v: want the saga in flight and the sandbox skipped", rep)
	}
	if got := f.j.since(mark); len(got) > 0 {
		t.Fatalf("recover journaled %v about a live runner's sandbox", types(got))
	}
	l.Release()
	f.recover()
	wantStoppedClean(f, sb, "")
}

// An intent published but never journaled (a crash between the two) is
// swept: what it covers is removed, unless another sandbox owns it.
func TestRecoverSweepsAnIntentTheJournalNeverSaw(t *testing.T) {
	f := newFlow(t)
	other := f.create(CreateSpec{})
	id := ulid.Make().String()
	own := f.m.rel(f.m.Root.RawDisk(id))
	builder := f.m.rel(f.m.Root.BuilderDir(id))
	foreign := f.m.rel(f.m.Root.RawDisk(other.ID))
	os.WriteFile(filepath.Join(f.root, own), []byte("half a disk"), 0o600)
	os.MkdirAll(filepath.Join(f.root, builder), 0o700)
	h, err := intent.Publish(f.m.Root.CreateIntent(id), intent.Intent{Kind: string(events.KindCreateIntent), Sandbox: id, Covers: []string{own, builder, foreign}})
	if err != nil {
		t.Fatal(err)
	}
	// While its creator holds the lease, it is alive: left alone, by a
	// sweep another runner's death set off.
	leaveRunnerTrace(t, f.root, ulid.Make().String())
	if rep := f.recover(); rep.disksRead != 1 || len(rep.Intents) != 0 || !f.exists(own) {
		t.Fatalf("recover swept a live creator's intent: %+v", rep)
	}
	h.Release()
	leaveRunnerTrace(t, f.root, id)
	mark := f.j.mark()
	rep := f.recover()
	if !slices.Equal(rep.Intents, []string{id}) || f.exists(own) || f.exists(f.m.rel(f.m.Root.CreateIntent(id))) {
		t.Fatalf("recover %+v: want the intent swept with what it covers", rep)
	}
	if !f.exists(foreign) {
		t.Fatal("recover deleted a disk another sandbox owns")
	}
	// Each reclaimed path is journaled as the kind its name is.
	kinds := map[string]events.ResourceKind{}
	for _, e := range ofType(f.j.since(mark), events.ResourceReclaimed) {
		r := e.Payload.(events.ResourceReclaimedEvent).Resource
		kinds[r.Path] = r.Kind
	}
	if kinds[own] != events.KindRawDisk || kinds[builder] != events.KindBuilderSupervisor {
		t.Fatalf("reclaimed as %v", kinds)
	}
	var warned bool
	for _, e := range ofType(f.j.since(mark), events.WarningRaised) {
		warned = warned || e.Payload.(events.WarningRaisedEvent).Reason == "ForeignIntentCover"
	}
	if !warned {
		t.Fatal("no ForeignIntentCover warning for the cover it kept")
	}
}

// An intent recover cannot read is no create's (one nexus publishes is
// renamed into place whole): recover removes nothing named after it, a
// daemon's start included, and leaves it all to the reaper.
func TestRecoverLeavesAnUnreadableIntent(t *testing.T) {
	f := newFlow(t)
	id := ulid.Make().String()
	paths := []string{f.m.rel(f.m.Root.CreateIntent(id)), f.m.rel(f.m.Root.RawDisk(id)), f.m.rel(f.m.Root.IIDSocket(id))}
	for _, p := range paths {
		os.MkdirAll(filepath.Dir(filepath.Join(f.root, p)), 0o700)
		if err := os.WriteFile(filepath.Join(f.root, p), make([]byte, 64), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := f.m.RecoverSagas(f.ctx); err != nil {
		t.Fatal(err)
	}
	if rep := f.recover(); len(rep.Intents) != 0 {
		t.Fatalf("recover swept %v", rep.Intents)
	}
	for _, p := range paths {
		if !f.exists(p) {
			t.Fatalf("recover removed %s, named after an intent it cannot read", p)
		}
	}
}

// RecoverSagas (a daemon's start) finishes sagas and nothing else.
func TestRecoverSagasOnly(t *testing.T) {
	f := newFlow(t)
	sb := f.create(CreateSpec{})
	f.crashAt(events.SagaStop, "vmm-stop", sagas.AfterRecord, func() { f.m.Stop(f.ctx, sb.ID) })
	other := f.create(CreateSpec{})
	kill(t, other.VMM)
	rep, err := f.m.RecoverSagas(context.Background())
	if err != nil || len(rep.Resumed) != 1 {
		t.Fatalf("RecoverSagas: %+v, %v", rep, err)
	}
	if now, _ := f.find(other.ID); now.VMM == nil {
		t.Fatal("RecoverSagas judged a sandbox's processes")
	}
}

// waitNoProcesses waits for every process under the root to be gone.
// recover stops a VMM the journal never recorded through its API, and
// knows it stopped once its socket is dead and its lock free (it has no
// recorded pid to wait on), so the process may still be exiting.
func (f *flow) waitNoProcesses() {
	f.t.Helper()
	testutil.WaitUntil(f.t, 10*time.Second, "clear of the sandbox's processes", func() bool {
		return len(testutil.ProcessesUnder(f.root)) == 0
	})
}

// staleSagas answers OpenSagas once with the list it was given: what a
// recover read before another recover closed those sagas.
type staleSagas struct {
	*memJournal
	first []projections.OpenSaga
}

func (s *staleSagas) OpenSagas(ctx context.Context) ([]projections.OpenSaga, error) {
	if first := s.first; first != nil {
		s.first = nil
		return first, nil
	}
	return s.memJournal.OpenSagas(ctx)
}

// Two recovers at once: the one that takes a saga's lease after the other
// closed it reads the saga again under the lease and leaves it, rather
// than failing on a closed saga.
func TestRecoverReadsASagaAgainUnderItsLease(t *testing.T) {
	f := newFlow(t)
	sb := f.create(CreateSpec{})
	f.crashAt(events.SagaStop, "vmm-stop", sagas.AfterRecord, func() { f.m.Stop(f.ctx, sb.ID) })
	before, err := f.j.OpenSagas(f.ctx)
	if err != nil || len(before) != 1 {
		t.Fatalf("open sagas after the crash: %v, %v", before, err)
	}
	f.recover() // the other recover, done first
	mark := f.j.mark()
	f.m.B = &staleSagas{memJournal: f.j, first: before}
	rep, err := f.m.RecoverSagas(f.ctx)
	if err != nil {
		t.Fatalf("a recover that listed a saga another recover then closed: %v", err)
	}
	if len(rep.Resumed)+len(rep.Compensated) != 0 {
		t.Fatalf("recover finished a closed saga again: %+v", rep)
	}
	if got := f.j.since(mark); len(got) > 0 {
		t.Fatalf("recover journaled %v about a closed saga", types(got))
	}
}
