package lifecycle

import (
	"context"
	"errors"
	"reflect"
	"testing"
	"time"

	"github.com/oklog/ulid/v2"

	"github.com/nexus-sandbox/nexus/core"
	"github.com/nexus-sandbox/nexus/events"
	"github.com/nexus-sandbox/nexus/host/proc"
	"github.com/nexus-sandbox/nexus/internal/testutil"
	"github.com/nexus-sandbox/nexus/projections"
	"github.com/nexus-sandbox/nexus/sagas"
)

var stopTypes = []string{"saga.started",
	"flush.acknowledged", "sandbox.stopped", // vmm-stop: the guest flushed, then the VMM went
	"resource.reclaimed", "resource.reclaimed", "resource.reclaimed", // API socket, its lock, vsock
	"supervisor.stopped", "resource.reclaimed", // the supervisor, then its IID socket
	"saga.finished"}

// kill ends a process the journal recorded, behind nexus's back (a crash
// of the VMM or supervisor).
func kill(t *testing.T, p *projections.Process) {
	t.Helper()
	if err := proc.Terminate(proc.Identity{Pid: p.Pid, StartTicks: p.StartTicks}, time.Second); err != nil {
		t.Fatal(err)
	}
}

func TestStopAndStartFromEachState(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name  string
		setup func(f *flow, sb projections.Sandbox) // brings a running sandbox to the state
		cmd   string
		is    error
		says  string
		want  []string // the journal's types after the command (nil: nothing)
		state projections.State
	}{
		{name: "stop running", cmd: "stop", want: stopTypes, state: projections.StateStopped},
		{name: "stop stopped", setup: stop, cmd: "stop", is: ErrAlready, says: "is already stopped", state: projections.StateStopped},
		{name: "start running", cmd: "start", is: ErrAlready, says: "is already running", state: projections.StateRunning},
		{name: "start stopped", setup: stop, cmd: "start", state: projections.StateRunning,
			want: []string{"saga.started", "flush.pending", "supervisor.started", "sandbox.started", "saga.finished"}},
		// An exited VMM (seen by pid + start time, never journaled) is
		// settled the way recover does, then stopped or started.
		{name: "stop exited", setup: func(f *flow, sb projections.Sandbox) { kill(f.t, sb.VMM) }, cmd: "stop", state: projections.StateStopped,
			want: []string{"saga.started", "sandbox.stopped", "resource.reclaimed", "resource.reclaimed", "resource.reclaimed", "supervisor.stopped", "resource.reclaimed", "saga.finished"}},
		{name: "start exited", setup: func(f *flow, sb projections.Sandbox) { kill(f.t, sb.VMM) }, cmd: "start", state: projections.StateRunning,
			want: []string{"saga.started", "sandbox.stopped", "resource.reclaimed", "resource.reclaimed", "resource.reclaimed", "supervisor.stopped", "resource.reclaimed", "saga.finished", // recover's settle
				"saga.started", "flush.pending", "supervisor.started", "sandbox.started", "saga.finished"}},
		{name: "stop unknown", cmd: "stop-unknown", is: ErrNotFound, says: "no sandbox"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			testutil.ShortSample(t, c.name == "stop running" || c.name == "start stopped" || c.name == "start exited")
			f := newFlow(t)
			sb := f.create(CreateSpec{})
			if c.setup != nil {
				c.setup(f, sb)
			}
			mark := f.j.mark()
			var got projections.Sandbox
			var err error
			switch c.cmd {
			case "stop":
				got, err = f.m.Stop(f.ctx, sb.ID)
			case "stop-unknown":
				_, err = f.m.Stop(f.ctx, ulid.Make().String())
			case "start":
				got, err = f.m.Start(f.ctx, sb.ID)
			}
			if c.is != nil {
				wantErr(t, err, c.is, c.says)
			} else if err != nil {
				t.Fatal(err)
			}
			if evs := types(f.j.since(mark)); !reflect.DeepEqual(evs, c.want) {
				t.Fatalf("%s journaled\n%v\nwant\n%v", c.name, evs, c.want)
			}
			if c.state == "" {
				return
			}
			if got.State != c.state {
				t.Fatalf("%s answered %s, want %s", c.name, got.State, c.state)
			}
			now, _ := f.find(sb.ID)
			switch c.state {
			case projections.StateRunning:
				if !alive(now.VMM) || !alive(now.Supervisor) || !f.exists("run/sb-"+sb.ID+".sock") {
					t.Fatalf("running %+v: want a live VMM, supervisor and API socket", now)
				}
			case projections.StateStopped:
				if now.VMM != nil || now.Supervisor != nil || len(testutil.ProcessesUnder(f.root)) > 0 {
					t.Fatalf("stopped %+v: processes %v left", now, testutil.ProcessesUnder(f.root))
				}
				for _, sock := range []string{".sock", ".sock.lock", ".vsock", ".iid"} {
					if f.exists("run/sb-" + sb.ID + sock) {
						t.Errorf("run/sb-%s%s outlived the stop (RL-11)", sb.ID, sock)
					}
				}
			}
		})
	}
}

func stop(f *flow, sb projections.Sandbox) {
	f.t.Helper()
	if _, err := f.m.Stop(f.ctx, sb.ID); err != nil {
		f.t.Fatal(err)
	}
}

// A stop whose guest answered its flush records the acknowledgement of the
// run it ended; one that could not flush says so and records none.
func TestStopRecordsTheFlushOnlyWhenTheGuestAnswered(t *testing.T) {
	t.Parallel()
	f := newFlow(t)
	sb := f.create(CreateSpec{})
	stop(f, sb)
	now, _ := f.find(sb.ID)
	if now.LastRun == "" || now.FlushedRun != now.LastRun {
		t.Fatalf("after a flushed stop: last run %q, flushed %q; want the same run", now.LastRun, now.FlushedRun)
	}
	if _, err := f.m.Start(f.ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	var notices []string
	f.m.Notice = func(msg string) { notices = append(notices, msg) }
	f.m.FlushDeadline = 200 * time.Millisecond
	now, _ = f.find(sb.ID)
	// The guest agent's vsock socket gone: the flush cannot be asked.
	if err := removeAll(f.root, "run/sb-"+sb.ID+".vsock"); err != nil {
		t.Fatal(err)
	}
	mark := f.j.mark()
	stop(f, sb)
	if got := ofType(f.j.since(mark), events.FlushAcknowledged); len(got) != 0 {
		t.Fatalf("a stop without a flush journaled %v", got)
	}
	after, _ := f.find(sb.ID)
	if after.FlushedRun == now.LastRun || len(notices) != 1 {
		t.Fatalf("flushed run %q after an unflushed stop of run %q, notices %q: want no acknowledgement and one notice", after.FlushedRun, now.LastRun, notices)
	}
}

// Start's boot steps undo what they did when one fails: the supervisor is
// stopped, a VMM that started is stopped, and a run that never reached a
// VM gives the previous run marker back (flush.restored).
func TestStartUndoesAFailedBoot(t *testing.T) {
	t.Parallel()
	boom := errors.New("injected")
	cases := []struct {
		name     string
		journal  events.Type
		dies     string
		restored bool // flush.restored: no VM ever existed
		says     string
	}{
		{name: "supervisor dies", dies: "supervisor", restored: true, says: "supervisor exited before answering"},
		{name: "VMM dies", dies: "VMM", restored: true, says: "VMM exited before answering"},
		{name: "VMM not recorded", journal: events.SandboxStarted, says: "vmm: injected"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			testutil.ShortSample(t, c.name != "VMM dies")
			f := newFlow(t)
			sb := f.create(CreateSpec{})
			stop(f, sb)
			before, _ := f.find(sb.ID)
			if c.dies != "" {
				f.l.die[c.dies] = true
			}
			if c.journal != "" {
				f.j.failType(c.journal, boom)
			}
			mark := f.j.mark()
			_, err := f.m.Start(f.ctx, sb.ID)
			wantErr(t, err, sagas.ErrCompensated, c.says)
			f.j.fail = nil
			evs := f.j.since(mark)
			if len(ofType(evs, events.FlushRestored)) > 0 != c.restored {
				t.Fatalf("journaled %v: flush.restored %v, want %v", types(evs), !c.restored, c.restored)
			}
			after, _ := f.find(sb.ID)
			if after.State != projections.StateStopped || after.VMM != nil || after.Supervisor != nil {
				t.Fatalf("after a failed start: %+v; want stopped, no processes", after)
			}
			if c.restored && (after.LastRun != before.LastRun || after.FlushedRun != before.FlushedRun) {
				t.Fatalf("runs %q/%q after the undo, were %q/%q", after.LastRun, after.FlushedRun, before.LastRun, before.FlushedRun)
			}
			if left := testutil.ProcessesUnder(f.root); len(left) > 0 {
				t.Fatalf("processes left: %v", left)
			}
			// And it starts once nothing fails.
			f.l.die = map[string]bool{}
			if _, err := f.m.Start(f.ctx, sb.ID); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// staleOnce is a Backend that, the first time a saga of kind starts,
// journals another event about its sandbox first: what a concurrent
// command's append looks like to a decision taken just before it.
type staleOnce struct {
	*memJournal
	kind  events.SagaKind
	other func(sandbox string) events.Payload
	done  bool
}

func (s *staleOnce) AppendExpect(ctx context.Context, expect []core.Expect, evs ...events.Event) ([]uint64, error) {
	if p, ok := evs[0].Payload.(events.SagaStartedEvent); ok && p.Kind == s.kind && !s.done {
		s.done = true
		e := events.New(ulid.Make(), time.Now(), evs[0].Sandbox, s.other(evs[0].Sandbox))
		if _, err := s.memJournal.Append(ctx, e); err != nil {
			return nil, err
		}
	}
	return s.memJournal.AppendExpect(ctx, expect, evs...)
}

// The guard's expectation: a decision taken on a sandbox the journal has
// since moved is refused by the journal; the command decides again on what
// moved it, and runs if the decision still holds or answers what changed.
func TestAStaleDecisionIsTakenAgain(t *testing.T) {
	t.Parallel()
	warning := func(string) events.Payload {
		return events.WarningRaisedEvent{Reason: "Test", Message: "an unrelated fact"}
	}
	stopped := func(string) events.Payload { return events.SandboxStoppedEvent{Reason: "stopped"} }
	cases := []struct {
		name  string
		other func(string) events.Payload
		is    error
		says  string
	}{
		{name: "still holds", other: warning},
		{name: "no longer holds", other: stopped, is: ErrAlready, says: "is already stopped"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			f := newFlow(t)
			sb := f.create(CreateSpec{})
			s := &staleOnce{memJournal: f.j, kind: events.SagaStop, other: c.other}
			f.m.B = s
			mark := f.j.mark()
			_, err := f.m.Stop(f.ctx, sb.ID)
			if c.is != nil {
				wantErr(t, err, c.is, c.says)
			} else if err != nil {
				t.Fatal(err)
			}
			evs := f.j.since(mark)
			// The refused start left nothing: one saga at most began.
			if n := len(ofType(evs, events.SagaStarted)); n > 1 || (c.is == nil) != (n == 1) {
				t.Fatalf("journaled %v: the stale start must be refused, and the retry run only if it still holds", types(evs))
			}
		})
	}
}

// Without the expectation the stale stop above would run on a sandbox
// another command already stopped; this is the refusal that prevents it.
func TestTheJournalRefusesAStaleExpectation(t *testing.T) {
	t.Parallel()
	f := newFlow(t)
	sb := f.create(CreateSpec{})
	e := events.New(ulid.Make(), time.Now(), sb.ID, events.WarningRaisedEvent{Reason: "Test"})
	_, err := f.j.AppendExpect(f.ctx, []core.Expect{{Entity: core.Sandbox(sb.ID), Seq: sb.Rev - 1}}, e)
	var stale *core.StaleError
	if !errors.As(err, &stale) || stale.Actual != sb.Rev {
		t.Fatalf("append expecting an old sequence: %v; want a StaleError at %d", err, sb.Rev)
	}
}

// A reader sees a VMM that died behind nexus's back as exited, by pid and
// start time, before anything journals it; nothing is deleted by seeing it.
func TestObserveExits(t *testing.T) {
	t.Parallel()
	f := newFlow(t)
	dead := f.create(CreateSpec{})
	live := f.create(CreateSpec{})
	kill(t, dead.VMM)
	mark := f.j.mark()
	list, _ := f.j.Sandboxes(f.ctx)
	seen := map[string]projections.State{}
	for _, sb := range ObserveExits(list) {
		seen[sb.ID] = sb.State
	}
	if seen[dead.ID] != projections.StateExited || seen[live.ID] != projections.StateRunning || f.j.mark() != mark {
		t.Fatalf("observed %v: want %s exited, %s running, nothing journaled", seen, dead.ID, live.ID)
	}
	if !f.exists("disks/" + dead.ID + ".raw") {
		t.Fatal("observing an exit deleted something")
	}
}

// Remove is what a sweep of a gone owner's sandboxes calls: forced, with
// its snapshots.
func TestRemoveForcedWithSnapshots(t *testing.T) {
	t.Parallel()
	f := newFlow(t)
	sb := f.create(CreateSpec{})
	snapshot(f, sb)
	if err := f.m.Remove(f.ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	if _, found := f.find(sb.ID); found || len(f.files("snapshots", "disks")) != 0 {
		t.Fatalf("left %v", f.files("snapshots", "disks"))
	}
}
