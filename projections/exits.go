package projections

import (
	"fmt"

	"github.com/nexus-sandbox/nexus/events"
)

// Condition types, and the reasons an exit or a readiness wait sets.
const (
	ConditionReady      = "Ready"
	ConditionSupervisor = "Supervisor"
	ReasonVMMExited     = "VMMExited"
	ReasonSupExited     = "SupervisorExited"
	// ReasonAgentNotReady: the guest agent did not answer in time; the
	// sandbox runs on (sandbox.not_ready).
	ReasonAgentNotReady = "AgentNotReady"
	// ReasonBooting and ReasonNotRunning are Readiness's answers for a
	// sandbox without a Ready=False condition: they are never journaled.
	ReasonBooting    = "Booting"
	ReasonNotRunning = "NotRunning"
)

// Role names which recorded process of a sandbox ended.
type Role string

const (
	RoleVMM        Role = "vmm"
	RoleSupervisor Role = "supervisor"
)

// Watched is one recorded process the journal says still runs.
type Watched struct {
	Sandbox string
	Role    Role
	Process Process
}

// Watched lists the recorded processes of sb that the journal says still
// run: what an exit watcher watches.
// HasProcess says the sandbox records a VMM or a supervisor, running or
// exited: what recover checks against the host (a stop clears both).
func (sb *Sandbox) HasProcess() bool { return sb.VMM != nil || sb.Supervisor != nil }

func (sb *Sandbox) Watched() []Watched {
	var out []Watched
	if sb.VMM != nil && !sb.VMM.Exited {
		out = append(out, Watched{Sandbox: sb.ID, Role: RoleVMM, Process: Process{Pid: sb.VMM.Pid, StartTicks: sb.VMM.StartTicks}})
	}
	if sb.Supervisor != nil && !sb.Supervisor.Exited {
		out = append(out, Watched{Sandbox: sb.ID, Role: RoleSupervisor, Process: Process{Pid: sb.Supervisor.Pid, StartTicks: sb.Supervisor.StartTicks}})
	}
	return out
}

// stoppingSagas are the saga kinds that stop, replace or undo a sandbox's
// own processes and journal what they did. An exit seen while one of them
// is open on the sandbox is that saga's doing (or is settled by it, and by
// recover if its runner dies), so a watcher does not journal it again.
var stoppingSagas = map[events.SagaKind]bool{
	events.SagaStop: true, events.SagaRm: true, events.SagaRecover: true, events.SagaStart: true,
	events.SagaCreate: true, events.SagaFork: true, events.SagaRestore: true,
}

// JudgeExit decides whether a watcher that saw w's process end journals
// it, from the journal's view at that moment (sb nil: the sandbox is gone
// from the view). It journals only an exit nothing else accounts for: the
// sandbox still records exactly that process (pid and start time) as
// running, and no saga that stops processes is open on it. Otherwise it
// says why not.
func JudgeExit(sb *Sandbox, open []*OpenSaga, w Watched) (bool, string) {
	if sb == nil {
		return false, "sandbox removed"
	}
	var rec *Process
	switch w.Role {
	case RoleVMM:
		rec = sb.VMM
	case RoleSupervisor:
		rec = sb.Supervisor
	default:
		return false, fmt.Sprintf("unknown role %q", w.Role)
	}
	if rec == nil || rec.Pid != w.Process.Pid || rec.StartTicks != w.Process.StartTicks {
		return false, fmt.Sprintf("the journal no longer records %s pid %d as running", w.Role, w.Process.Pid)
	}
	if rec.Exited {
		return false, fmt.Sprintf("the exit of %s pid %d is already journaled", w.Role, w.Process.Pid)
	}
	for _, sg := range open {
		if sg.Sandbox == sb.ID && stoppingSagas[sg.Kind] {
			return false, fmt.Sprintf("%s saga %s of the sandbox is open: it accounts for the exit", sg.Kind, sg.ID)
		}
	}
	return true, ""
}

// ExitPayload is the event that journals w's exit.
func ExitPayload(w Watched, x events.ProcessExit) events.Payload {
	x.Pid, x.StartTicks = w.Process.Pid, w.Process.StartTicks
	if w.Role == RoleSupervisor {
		return events.SupervisorExitedEvent(x)
	}
	return events.VMMExitedEvent(x)
}

// ObserveGone returns sb as a reader shows it when pid + start time say
// its recorded VMM (vmmGone) or supervisor (supGone) no longer runs
// although no exit was journaled (no daemon watched it). It is derived,
// never journaled, and shares nothing mutable with sb.
func (sb Sandbox) ObserveGone(vmmGone, supGone bool) Sandbox {
	note := "seen by pid + start time at read time; not journaled"
	if vmmGone && sb.VMM != nil && !sb.VMM.Exited {
		sb.vmmExited(events.ProcessExit{Pid: sb.VMM.Pid, StartTicks: sb.VMM.StartTicks, Status: events.ExitUnknown}, note)
	}
	if supGone && sb.Supervisor != nil && !sb.Supervisor.Exited {
		sb.supervisorExited(events.ProcessExit{Pid: sb.Supervisor.Pid, StartTicks: sb.Supervisor.StartTicks, Status: events.ExitUnknown}, note)
	}
	return sb
}

// vmmExited marks the recorded VMM exited, if the exit is of that very
// process: a late exit of an older run must not touch a newer one. The
// process record is replaced, never written through, as readers may hold
// copies of it.
func (sb *Sandbox) vmmExited(x events.ProcessExit, note string) {
	if sb.VMM == nil || sb.VMM.Pid != x.Pid || sb.VMM.StartTicks != x.StartTicks || sb.VMM.Exited {
		return
	}
	sb.VMM = &Process{Pid: x.Pid, StartTicks: x.StartTicks, Exited: true}
	if sb.State == StateRunning {
		sb.State = StateExited
	}
	sb.setCondition(Condition{Type: ConditionReady, Status: "False", Reason: ReasonVMMExited, Message: exitMessage("VMM", x, note)})
}

func (sb *Sandbox) supervisorExited(x events.ProcessExit, note string) {
	if sb.Supervisor == nil || sb.Supervisor.Pid != x.Pid || sb.Supervisor.StartTicks != x.StartTicks || sb.Supervisor.Exited {
		return
	}
	sb.Supervisor = &Process{Pid: x.Pid, StartTicks: x.StartTicks, Exited: true}
	sb.setCondition(Condition{Type: ConditionSupervisor, Status: "False", Reason: ReasonSupExited, Message: exitMessage("supervisor", x, note)})
}

func exitMessage(what string, x events.ProcessExit, note string) string {
	var how string
	switch x.Status {
	case events.ExitExited:
		how = fmt.Sprintf("exited with status %d", x.Code)
	case events.ExitKilled:
		how = "killed by " + x.Signal
	default:
		how = "exited (status unknown)"
	}
	msg := fmt.Sprintf("%s pid %d %s", what, x.Pid, how)
	if note != "" {
		msg += " (" + note + ")"
	}
	return msg
}

// setCondition replaces the condition of c's type, in a new slice.
func (sb *Sandbox) setCondition(c Condition) {
	out := make([]Condition, 0, len(sb.Conditions)+1)
	for _, old := range sb.Conditions {
		if old.Type != c.Type {
			out = append(out, old)
		}
	}
	sb.Conditions = append(out, c)
}

// dropCondition removes the condition of type t, in a new slice.
func (sb *Sandbox) dropCondition(t string) {
	var out []Condition
	for _, old := range sb.Conditions {
		if old.Type != t {
			out = append(out, old)
		}
	}
	sb.Conditions = out
}
