package lifecycle

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/oklog/ulid/v2"
	"golang.org/x/sys/unix"

	"github.com/nexus-sandbox/nexus/core"
	"github.com/nexus-sandbox/nexus/events"
	"github.com/nexus-sandbox/nexus/host/driver"
	"github.com/nexus-sandbox/nexus/host/fsx"
	"github.com/nexus-sandbox/nexus/host/intent"
	"github.com/nexus-sandbox/nexus/host/proc"
	"github.com/nexus-sandbox/nexus/host/sagalease"
	"github.com/nexus-sandbox/nexus/host/supervisor"
	"github.com/nexus-sandbox/nexus/host/vmm"
	"github.com/nexus-sandbox/nexus/layout"
	"github.com/nexus-sandbox/nexus/projections"
	"github.com/nexus-sandbox/nexus/sagas"
)

// RecoverReport lists what recover did, by sandbox or saga id.
type RecoverReport struct {
	InFlight    []string `json:"in_flight"`   // sagas whose creator still holds its lease: left alone
	Compensated []string `json:"compensated"` // sagas rolled back
	Resumed     []string `json:"resumed"`     // sagas finished
	Stopped     []string `json:"stopped"`     // sandboxes whose VMM was gone
	Restarted   []string `json:"restarted"`   // supervisors replaced (CA re-seeded)
	Killed      []string `json:"killed"`      // orphaned supervisors terminated
	Unpaused    []string `json:"unpaused"`    // VMs a crashed fork or snapshot left paused
	Intents     []string `json:"intents"`     // unjournaled intents whose covered files were removed (by sandbox; a staged one by its file name)
	// Skipped lists what recover left alone because a live process holds
	// its runner lease, or because a live VMM did not answer in time.
	Skipped []Skipped `json:"skipped"`
	// Checked counts the sandboxes checked against their processes: those
	// the store records a process of, and those an open saga concerned.
	// A stopped sandbox with neither is not looked at.
	Checked int `json:"checked"`
	// Leases counts the lease files no runner held that were removed.
	Leases int `json:"leases_cleared"`

	// disksRead counts the intent sweep's reads of disks/ (none when no
	// runner died), and intentsParsed the names it parsed and judged: the
	// intents, not every disk.
	disksRead, intentsParsed int
}

// Skipped is a saga or sandbox recover did not touch, and why.
type Skipped struct {
	Saga    string `json:"saga,omitempty"`
	Kind    string `json:"kind,omitempty"`
	Sandbox string `json:"sandbox,omitempty"`
	Reason  string `json:"reason"`
}

// Recover brings the state root back to what the journal says, after any
// crash: every unfinished saga is resumed or compensated, every sandbox the
// journal records a process of is checked by pid + start time and API
// socket, and supervisors are restarted or, when orphaned, killed. What it
// looks at comes from the store's indexes (open sagas, recorded
// processes) and from the lease files of runners that died, so it costs
// what is in flight, not the sandboxes the root holds. The lease files it
// followed are removed.
func (m *Manager) Recover(ctx context.Context) (rep RecoverReport, err error) {
	defer func() { err = recoverInterrupted(ctx, rep, err) }()
	rep = RecoverReport{InFlight: []string{}, Compensated: []string{}, Resumed: []string{}, Stopped: []string{},
		Restarted: []string{}, Killed: []string{}, Unpaused: []string{}, Intents: []string{}, Skipped: []Skipped{}}
	concerned, err := m.recoverSagas(ctx, &rep)
	if err != nil {
		return rep, err
	}
	if err := m.sweepIntents(ctx, &rep); err != nil {
		return rep, err
	}
	err = m.recoverSandboxes(ctx, &rep, concerned)
	return rep, err
}

// recoverInterrupted words an error of an interrupted recover: what it
// finished before the interruption (each saga it took on is resumed to
// its end or compensated whole), and that the next recover does the rest.
func recoverInterrupted(ctx context.Context, rep RecoverReport, err error) error {
	if err == nil || ctx.Err() == nil {
		return err
	}
	why := ""
	if errors.Is(err, sagas.ErrLeftOpen) {
		why = ": " + err.Error()
	}
	return fmt.Errorf("recover: %w after %d saga(s) resumed and %d compensated, %d sandbox(es) checked; run `nexus recover` again for the rest%s",
		context.Cause(ctx), len(rep.Resumed), len(rep.Compensated), rep.Checked, why)
}

// RecoverSagas resumes or compensates the open sagas whose runner lease is
// free, and removes the intents of creates that died before their saga
// started (a handle is never blocked by a create that no longer runs):
// what a daemon does as it starts.
func (m *Manager) RecoverSagas(ctx context.Context) (RecoverReport, error) {
	rep := RecoverReport{InFlight: []string{}, Compensated: []string{}, Resumed: []string{}, Intents: []string{}, Skipped: []Skipped{}}
	if _, err := m.recoverSagas(ctx, &rep); err != nil {
		return rep, err
	}
	return rep, m.sweepIntents(ctx, &rep)
}

// recoverSagas finishes the open sagas; it returns the sandboxes they
// concerned, which recover then checks against their processes.
func (m *Manager) recoverSagas(ctx context.Context, rep *RecoverReport) ([]string, error) {
	open, err := m.B.OpenSagas(ctx)
	if err != nil {
		return nil, err
	}
	var concerned []string
	for _, sg := range open {
		if sg.Sandbox != "" {
			concerned = append(concerned, sg.Sandbox)
		}
		// Only a saga whose runner lease is free is resumed or
		// compensated, and recover holds the lease while it does.
		entity := core.Reap
		switch {
		case sg.Sandbox != "":
			entity = core.Sandbox(sg.Sandbox)
		case volumeOfSaga(sg) != "":
			entity = core.Volume(volumeOfSaga(sg))
		}
		l, err := sagalease.Acquire(ctx, string(m.Root), string(entity), sagalease.Holder{Kind: "recover", Saga: sg.ID}, false)
		var held *sagalease.HeldError
		if errors.As(err, &held) {
			rep.InFlight = append(rep.InFlight, sg.ID)
			rep.Skipped = append(rep.Skipped, Skipped{Saga: sg.ID, Kind: string(sg.Kind), Sandbox: sg.Sandbox, Reason: "its runner is alive: " + held.By.String()})
			continue
		}
		if err != nil {
			return nil, err
		}
		// Read again under the lease: another recover may have finished
		// it between the list and the lease, or moved it on a step.
		fresh, still, err := m.openSaga(ctx, sg.ID)
		if err != nil || !still {
			l.Release()
			if err != nil {
				return nil, err
			}
			continue
		}
		err = m.recoverSaga(ctx, fresh, rep)
		l.Release()
		if err != nil {
			return nil, fmt.Errorf("recover saga %s (%s of %s): %w", sg.ID, sg.Kind, sg.Sandbox, err)
		}
	}
	return concerned, nil
}

// openSaga is saga id as the journal has it now, if it is still open.
func (m *Manager) openSaga(ctx context.Context, id string) (projections.OpenSaga, bool, error) {
	open, err := m.B.OpenSagas(ctx)
	if err != nil {
		return projections.OpenSaga{}, false, err
	}
	for _, sg := range open {
		if sg.ID == id {
			return sg, true, nil
		}
	}
	return projections.OpenSaga{}, false, nil
}

// recoverSandboxes checks against its processes each sandbox the store
// records a process of (its index, not a walk of every sandbox) and each
// of concerned, under its runner lease (one a command holds is skipped).
// A sandbox with neither has nothing recover could find: no process to
// judge, and whatever a crash left of a flow is its open saga's.
func (m *Manager) recoverSandboxes(ctx context.Context, rep *RecoverReport, concerned []string) error {
	live, err := m.B.WithProcesses(ctx)
	if err != nil {
		return err
	}
	ids := make([]string, 0, len(live)+len(concerned))
	for _, sb := range live {
		ids = append(ids, sb.ID)
	}
	for _, id := range concerned {
		if !slices.Contains(ids, id) {
			ids = append(ids, id)
		}
	}
	for _, id := range ids {
		l, err := sagalease.Acquire(ctx, string(m.Root), string(core.Sandbox(id)), sagalease.Holder{Kind: "recover"}, false)
		var held *sagalease.HeldError
		if errors.As(err, &held) {
			rep.Skipped = append(rep.Skipped, Skipped{Sandbox: id, Reason: "a command is running on it: " + held.By.String()})
			continue
		}
		if err != nil {
			return err
		}
		// Read under the lease: a command that just ended changed it.
		if fresh, ferr := m.Find(ctx, id); ferr == nil {
			rep.Checked++
			err = m.recoverSandbox(ctx, fresh, rep)
		}
		l.Release()
		if err != nil {
			return fmt.Errorf("recover sandbox %s: %w", id, err)
		}
	}
	return nil
}

// creatorAlive reports whether the process that ran a saga still holds its
// create intent's lease. Intents are published before saga.started, so a
// saga whose lease is free (or whose intent is gone) has no live creator.
func (m *Manager) creatorAlive(sandbox string) bool {
	held, err := intent.LeaseHeld(m.Root.CreateIntent(sandbox))
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return true // cannot tell, so assume it lives
	}
	return held
}

// recoverSaga gathers the evidence about an open saga, asks
// core.Recovery what to do with it, and does it.
func (m *Manager) recoverSaga(ctx context.Context, sg projections.OpenSaga, rep *RecoverReport) error {
	sb, findErr := m.Find(ctx, sg.Sandbox)
	ev := core.RecoveryEvidence{CreatorAlive: sg.Sandbox != "" && m.creatorAlive(sg.Sandbox),
		Found: findErr == nil, Snapshot: snapshotOfSaga(sg), Volume: volumeOfSaga(sg)}
	if ev.Found {
		ev.State = sb.State
	}
	if !ValidName(ev.Volume) {
		ev.Volume = ""
	}
	d := core.Recovery(sg, ev)
	var steps []sagas.Step
	switch d.Plan {
	case core.PlanClose:
	case core.PlanFinishCommitted:
		// recoverSandbox stops a VMM the crash left without an event.
		steps = []sagas.Step{m.retireLeftoverIntents(sb), m.stopUnrecorded(sb.ID), m.stopUnrecordedSupervisor(sb)}
	case core.PlanUndoUncommitted:
		steps = []sagas.Step{m.undoUncommitted(sg.Sandbox)}
	case core.PlanRemove:
		steps = m.removeSteps(sb)
	case core.PlanStop:
		steps = m.stopSteps(sb)
	case core.PlanUndoStart:
		// A private overlay copy an interrupted recovery left is dropped;
		// the original overlay (or the published one) is never touched.
		dropCopy := sagas.Step{Name: "overlay-copy", Undo: func(ctx context.Context) ([]events.Payload, error) { return m.dropStaging(ctx, sg.Sandbox) }}
		steps = []sagas.Step{dropCopy, m.stopUnrecorded(sg.Sandbox), {Name: "supervisor-stop", Undo: func(context.Context) ([]events.Payload, error) {
			if sb.Supervisor == nil {
				return m.killUnrecordedSupervisor(sg.Sandbox)
			}
			return m.stopSupervisor(proc.Identity{Pid: sb.Supervisor.Pid, StartTicks: sb.Supervisor.StartTicks})
		}}}
	case core.PlanDropCapture:
		steps = []sagas.Step{{Name: "capture", Undo: func(context.Context) ([]events.Payload, error) {
			return m.dropUnrecordedSnapshots(ctx, sb)
		}}}
	case core.PlanDeleteSnapshot:
		steps = m.snapshotRmSaga(sg.Sandbox, ev.Snapshot).Steps
	case core.PlanDeleteVolume:
		steps = m.volumeRmSaga(ev.Volume).Steps
	default:
		return fmt.Errorf("recovery plan %q has no steps", d.Plan)
	}
	done := map[string]bool{}
	for _, s := range sg.Done {
		done[s] = true
	}
	switch d.Action {
	case core.Leave:
		rep.InFlight = append(rep.InFlight, sg.ID)
		return nil
	case core.Resume:
		// A resumed saga only goes forward: an interruption or a failed
		// step leaves it open for the next recover, never closes it as
		// compensated with nothing undone.
		s := &sagas.Saga{ID: sg.ID, Kind: sg.Kind, Sandbox: sg.Sandbox, Steps: steps, Done: done, Hook: m.Hook, Forward: true}
		done[string(events.SagaStarted)] = true // never journal the start twice
		if err := s.Run(ctx, m.B); err != nil {
			return err
		}
		rep.Resumed = append(rep.Resumed, sg.ID)
		return nil
	case core.Compensate:
		s := &sagas.Saga{ID: sg.ID, Kind: sg.Kind, Sandbox: sg.Sandbox, Steps: steps, Hook: m.Hook}
		if err := s.Compensate(ctx, m.B, d.Reason); err != nil {
			return err
		}
		rep.Compensated = append(rep.Compensated, sg.ID)
		return nil
	default:
		return fmt.Errorf("recovery action %q", d.Action)
	}
}

// undoUncommitted is the compensation of a create-like saga whose creator
// died before commit: stop anything it spawned, delete everything it may
// have materialised (what the journal recorded, plus what its intents
// cover), then retire the intents.
func (m *Manager) undoUncommitted(id string) sagas.Step {
	return sagas.Step{Name: "materialise", Undo: func(ctx context.Context) ([]events.Payload, error) {
		var ps []events.Payload
		stopped, err := m.stopUnrecordedVMM(ctx, id)
		if err != nil {
			return nil, err
		}
		ps = append(ps, stopped...)
		more, err := m.killUnrecordedSupervisor(id)
		if err != nil {
			return ps, err
		}
		ps = append(ps, more...)
		sb, _ := m.Find(ctx, id)
		targets := map[string]events.Resource{}
		var order []string
		add := func(r events.Resource) {
			if _, ok := targets[r.Path]; !ok {
				targets[r.Path] = r
				order = append(order, r.Path)
			}
		}
		var intents []events.Resource
		for _, r := range sb.Resources {
			if r.Kind == events.KindCreateIntent || r.Kind == events.KindShadowIntent {
				intents = append(intents, r)
				continue
			}
			add(r)
		}
		for _, ip := range []string{m.Root.CreateIntent(id)} {
			in, err := intent.Read(ip)
			if err != nil {
				continue
			}
			if in.Sandbox != id {
				// Not this sandbox's marker: trust none of it, delete nothing.
				ps = append(ps, events.WarningRaisedEvent{Reason: "ForeignIntent", Message: fmt.Sprintf("%s names sandbox %q; nothing it covers was removed", m.rel(ip), in.Sandbox)})
				continue
			}
			for _, c := range in.Covers {
				if !layout.CoveredBy(c, id, in.Handle) {
					ps = append(ps, events.WarningRaisedEvent{Reason: "ForeignIntentCover", Message: fmt.Sprintf("%s covers %q, which is not a path of sandbox %s; kept", m.rel(ip), c, id)})
					continue
				}
				if owner := m.ownerOf(ctx, c, id); owner != "" {
					// Its saga did not make what another sandbox owns (item 5).
					ps = append(ps, events.WarningRaisedEvent{Reason: "ForeignIntentCover", Message: fmt.Sprintf("%s covers %q, which sandbox %s owns; kept", m.rel(ip), c, owner)})
					continue
				}
				n, _ := layout.Parse(c)
				add(events.Resource{Kind: n.Kind, Path: c})
			}
			if in.Handle != "" {
				intents = append(intents, m.res(events.KindShadowIntent, m.Root.ShadowIntent(in.Handle)))
			}
			intents = append(intents, m.res(events.KindCreateIntent, ip))
		}
		for _, r := range []events.Resource{m.res(events.KindAPISocket, m.Root.APISocket(id)), m.res(events.KindAPISocketLock, m.Root.APISocketLock(id)), m.res(events.KindVsockSocket, m.Root.VsockSocket(id)), m.res(events.KindIIDSocket, m.Root.IIDSocket(id))} {
			add(r)
		}
		for _, p := range order {
			r := targets[p]
			more, err := m.reclaim(r, sb.Owns(r.Path), "recover")
			if err != nil {
				return ps, err
			}
			ps = append(ps, more...)
		}
		seen := map[string]bool{}
		for _, r := range intents {
			if seen[r.Path] {
				continue
			}
			seen[r.Path] = true
			if err := intent.Retire(m.Root.Abs(r.Path)); err != nil {
				return ps, err
			}
			ps = append(ps, events.IntentRetiredEvent{Resource: r})
		}
		return ps, nil
	}}
}

// retireLeftoverIntents finishes a committed create whose creator died
// before retiring its markers.
func (m *Manager) retireLeftoverIntents(sb projections.Sandbox) sagas.Step {
	return sagas.Step{Name: "retire-intents", Do: func(context.Context) ([]events.Payload, error) {
		var ps []events.Payload
		for _, r := range sb.Resources {
			if r.Kind != events.KindCreateIntent && r.Kind != events.KindShadowIntent {
				continue
			}
			if err := intent.Retire(m.Root.Abs(r.Path)); err != nil {
				return ps, err
			}
			ps = append(ps, events.IntentRetiredEvent{Resource: r})
		}
		return ps, nil
	}}
}

// stopUnrecorded stops a VMM that answers on the sandbox's socket although
// the journal never recorded it starting (a crash between spawn and event).
func (m *Manager) stopUnrecorded(id string) sagas.Step {
	do := func(ctx context.Context) ([]events.Payload, error) { return m.stopUnrecordedVMM(ctx, id) }
	return sagas.Step{Name: "recover.vmm", Do: do, Undo: do}
}

func (m *Manager) stopUnrecordedVMM(ctx context.Context, id string) ([]events.Payload, error) {
	sb, err := m.Find(ctx, id)
	if err == nil && sb.State == projections.StateRunning {
		return nil, nil // recorded: recoverSandbox judges it
	}
	c := vmm.NewClient(m.Root.APISocket(id))
	pctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	if _, err := c.Ping(pctx); err != nil {
		if vmm.IsDead(err) {
			if err := m.killStartingVMM(id); err != nil {
				return nil, err
			}
			return m.reclaimFreeAPILock(sb, id)
		}
		return nil, fmt.Errorf("VMM socket of %s is ambiguous, not touching it: %w", id, err)
	}
	c.Shutdown(pctx)
	c.ShutdownVMM(pctx)
	if err := waitGone(ctx, func() bool {
		_, err := c.Ping(pctx)
		return vmm.IsDead(err)
	}); err != nil {
		return nil, fmt.Errorf("VMM of %s: %w", id, err)
	}
	// The socket goes before the process: its lock (CH v53+) is released
	// only when the process is gone.
	if err := waitGone(ctx, func() bool {
		held, err := vmm.APISocketLockHeld(m.Root.APISocketLock(id))
		return err != nil || !held
	}); err != nil {
		return nil, fmt.Errorf("VMM of %s: its API socket lock: %w", id, err)
	}
	return m.reclaimFreeAPILock(sb, id)
}

// killStartingVMM terminates a VMM spawned just before its creator died
// that does not answer yet (on a busy host a VMM can take seconds to bind its
// socket, and would bind it after recover cleaned up, outliving the
// sandbox). As for an unrecorded supervisor, it is found by the command
// line boot gave it (driver.VMMs), for any driver, so only a process
// started for this sandbox's socket is hit.
func (m *Manager) killStartingVMM(id string) error {
	for _, pid := range driver.VMMs(m.Root.APISocket(id)) {
		who, err := proc.Of(pid)
		if err != nil {
			continue // gone meanwhile
		}
		if err := proc.Terminate(who, 5*time.Second); err != nil {
			return fmt.Errorf("VMM of %s starting as pid %d: %w", id, pid, err)
		}
	}
	return nil
}

// reclaimFreeAPILock removes the API socket's lock file (CH v53+) that an
// unrecorded VMM left, once no process holds its lock: CH keeps the lock
// for its whole life, so a free lock means no VMM of this path runs.
func (m *Manager) reclaimFreeAPILock(sb projections.Sandbox, id string) ([]events.Payload, error) {
	path := m.Root.APISocketLock(id)
	held, err := vmm.APISocketLockHeld(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil || held {
		return nil, err
	}
	return m.reclaim(m.res(events.KindAPISocketLock, path), sb.Owns(m.rel(path)), "recover")
}

// killUnrecordedSupervisor terminates a supervisor the journal never saw
// start: it answers on its socket with its pid.
func (m *Manager) killUnrecordedSupervisor(id string) ([]events.Payload, error) {
	pctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	pids := []int{}
	if info, err := supervisor.Ping(pctx, m.Root.SupervisorDir(id)); err == nil && info.PID != 0 {
		pids = append(pids, info.PID)
	} else {
		// One spawned just before its creator died may not answer yet (and
		// would bind its sockets after we cleaned up): find it by the
		// command line boot gave it.
		pids = supervisor.Processes(id, m.Root.SupervisorDir(id))
	}
	var ps []events.Payload
	for _, pid := range pids {
		who, err := proc.Of(pid)
		if err != nil {
			continue
		}
		if err := proc.Terminate(who, 5*time.Second); err != nil {
			return ps, err
		}
		ps = append(ps, events.SupervisorStoppedEvent{Pid: who.Pid, Reason: "orphaned"})
	}
	return ps, nil
}

// stopUnrecordedSupervisor kills a supervisor spawned by a crashed boot
// before the journal recorded it, and removes the IID socket it served.
func (m *Manager) stopUnrecordedSupervisor(sb projections.Sandbox) sagas.Step {
	return sagas.Step{Name: "recover.supervisor", Do: func(context.Context) ([]events.Payload, error) {
		if sb.Supervisor != nil {
			return nil, nil // recorded: recoverSandbox judges it
		}
		ps, err := m.killUnrecordedSupervisor(sb.ID)
		if err != nil {
			return ps, err
		}
		more, err := m.reclaim(m.res(events.KindIIDSocket, m.Root.IIDSocket(sb.ID)), false, "recover")
		return append(ps, more...), err
	}}
}

func waitGone(ctx context.Context, gone func() bool) error {
	deadline := time.Now().Add(10 * time.Second)
	for delay := 2 * time.Millisecond; !gone(); delay = min(2*delay, 100*time.Millisecond) {
		if time.Now().After(deadline) {
			return errors.New("still answering after shutdown")
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(delay):
		}
	}
	return nil
}

func (m *Manager) dropUnrecordedSnapshots(ctx context.Context, sb projections.Sandbox) ([]events.Payload, error) {
	entries, err := m.readDir(m.Root.SnapshotsOf(sb.ID))
	if err != nil {
		return nil, nil
	}
	var ps []events.Payload
	for _, e := range entries {
		rel := m.rel(m.Root.Snapshot(sb.ID, e.Name()))
		if sb.Owns(rel) || e.Name() == "restore" {
			continue
		}
		more, err := m.reclaim(events.Resource{Kind: events.KindSnapshot, Path: rel}, false, "recover")
		if err != nil {
			return ps, err
		}
		ps = append(ps, more...)
	}
	more, err := m.dropEmptySnapshotsDir(sb, "recover")
	return append(ps, more...), err
}

// dropEmptySnapshotsDir removes snapshots/<id>/ when the journal does not
// own it: the capture step creates it itself for a sandbox's first
// snapshot, so an uncommitted capture must drop it too, but only while it
// is empty (rmdir cannot take a concurrent capture's directory).
func (m *Manager) dropEmptySnapshotsDir(sb projections.Sandbox, by string) ([]events.Payload, error) {
	parent := m.rel(m.Root.SnapshotsOf(sb.ID))
	if sb.Owns(parent) {
		return nil, nil
	}
	switch err := fsx.RemoveEmptyDir(string(m.Root), parent); {
	case err == nil:
		return sagas.One(events.ResourceReclaimedEvent{Resource: events.Resource{Kind: events.KindSnapshot, Path: parent}, By: by}), nil
	case errors.Is(err, os.ErrNotExist), errors.Is(err, unix.ENOTEMPTY):
		return nil, nil
	default:
		return nil, err
	}
}

// sweepIntents handles create intents that reached the disk but not the
// journal (a crash between publishing the marker and saga.started): their
// lease is free, no sandbox exists, so what they cover is removed. Such an
// intent is in no index (the journal never heard of it), but its creator
// left a trace: the lease file of the sandbox it was creating, which a
// creator makes durable before its first intent and removes only once its
// intents are journaled or retired (holdNew, dropIntents). So disks/ is
// read only when leases/ holds a file no one holds, a runner that died
// (or a root from before the rule): with none, no create has left an
// intent, and the sweep costs the files of leases/, not the disks of the
// root. Read, disks/ is listed once, by name alone, and only the names
// that can be intents are parsed and judged. Once every intent is judged,
// the traces it followed are removed; one whose lease could not be probed
// keeps them, so the next recover looks again.
func (m *Manager) sweepIntents(ctx context.Context, rep *RecoverReport) error {
	traces, err := sagalease.Leftovers(string(m.Root))
	if err != nil {
		return err
	}
	if len(traces) == 0 {
		return nil
	}
	names, err := m.intentNames()
	switch {
	case errors.Is(err, os.ErrNotExist):
		names = nil // no disk yet, so no intent
	case err != nil:
		return nil // the traces stay for the next recover
	}
	rep.disksRead++
	rep.intentsParsed += len(names)
	var shadows []string
	unsure := false
	for _, name := range names {
		n := layout.ParseEntry("disks", name, false)
		if n.Staged {
			if err := m.sweepStaged(name, rep, &unsure); err != nil {
				return err
			}
			continue
		}
		switch {
		case n.Kind == events.KindShadowIntent && !n.Unparsed:
			shadows = append(shadows, name)
			continue
		case n.Kind != events.KindCreateIntent:
			continue
		}
		id := n.ID
		// One point lookup per intent found: a journaled sandbox is its
		// saga's (or done), not this sweep's.
		if _, known, err := m.B.Sandbox(ctx, id); err != nil || known {
			if err != nil {
				return err
			}
			continue
		}
		// A held lease is a creator still running, which retires its own
		// intents or, dying, leaves its own trace.
		if held, err := intent.LeaseHeld(filepath.Join(m.Root.Disks(), name)); err != nil || held {
			unsure = unsure || (err != nil && !errors.Is(err, os.ErrNotExist))
			continue
		}
		// A marker nexus published is whole (intent.Publish renames it
		// into place): one that cannot be read is no create's, and it is
		// left, with every path named after its sandbox, to the reaper.
		if _, err := intent.Read(filepath.Join(m.Root.Disks(), name)); err != nil {
			continue
		}
		s := &sagas.Saga{ID: ulid.Make().String(), Kind: events.SagaRecover, Sandbox: id, Steps: []sagas.Step{m.undoUncommitted(id)}, Hook: m.Hook}
		if err := s.Begin(ctx, m.B); err != nil {
			return err
		}
		if err := s.Compensate(ctx, m.B, "intent without a journaled saga"); err != nil {
			return err
		}
		rep.Intents = append(rep.Intents, id)
	}
	// After the create intents: one swept above may have taken its shadow
	// intent with it, and one left answers for its shadow intent.
	if err := m.sweepShadowIntents(ctx, rep, shadows, &unsure); err != nil {
		return err
	}
	if unsure {
		return nil
	}
	n, err := sagalease.Clear(string(m.Root), traces)
	rep.Leases += n
	return err
}

// intentNames are the names in disks/ that can be intents (final or
// staged), sorted: the directory read by name, its other entries neither
// stat'ed, kept nor sorted.
func (m *Manager) intentNames() ([]string, error) {
	out, err := fsx.NamesMatching(string(m.Root), m.Root.Disks(), layout.MayBeIntent)
	slices.Sort(out)
	return out, err
}

// sweepShadowIntents retires a shadow intent left alone by a creator that
// died before its saga started (between publishing it and the create
// intent, or after the create intent was swept): its lease is free, the
// journal knows no sandbox of its name, and no create intent answers for
// it. It covers nothing, so the marker is all there is to remove. names
// are the shadow intents sweepIntents found; one gone since is skipped
// (its lease cannot be probed).
func (m *Manager) sweepShadowIntents(ctx context.Context, rep *RecoverReport, names []string, unsure *bool) error {
	for _, name := range names {
		n := layout.ParseEntry("disks", name, false)
		path := filepath.Join(m.Root.Disks(), name)
		if held, err := intent.LeaseHeld(path); err != nil || held {
			*unsure = *unsure || (err != nil && !errors.Is(err, os.ErrNotExist))
			continue
		}
		in, err := intent.Read(path)
		if err != nil || in.Sandbox == "" || layout.SafeHandle(in.Handle) != n.Handle {
			continue
		}
		if _, known, err := m.B.Sandbox(ctx, in.Sandbox); err != nil || known {
			if err != nil {
				return err
			}
			continue
		}
		if ok, err := fsx.Lexists(string(m.Root), layout.CreateIntentRel(in.Sandbox)); err != nil || ok {
			continue
		}
		if err := intent.Retire(path); err != nil {
			return err
		}
		rep.Intents = append(rep.Intents, name)
	}
	return nil
}

// sweepStaged removes an intent whose creator died staging it (between
// intent.Publish's create and its rename; a fork copying children
// concurrently can be killed there). Never published, it covers nothing:
// a creator makes nothing before its intent is in place. Its flock is
// taken while staged, so a held lease is a creator still running, and a
// probe that cannot tell keeps it for the reaper to judge.
func (m *Manager) sweepStaged(name string, rep *RecoverReport, unsure *bool) error {
	path := filepath.Join(m.Root.Disks(), name)
	if held, err := intent.LeaseHeld(path); err != nil || held {
		*unsure = *unsure || (err != nil && !errors.Is(err, os.ErrNotExist))
		return nil
	}
	if err := intent.Retire(path); err != nil {
		return err
	}
	rep.Intents = append(rep.Intents, name)
	return nil
}

// recoverSandbox checks a committed sandbox against its processes.
func (m *Manager) recoverSandbox(ctx context.Context, sb projections.Sandbox, rep *RecoverReport) error {
	if sb.State == projections.StateCreating {
		return nil
	}
	var steps []sagas.Step
	vmmAlive := false
	if sb.VMM != nil {
		who := proc.Identity{Pid: sb.VMM.Pid, StartTicks: sb.VMM.StartTicks}
		alive, _ := proc.Alive(who)
		if alive {
			c := vmm.NewClient(m.Root.APISocket(sb.ID))
			pctx, cancel := context.WithTimeout(ctx, 2*time.Second)
			info, err := c.Info(pctx)
			if err == nil && info.State == "Paused" {
				if c.Resume(pctx) == nil {
					rep.Unpaused = append(rep.Unpaused, sb.ID)
				}
			}
			cancel()
			// Its pid and start time say it lives: slow to answer is not
			// dead, so it is never killed or called stopped here.
			vmmAlive = true
			if err != nil {
				rep.Skipped = append(rep.Skipped, Skipped{Sandbox: sb.ID, Reason: fmt.Sprintf("its VMM (pid %d) is alive but its API did not answer: %v", who.Pid, err)})
			}
		}
		if !vmmAlive {
			steps = append(steps, sagas.Step{Name: "vmm-gone", Do: func(context.Context) ([]events.Payload, error) {
				ps := []events.Payload{events.SandboxStoppedEvent{Reason: "vmm-gone"}}
				for _, r := range []events.Resource{m.res(events.KindAPISocket, m.Root.APISocket(sb.ID)), m.res(events.KindAPISocketLock, m.Root.APISocketLock(sb.ID)), m.res(events.KindVsockSocket, m.Root.VsockSocket(sb.ID))} {
					more, err := m.reclaim(r, r.Kind != events.KindAPISocketLock || sb.Owns(r.Path), "recover")
					if err != nil {
						return ps, err
					}
					ps = append(ps, more...)
				}
				return ps, nil
			}})
			rep.Stopped = append(rep.Stopped, sb.ID)
		}
	}
	if sb.Supervisor != nil {
		who := proc.Identity{Pid: sb.Supervisor.Pid, StartTicks: sb.Supervisor.StartTicks}
		alive, _ := proc.Alive(who)
		switch {
		case vmmAlive && !alive:
			// The replacement is seeded with the persisted CA, so the
			// guest's trust anchor keeps working.
			steps = append(steps, sagas.Step{Name: "supervisor-restart", Do: func(ctx context.Context) ([]events.Payload, error) {
				ps := []events.Payload{events.SupervisorStoppedEvent{Pid: who.Pid, Reason: "gone"}}
				next, err := m.startSupervisor(ctx, sb.ID)
				if err != nil {
					return ps, err
				}
				stateDir := m.Root.SupervisorDir(sb.ID)
				return append(ps, events.SupervisorStartedEvent{Pid: next.Pid, Start: next.StartTicks,
					Socket: m.rel(filepath.Join(stateDir, supervisor.SocketName)), StateDir: m.res(events.KindSupervisorState, stateDir)}), nil
			}})
			rep.Restarted = append(rep.Restarted, sb.ID)
		case !vmmAlive:
			// A supervisor whose sandbox no longer runs is an orphan nothing
			// else stops: kill it, but only if pid AND start time still
			// match (a reused pid is someone else).
			steps = append(steps, sagas.Step{Name: "supervisor-orphan", Do: func(context.Context) ([]events.Payload, error) {
				if alive {
					rep.Killed = append(rep.Killed, sb.ID)
				}
				ps, err := m.stopSupervisor(who)
				if err != nil {
					return ps, err
				}
				more, err := m.reclaim(m.res(events.KindIIDSocket, m.Root.IIDSocket(sb.ID)), sb.Owns(m.rel(m.Root.IIDSocket(sb.ID))), "recover")
				return append(ps, more...), err
			}})
		}
	}
	// A boot killed between writing its logs and journaling them left
	// them owned by name only: journal them now.
	if len(m.logClaims(sb)) > 0 {
		steps = append(steps, sagas.Step{Name: "claim-logs", Do: func(context.Context) ([]events.Payload, error) {
			return m.logClaims(sb), nil
		}})
	}
	if len(steps) == 0 {
		return nil
	}
	return m.saga(events.SagaRecover, sb.ID, steps).Run(ctx, m.B)
}
