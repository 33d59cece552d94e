package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/nexus-sandbox/nexus/internal/testutil"
)

type readyEvent struct {
	Type    string          `json:"type"`
	Payload json.RawMessage `json:"data"`
}

// readyEvents are the sandbox.ready and sandbox.not_ready events of a
// sandbox, as `nexus events --json` prints them.
func readyEvents(t *testing.T, root, id string) (ready, notReady []readyEvent) {
	t.Helper()
	r := mustOK(t, nexus(t, root, "events", "--json", "--sandbox", id, "--type", "sandbox.ready", "--type", "sandbox.not_ready"), "events")
	for _, line := range strings.Split(strings.TrimSpace(r.stdout), "\n") {
		if line == "" {
			continue
		}
		var e readyEvent
		if err := json.Unmarshal([]byte(line), &e); err != nil {
			t.Fatalf("events --json: %v\n%s", err, line)
		}
		if e.Type == "sandbox.ready" {
			ready = append(ready, e)
		} else {
			notReady = append(notReady, e)
		}
	}
	return ready, notReady
}

// create, start and restore return once the guest is Ready, and journal
// when (sandbox.ready, with the run's boot time, so the time to Ready is
// audited from the journal); --no-wait returns at boot, not Ready; inspect
// and ls show it; `nexus wait` waits for it, and for a stop.
func TestCreateAndStartReturnOnceReady(t *testing.T) {
	testutil.StartsSandboxes(t)
	root := shortRoot(t)
	sb := createJSON(t, root, "--image", makeImage(t))
	if !sb.Ready || sb.ReadyAt == nil || sb.BootAt == nil || sb.ReadyAt.Before(*sb.BootAt) {
		t.Fatalf("create returned ready=%v boot_at=%v ready_at=%v: want Ready, after its boot", sb.Ready, sb.BootAt, sb.ReadyAt)
	}
	ready, notReady := readyEvents(t, root, sb.ID)
	if len(ready) != 1 || len(notReady) != 0 {
		t.Fatalf("%d sandbox.ready and %d sandbox.not_ready events after create, want 1 and 0", len(ready), len(notReady))
	}
	var p struct {
		Run       string `json:"run"`
		By        string `json:"by"`
		BootAtMs  int64  `json:"boot_at_ms"`
		ReadyAtMs int64  `json:"ready_at_ms"`
	}
	if err := json.Unmarshal(ready[0].Payload, &p); err != nil {
		t.Fatal(err)
	}
	if p.Run != sb.LastRun || p.By != "agent" || p.BootAtMs != sb.BootAt.UnixMilli() || p.ReadyAtMs < p.BootAtMs {
		t.Errorf("sandbox.ready says %+v; want run %s, by agent, boot_at_ms %d <= ready_at_ms", p, sb.LastRun, sb.BootAt.UnixMilli())
	}
	if r := mustOK(t, nexus(t, root, "inspect", sb.ID), "inspect"); !strings.Contains(r.stdout, "Ready:") || !strings.Contains(r.stdout, "True") {
		t.Errorf("inspect of a Ready sandbox:\n%s", r.stdout)
	}
	if r := mustOK(t, nexus(t, root, "ls"), "ls"); !strings.Contains(r.stdout, "READY") || !strings.Contains(r.stdout, " true ") {
		t.Errorf("ls of a Ready sandbox:\n%s", r.stdout)
	}

	// fork and restore return their children Ready too.
	var kids []jsonSandbox
	if err := json.Unmarshal([]byte(mustOK(t, proc(t, root, "fork", "--json", "--count", "2", sb.ID), "fork").stdout), &kids); err != nil || len(kids) != 2 {
		t.Fatalf("fork --json: %v (%d children)", err, len(kids))
	}
	snap := strings.TrimSpace(mustOK(t, proc(t, root, "snapshot", sb.ID), "snapshot").stdout)
	var restored jsonSandbox
	if err := json.Unmarshal([]byte(mustOK(t, proc(t, root, "restore", "--json", snap), "restore").stdout), &restored); err != nil {
		t.Fatal(err)
	}
	for _, c := range append(kids, restored) {
		if !c.Ready || c.ReadyAt == nil {
			t.Errorf("fork or restore returned %s ready=%v reason %q", c.ID, c.Ready, c.ReadyReason)
		}
	}

	// --no-wait: running, not Ready yet, nothing journaled.
	mustOK(t, proc(t, root, "stop", sb.ID), "stop")
	var s jsonSandbox
	r := mustOK(t, proc(t, root, "start", "--no-wait", "--json", sb.ID), "start --no-wait")
	if err := json.Unmarshal([]byte(r.stdout), &s); err != nil {
		t.Fatalf("start --json: %v\n%s", err, r.stdout)
	}
	if s.State != "running" || s.Ready || s.ReadyReason != "Booting" || s.ReadyAt != nil {
		t.Fatalf("start --no-wait returned state %s ready=%v reason %q ready_at %v: want running, Booting", s.State, s.Ready, s.ReadyReason, s.ReadyAt)
	}
	if r := mustOK(t, nexus(t, root, "inspect", sb.ID), "inspect"); !strings.Contains(r.stdout, "reason=Booting") {
		t.Errorf("inspect of a booting sandbox does not say so:\n%s", r.stdout)
	}
	// wait --for ready journals the run's Ready.
	mustOK(t, proc(t, root, "wait", "--for", "ready", "--timeout", "2m", sb.ID), "wait --for ready")
	if ready, _ := readyEvents(t, root, sb.ID); len(ready) != 2 {
		t.Fatalf("%d sandbox.ready events after wait --for ready, want 2 (one a run)", len(ready))
	}
	if s := inspect(t, root, sb.ID); !s.Ready || s.LastRun == sb.LastRun {
		t.Errorf("after wait: ready=%v run %s (first run %s)", s.Ready, s.LastRun, sb.LastRun)
	}
	// A wait that cannot be met fails, naming what it waited for.
	wantFailure(t, proc(t, root, "wait", "--for", "stopped", "--timeout", "300ms", sb.ID), 1, "still running")
	wantFailure(t, proc(t, root, "wait", "--for", "sleeping", sb.ID), 2, "--for")
	mustOK(t, proc(t, root, "stop", sb.ID), "stop")
	mustOK(t, proc(t, root, "wait", "--for", "stopped", "--timeout", "10s", sb.ID), "wait --for stopped")
}

// A guest that is not Ready within --wait-timeout is left running,
// Ready=False reason=AgentNotReady (journaled), and the command exits 1
// naming its console log; a later Ready supersedes it.
func TestNotReadyInTimeIsKeptAndSaysWhere(t *testing.T) {
	testutil.StartsSandboxes(t)
	root := shortRoot(t)
	r := proc(t, root, "create", "-q", "--image", makeImage(t), "--wait-timeout", "1ns")
	if r.code != 1 {
		t.Fatalf("create whose guest cannot be Ready in time: exit %d, want 1 (stderr %q)", r.code, r.stderr)
	}
	id := strings.TrimSpace(r.stdout)
	console := filepath.Join(root, "logs", id+".console.log")
	for _, want := range []string{"not Ready", console, "nexus wait " + id} {
		if !strings.Contains(r.stderr, want) {
			t.Errorf("create's error %q does not say %q", r.stderr, want)
		}
	}
	sb := inspect(t, root, id)
	if sb.State != "running" || sb.Ready || sb.ReadyReason != "AgentNotReady" {
		t.Fatalf("after the timeout: state %s ready=%v reason %q, want running, AgentNotReady", sb.State, sb.Ready, sb.ReadyReason)
	}
	if len(sb.Conditions) != 1 || sb.Conditions[0].Type != "Ready" || sb.Conditions[0].Status != "False" || sb.Conditions[0].Reason != "AgentNotReady" {
		t.Errorf("conditions %+v, want Ready=False reason=AgentNotReady", sb.Conditions)
	}
	if _, notReady := readyEvents(t, root, id); len(notReady) != 1 {
		t.Errorf("%d sandbox.not_ready events, want 1", len(notReady))
	}
	if r := mustOK(t, nexus(t, root, "inspect", id), "inspect"); !strings.Contains(r.stdout, "Ready=False reason=AgentNotReady") {
		t.Errorf("inspect does not show Ready=False reason=AgentNotReady:\n%s", r.stdout)
	}
	// exec waits for the agent, says so, and the first answer is the run's Ready.
	r = mustOK(t, proc(t, root, "exec", id, "--", "true"), "exec on a sandbox not Ready")
	if !strings.Contains(r.stderr, "not Ready (AgentNotReady): waiting up to") {
		t.Errorf("exec did not say it waits for the agent: %q", r.stderr)
	}
	if sb := inspect(t, root, id); !sb.Ready || len(sb.Conditions) != 0 {
		t.Errorf("after the agent answered: ready=%v conditions %+v", sb.Ready, sb.Conditions)
	}
}

// exec and cp on a sandbox whose agent does not answer wait within their
// own deadline and then say what is wrong and where to look, not the
// transport's error.
func TestExecOnABootingSandboxWaitsThenSaysWhy(t *testing.T) {
	testutil.StartsSandboxes(t)
	root := shortRoot(t)
	sb := createJSON(t, root, "--image", makeImage(t), "--no-wait")
	if sb.Ready {
		t.Fatalf("create --no-wait returned a Ready sandbox")
	}
	// No agent can answer: its socket is gone.
	if err := os.Remove(filepath.Join(root, "run", "sb-"+sb.ID+".vsock")); err != nil {
		t.Fatal(err)
	}
	r := proc(t, root, "exec", "--wait-timeout", "1s", sb.ID, "--", "true")
	if r.code != 1 {
		t.Fatalf("exec: exit %d, want 1 (stderr %q)", r.code, r.stderr)
	}
	for _, want := range []string{"waiting up to 1s", "not Ready", filepath.Join(root, "logs", sb.ID+".console.log")} {
		if !strings.Contains(r.stderr, want) {
			t.Errorf("exec's error %q does not say %q", r.stderr, want)
		}
	}
	r = proc(t, root, "cp", "--wait-timeout", "1s", sb.ID+":/etc/hostname", "-")
	if r.code != 1 || !strings.Contains(r.stderr, "not Ready") {
		t.Errorf("cp: exit %d, stderr %q: want 1, not Ready", r.code, r.stderr)
	}
	// exec does not journal a not-Ready: the sandbox's boot decides that.
	if _, notReady := readyEvents(t, root, sb.ID); len(notReady) != 0 {
		t.Errorf("exec journaled %d sandbox.not_ready events", len(notReady))
	}
}
