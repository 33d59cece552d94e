package projections

import (
	"strings"
	"testing"
	"time"

	"github.com/oklog/ulid/v2"

	"github.com/nexus-sandbox/nexus/events"
)

const exitSB = "01JDQ4Z6X1M9A3Y0C5TB2R8NKW"

func exitEv(i int, p events.Payload) events.Event {
	at := t0.Add(time.Duration(i) * time.Millisecond)
	return events.New(ulid.MustNew(ulid.Timestamp(at), ulid.DefaultEntropy()), at, exitSB, p)
}

// running is a committed sandbox whose VMM (pid 100, start 10) and
// supervisor (pid 200, start 20) the journal records as started.
func running() []events.Payload {
	return []events.Payload{
		events.SandboxCreatedEvent{Image: "base", Driver: "process"},
		events.SupervisorStartedEvent{Pid: 200, Start: 20, StateDir: events.Resource{Kind: events.KindSupervisorState, Path: "supervisors/" + exitSB}},
		events.SandboxStartedEvent{Driver: "process", VMMPid: 100, VMMStart: 10},
	}
}

func foldExit(ps []events.Payload) *Sandbox {
	v := NewSandboxes()
	for i, p := range ps {
		v.Apply(uint64(i+1), exitEv(i, p))
	}
	return v.Get(exitSB)
}

func TestExitsFold(t *testing.T) {
	vmmKilled := events.VMMExitedEvent{Pid: 100, StartTicks: 10, Status: events.ExitKilled, Code: 9, Signal: "SIGKILL", By: "daemon"}
	supGone := events.SupervisorExitedEvent{Pid: 200, StartTicks: 20, Status: events.ExitUnknown, By: "daemon"}
	type want struct {
		state       State
		vmmExited   bool
		vmmNil      bool
		supExited   bool
		supPid      int
		conditions  []string // Type=Reason
		messagePart string
	}
	cases := []struct {
		name string
		then []events.Payload
		want want
	}{
		{"running", nil, want{state: StateRunning, supPid: 200}},
		{"vmm exit: exited, nothing dropped", []events.Payload{vmmKilled},
			want{state: StateExited, vmmExited: true, supPid: 200, conditions: []string{"Ready=VMMExited"}, messagePart: "VMM pid 100 killed by SIGKILL"}},
		{"exit of another pid ignored", []events.Payload{events.VMMExitedEvent{Pid: 101, StartTicks: 10, Status: events.ExitUnknown}},
			want{state: StateRunning, supPid: 200}},
		{"exit of a reused pid (other start time) ignored", []events.Payload{events.VMMExitedEvent{Pid: 100, StartTicks: 11, Status: events.ExitUnknown}},
			want{state: StateRunning, supPid: 200}},
		{"exit of an older run does not touch the newer one", []events.Payload{
			events.SandboxStoppedEvent{}, events.SandboxStartedEvent{Driver: "process", VMMPid: 300, VMMStart: 30}, vmmKilled},
			want{state: StateRunning, supPid: 200}},
		{"exit journaled twice folds once", []events.Payload{vmmKilled, events.VMMExitedEvent{Pid: 100, StartTicks: 10, Status: events.ExitUnknown}},
			want{state: StateExited, vmmExited: true, supPid: 200, conditions: []string{"Ready=VMMExited"}, messagePart: "SIGKILL"}},
		{"status unknown", []events.Payload{events.VMMExitedEvent{Pid: 100, StartTicks: 10, Status: events.ExitUnknown}},
			want{state: StateExited, vmmExited: true, supPid: 200, conditions: []string{"Ready=VMMExited"}, messagePart: "status unknown"}},
		{"exit code", []events.Payload{events.VMMExitedEvent{Pid: 100, StartTicks: 10, Status: events.ExitExited, Code: 3}},
			want{state: StateExited, vmmExited: true, supPid: 200, conditions: []string{"Ready=VMMExited"}, messagePart: "exited with status 3"}},
		{"stop after the exit: stopped", []events.Payload{vmmKilled, events.SandboxStoppedEvent{Reason: "vmm-gone"}},
			want{state: StateStopped, vmmNil: true, supPid: 200, conditions: []string{"Ready=VMMExited"}}},
		{"start after the exit clears it", []events.Payload{vmmKilled, events.SandboxStoppedEvent{}, events.SandboxStartedEvent{Driver: "process", VMMPid: 300, VMMStart: 30}},
			want{state: StateRunning, supPid: 200}},
		{"supervisor exit: still running, condition", []events.Payload{supGone},
			want{state: StateRunning, supExited: true, supPid: 200, conditions: []string{"Supervisor=SupervisorExited"}, messagePart: "supervisor pid 200 exited (status unknown)"}},
		{"both", []events.Payload{supGone, vmmKilled},
			want{state: StateExited, vmmExited: true, supExited: true, supPid: 200, conditions: []string{"Supervisor=SupervisorExited", "Ready=VMMExited"}}},
		{"replaced supervisor clears its condition", []events.Payload{supGone, events.SupervisorStoppedEvent{Pid: 200}, events.SupervisorStartedEvent{Pid: 201, Start: 21}},
			want{state: StateRunning, supPid: 201}},
		{"failed after exit keeps error", []events.Payload{vmmKilled, events.SandboxFailedEvent{Reason: "X", Message: "m"}},
			want{state: StateError, vmmNil: true, supPid: 200, conditions: []string{"Ready=X"}}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			sb := foldExit(append(running(), c.then...))
			if sb == nil {
				t.Fatal("sandbox left the view: an exit must delete nothing")
			}
			if sb.State != c.want.state {
				t.Errorf("state %s, want %s", sb.State, c.want.state)
			}
			if c.want.vmmNil != (sb.VMM == nil) {
				t.Fatalf("VMM %+v, want nil=%v", sb.VMM, c.want.vmmNil)
			}
			if sb.VMM != nil && sb.VMM.Exited != c.want.vmmExited {
				t.Errorf("VMM exited=%v, want %v", sb.VMM.Exited, c.want.vmmExited)
			}
			if sb.Supervisor == nil || sb.Supervisor.Pid != c.want.supPid || sb.Supervisor.Exited != c.want.supExited {
				t.Errorf("supervisor %+v, want pid %d exited=%v", sb.Supervisor, c.want.supPid, c.want.supExited)
			}
			var got []string
			var msgs string
			for _, cond := range sb.Conditions {
				got = append(got, cond.Type+"="+cond.Reason)
				msgs += cond.Message + "\n"
			}
			if strings.Join(got, ",") != strings.Join(c.want.conditions, ",") {
				t.Errorf("conditions %v, want %v", got, c.want.conditions)
			}
			if !strings.Contains(msgs, c.want.messagePart) {
				t.Errorf("condition messages %q lack %q", msgs, c.want.messagePart)
			}
			if !sb.Owns("supervisors/" + exitSB) {
				t.Error("the supervisor state dir is no longer owned: an exit must release nothing")
			}
		})
	}
}

func TestJudgeExit(t *testing.T) {
	vmm := Watched{Sandbox: exitSB, Role: RoleVMM, Process: Process{Pid: 100, StartTicks: 10}}
	sup := Watched{Sandbox: exitSB, Role: RoleSupervisor, Process: Process{Pid: 200, StartTicks: 20}}
	open := func(kind events.SagaKind, sandbox string) []*OpenSaga {
		return []*OpenSaga{{ID: "saga-1", Kind: kind, Sandbox: sandbox}}
	}
	other := "01JDQ4Z6X1M9A3Y0C5TB2R8NKX"
	cases := []struct {
		name    string
		history []events.Payload // after running(); nil sandbox if it holds SandboxRemoved
		open    []*OpenSaga
		w       Watched
		journal bool
		why     string
	}{
		{"vmm died, nothing open", nil, nil, vmm, true, ""},
		{"supervisor died, nothing open", nil, nil, sup, true, ""},
		{"another sandbox's stop is open", nil, open("stop", other), vmm, true, ""},
		{"a snapshot saga does not stop processes", nil, open("snapshot", exitSB), vmm, true, ""},
		{"stop open: its own doing", nil, open("stop", exitSB), vmm, false, "stop saga"},
		{"rm open", nil, open("rm", exitSB), sup, false, "rm saga"},
		{"recover open", nil, open("recover", exitSB), sup, false, "recover saga"},
		{"start open", nil, open("start", exitSB), vmm, false, "start saga"},
		{"create open", nil, open("create", exitSB), sup, false, "create saga"},
		{"fork open", nil, open("fork", exitSB), vmm, false, "fork saga"},
		{"restore open", nil, open("restore", exitSB), vmm, false, "restore saga"},
		{"already stopped", []events.Payload{events.SandboxStoppedEvent{}}, nil, vmm, false, "no longer records"},
		{"supervisor already stopped", []events.Payload{events.SupervisorStoppedEvent{Pid: 200}}, nil, sup, false, "no longer records"},
		{"a newer VMM is recorded", []events.Payload{events.SandboxStoppedEvent{}, events.SandboxStartedEvent{VMMPid: 100, VMMStart: 99}}, nil, vmm, false, "no longer records"},
		{"already journaled", []events.Payload{events.VMMExitedEvent{Pid: 100, StartTicks: 10}}, nil, vmm, false, "already journaled"},
		{"removed", []events.Payload{events.SandboxRemovedEvent{}}, nil, vmm, false, "removed"},
		{"unknown role", nil, nil, Watched{Sandbox: exitSB, Role: "ghost", Process: Process{Pid: 100, StartTicks: 10}}, false, "unknown role"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			sb := foldExit(append(running(), c.history...))
			journal, why := JudgeExit(sb, c.open, c.w)
			if journal != c.journal || !strings.Contains(why, c.why) || (journal && why != "") {
				t.Fatalf("JudgeExit = %v, %q; want %v, mentioning %q", journal, why, c.journal, c.why)
			}
		})
	}
}

func TestWatchedAndExitPayload(t *testing.T) {
	sb := foldExit(running())
	ws := sb.Watched()
	if len(ws) != 2 || ws[0].Role != RoleVMM || ws[0].Process.Pid != 100 || ws[1].Role != RoleSupervisor || ws[1].Process.Pid != 200 {
		t.Fatalf("Watched = %+v", ws)
	}
	p := ExitPayload(ws[0], events.ProcessExit{Status: events.ExitUnknown, By: "daemon"})
	if x, ok := p.(events.VMMExitedEvent); !ok || x.Pid != 100 || x.StartTicks != 10 {
		t.Fatalf("VMM exit payload %#v", p)
	}
	if x, ok := ExitPayload(ws[1], events.ProcessExit{}).(events.SupervisorExitedEvent); !ok || x.Pid != 200 || x.StartTicks != 20 {
		t.Fatalf("supervisor exit payload %#v", x)
	}
	// Once journaled, neither is watched any more.
	sb = foldExit(append(running(), events.VMMExitedEvent{Pid: 100, StartTicks: 10}, events.SupervisorExitedEvent{Pid: 200, StartTicks: 20}))
	if ws := sb.Watched(); len(ws) != 0 {
		t.Fatalf("Watched after both exits = %+v", ws)
	}
}

func TestObserveGoneIsDerivedAndSharesNothing(t *testing.T) {
	v := NewSandboxes()
	for i, p := range running() {
		v.Apply(uint64(i+1), exitEv(i, p))
	}
	orig := v.Get(exitSB)
	got := (*orig).ObserveGone(true, true)
	if got.State != StateExited || got.VMM == nil || !got.VMM.Exited || !got.Supervisor.Exited {
		t.Fatalf("observed %+v", got)
	}
	if len(got.Conditions) != 2 || !strings.Contains(got.Conditions[1].Message, "not journaled") {
		t.Fatalf("conditions %+v", got.Conditions)
	}
	if orig.State != StateRunning || orig.VMM.Exited || orig.Supervisor.Exited || len(orig.Conditions) != 0 {
		t.Fatalf("the projection changed under a read-time observation: %+v", orig)
	}
	if same := (*orig).ObserveGone(false, false); same.State != StateRunning || same.VMM.Exited || len(same.Conditions) != 0 {
		t.Fatalf("nothing gone, yet observed %+v", same)
	}
}
