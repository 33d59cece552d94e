package main

import (
	"bufio"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nexus-sandbox/nexus/events"
	hostproc "github.com/nexus-sandbox/nexus/host/proc"
	"github.com/nexus-sandbox/nexus/internal/testutil"
	"github.com/nexus-sandbox/nexus/projections"
)

// exitEvent is one exit event of `nexus events --json`.
type exitEvent struct {
	Seq     uint64             `json:"seq"`
	Type    events.Type        `json:"type"`
	Sandbox string             `json:"sandbox"`
	Data    events.ProcessExit `json:"data"`
}

// exitEvents lists the vmm.exited and supervisor.exited events of the
// journal, through `nexus events --json`.
func exitEvents(t *testing.T, root string) []exitEvent {
	t.Helper()
	var out []exitEvent
	for _, typ := range []events.Type{events.VMMExited, events.SupervisorExited} {
		r := mustOK(t, nexus(t, root, "events", "--json", "--type", string(typ)), "events")
		for _, line := range strings.Split(strings.TrimSpace(r.stdout), "\n") {
			if line == "" {
				continue
			}
			var e exitEvent
			if err := json.Unmarshal([]byte(line), &e); err != nil {
				t.Fatalf("events --json: %v\n%s", err, line)
			}
			out = append(out, e)
		}
	}
	return out
}

// awaitVMMExited follows the journal (`nexus events --follow`) until a
// vmm.exited event of sandbox id arrives. The two minutes are a guard
// against hanging on a loaded machine, not a timing assertion.
func awaitVMMExited(t *testing.T, root, id string) exitEvent {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, nexusBin, "--state-dir", root, "events", "--follow", "--json", "--type", string(events.VMMExited), "--sandbox", id)
	cmd.Env = append(os.Environ(), "NEXUS_STATE_DIR=")
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		cmd.Process.Kill()
		cmd.Wait()
	}()
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil {
		t.Fatalf("no vmm.exited event of %s in the journal: %v", id, err)
	}
	var e exitEvent
	if err := json.Unmarshal([]byte(line), &e); err != nil {
		t.Fatalf("events --json: %v\n%s", err, line)
	}
	return e
}

func inspectJSON(t *testing.T, root, id string) jsonSandbox {
	t.Helper()
	r := mustOK(t, nexus(t, root, "inspect", "--json", id), "inspect")
	var list []jsonSandbox
	if err := json.Unmarshal([]byte(r.stdout), &list); err != nil || len(list) != 1 {
		t.Fatalf("inspect --json: %v\n%s", err, r.stdout)
	}
	return list[0]
}

// assertExitedKeepingEverything: the sandbox shows exited with its dead
// VMM still recorded, and owns every file it owned before (nothing was
// deleted).
func assertExitedKeepingEverything(t *testing.T, root string, before jsonSandbox) jsonSandbox {
	t.Helper()
	sb := inspectJSON(t, root, before.ID)
	if sb.State != projections.StateExited || sb.VMM == nil || !sb.VMM.Exited || sb.VMM.Pid != before.VMM.Pid {
		t.Fatalf("inspect after the VMM died: state %s, vmm %+v; want exited, pid %d marked exited", sb.State, sb.VMM, before.VMM.Pid)
	}
	if len(sb.Conditions) == 0 || sb.Conditions[len(sb.Conditions)-1].Reason != projections.ReasonVMMExited {
		t.Fatalf("conditions %+v, want Ready=False VMMExited", sb.Conditions)
	}
	for _, r := range before.Resources {
		if !owns(sb, r.Path) {
			t.Errorf("%s no longer owned after the exit", r.Path)
		}
		if _, err := os.Lstat(filepath.Join(root, r.Path)); err != nil && r.Kind != events.KindIIDSocket {
			t.Errorf("%s: %v after the exit", r.Path, err)
		}
	}
	list := sandboxes(t, root)
	if i := slices.IndexFunc(list, func(x jsonSandbox) bool { return x.ID == before.ID }); i < 0 || list[i].State != projections.StateExited {
		t.Fatalf("ls --json after the VMM died: %+v; want %s exited", list, before.ID)
	}
	text := mustOK(t, nexus(t, root, "inspect", before.ID), "inspect").stdout
	if !strings.Contains(text, "State:") || !strings.Contains(text, string(projections.StateExited)) || !strings.Contains(text, "exited") {
		t.Fatalf("inspect does not say exited:\n%s", text)
	}
	return sb
}

// TestDaemonJournalsAVMMExit: while a daemon runs, a SIGKILLed VMM becomes
// a vmm.exited event (status unknown: the daemon is not its parent); ls
// and inspect show the sandbox exited with nothing deleted; recover and
// start settle it like a crash; and the exits that stop, start's settling
// and rm cause themselves are not journaled a second time.
func TestDaemonJournalsAVMMExit(t *testing.T) {
	testutil.StartsSandboxes(t)
	t.Parallel()
	root := shortRoot(t)
	d := startDaemon(t, root)
	image := makeImage(t)
	a := createJSON(t, root, "--image", image)
	b := createJSON(t, root, "--image", image)
	c := createJSON(t, root, "--image", image)

	killAndAwait(t, a.VMM)
	e := awaitVMMExited(t, root, a.ID)
	if e.Data.Pid != a.VMM.Pid || e.Data.StartTicks != a.VMM.StartTicks || e.Data.Status != events.ExitUnknown || e.Data.By != "daemon" {
		t.Fatalf("vmm.exited = %+v; want pid %d start %d, status unknown, by daemon", e.Data, a.VMM.Pid, a.VMM.StartTicks)
	}
	assertExitedKeepingEverything(t, root, a)

	// start of an exited sandbox works like start after a crash: the dead
	// VMM is settled (its orphaned supervisor stopped) and a new one boots.
	started := mustOK(t, proc(t, root, "start", "--json", a.ID), "start exited sandbox")
	var sa jsonSandbox
	if err := json.Unmarshal([]byte(started.stdout), &sa); err != nil {
		t.Fatalf("start --json: %v\n%s", err, started.stdout)
	}
	if sa.State != projections.StateRunning || sa.VMM == nil || sa.VMM.Exited || sa.VMM.Pid == a.VMM.Pid || len(sa.Conditions) != 0 {
		t.Fatalf("after start: %+v", sa)
	}
	if alive, _ := hostproc.Alive(hostproc.Identity{Pid: a.Supervisor.Pid, StartTicks: a.Supervisor.StartTicks}); alive {
		t.Fatal("the dead VMM's supervisor still runs after start")
	}

	// recover of an exited sandbox: stopped, its orphaned supervisor killed.
	killAndAwait(t, b.VMM)
	awaitVMMExited(t, root, b.ID)
	rep := recoverReport(t, root)
	if !slices.Contains(rep.Stopped, b.ID) || !slices.Contains(rep.Killed, b.ID) {
		t.Fatalf("recover report for exited %s: %+v", b.ID, rep)
	}
	if sb := inspectJSON(t, root, b.ID); sb.State != projections.StateStopped || sb.VMM != nil || sb.Supervisor != nil {
		t.Fatalf("after recover: %+v", sb)
	}

	// rm of an exited sandbox: everything reclaimed, its supervisor too.
	killAndAwait(t, c.VMM)
	awaitVMMExited(t, root, c.ID)
	mustOK(t, proc(t, root, "rm", "-f", "--with-snapshots", c.ID), "rm exited sandbox")
	if alive, _ := hostproc.Alive(hostproc.Identity{Pid: c.Supervisor.Pid, StartTicks: c.Supervisor.StartTicks}); alive {
		t.Fatal("rm of an exited sandbox left its supervisor running")
	}

	mustOK(t, proc(t, root, "stop", a.ID), "stop")
	mustOK(t, proc(t, root, "rm", "-f", "--with-snapshots", a.ID), "rm")
	mustOK(t, proc(t, root, "rm", "-f", "--with-snapshots", b.ID), "rm")
	// Stopping the daemon waits for its watcher: every exit it saw has been
	// judged and, if due, journaled.
	if code := d.Stop(t); code != 0 {
		t.Fatalf("daemon: exit %d:\n%s", code, d.Stderr.String())
	}
	got := exitEvents(t, root)
	var gotIDs []string
	for _, e := range got {
		gotIDs = append(gotIDs, string(e.Type)+" "+e.Sandbox)
	}
	want := []string{"vmm.exited " + a.ID, "vmm.exited " + b.ID, "vmm.exited " + c.ID}
	if !slices.Equal(gotIDs, want) {
		t.Fatalf("exit events %v; want exactly the three SIGKILLs %v, none for what start, recover, stop and rm stopped", gotIDs, want)
	}
	assertNothingLeft(t, root)
}

// TestLsShowsAnExitedVMMWithoutADaemon: with no daemon, ls and inspect
// check the recorded VMM's pid + start time and show the sandbox exited,
// deriving it at read time: nothing is journaled, nothing deleted. stop
// and rm of such a sandbox settle it.
func TestLsShowsAnExitedVMMWithoutADaemon(t *testing.T) {
	testutil.StartsSandboxes(t)
	// No daemon at all: not even one started on demand, whose watcher
	// would journal the exit.
	t.Setenv("NEXUS_NO_AUTO_DAEMON", "1")
	root := shortRoot(t)
	image := makeImage(t)
	a := createJSON(t, root, "--image", image)
	b := createJSON(t, root, "--image", image)
	killAndAwait(t, a.VMM)
	killAndAwait(t, b.VMM)
	seq := lastSeq(t, root)

	sb := assertExitedKeepingEverything(t, root, a)
	if !strings.Contains(sb.Conditions[len(sb.Conditions)-1].Message, "not journaled") {
		t.Fatalf("a read-time exit must say it is not journaled: %+v", sb.Conditions)
	}
	if sb.Supervisor == nil || sb.Supervisor.Exited {
		t.Fatalf("supervisor %+v: it still runs, so it is not exited", sb.Supervisor)
	}
	if got := lastSeq(t, root); got != seq {
		t.Fatalf("ls and inspect moved the journal from %d to %d", seq, got)
	}
	if got := exitEvents(t, root); len(got) != 0 {
		t.Fatalf("exit events without a daemon: %+v", got)
	}

	mustOK(t, proc(t, root, "stop", a.ID), "stop exited sandbox")
	if sb := inspectJSON(t, root, a.ID); sb.State != projections.StateStopped || sb.VMM != nil || sb.Supervisor != nil {
		t.Fatalf("after stop: %+v", sb)
	}
	mustOK(t, proc(t, root, "start", b.ID), "start exited sandbox")
	if sb := inspectJSON(t, root, b.ID); sb.State != projections.StateRunning || sb.VMM == nil || sb.VMM.Pid == b.VMM.Pid {
		t.Fatalf("after start: %+v", sb)
	}
	killAndAwait(t, inspectJSON(t, root, b.ID).VMM)
	mustOK(t, proc(t, root, "rm", "-f", "--with-snapshots", a.ID), "rm")
	mustOK(t, proc(t, root, "rm", "-f", "--with-snapshots", b.ID), "rm exited sandbox")
	assertNothingLeft(t, root)
}

func lastSeq(t *testing.T, root string) uint64 {
	t.Helper()
	r := mustOK(t, nexus(t, root, "events", "--json"), "events")
	lines := strings.Split(strings.TrimSpace(r.stdout), "\n")
	var e struct {
		Seq uint64 `json:"seq"`
	}
	if err := json.Unmarshal([]byte(lines[len(lines)-1]), &e); err != nil {
		t.Fatal(err)
	}
	return e.Seq
}
