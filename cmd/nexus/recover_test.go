package main

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	hostproc "github.com/nexus-sandbox/nexus/host/proc"
	"github.com/nexus-sandbox/nexus/host/supervisor"
	"github.com/nexus-sandbox/nexus/internal/testutil"
	"github.com/nexus-sandbox/nexus/lifecycle"
	"github.com/nexus-sandbox/nexus/projections"
)

// killAndAwait SIGKILLs a detached process (not our child, so it cannot be
// waited for) and returns once its pid + start time no longer name a live
// process.
func killAndAwait(t *testing.T, p *jsonProcess) {
	t.Helper()
	who := hostproc.Identity{Pid: p.Pid, StartTicks: p.StartTicks}
	if err := syscall.Kill(p.Pid, syscall.SIGKILL); err != nil {
		t.Fatalf("kill %d: %v", p.Pid, err)
	}
	deadline := time.Now().Add(testutil.Scale(30 * time.Second))
	for {
		alive, err := hostproc.Alive(who)
		if err == nil && !alive {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("pid %d still alive 30 s after SIGKILL", p.Pid)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func pingSupervisor(t *testing.T, root, id string) supervisor.PingInfo {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	info, err := supervisor.Ping(ctx, filepath.Join(root, "supervisors", id))
	if err != nil {
		t.Fatalf("ping supervisor of %s: %v", id, err)
	}
	return info
}

func recoverReport(t *testing.T, root string) lifecycle.RecoverReport {
	t.Helper()
	var rep lifecycle.RecoverReport
	out := mustOK(t, proc(t, root, "recover", "--json"), "recover").stdout
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatalf("recover --json: %v\n%s", err, out)
	}
	return rep
}

// TestRecoverReplacesAKilledSupervisorWithTheSameCA: the
// perimeter supervisor of a running sandbox dies by SIGKILL; recover starts
// a replacement that serves the CA persisted in the state dir, so the
// guest's trust anchor still holds.
func TestRecoverReplacesAKilledSupervisorWithTheSameCA(t *testing.T) {
	testutil.StartsSandboxes(t)
	t.Parallel()
	root := shortRoot(t)
	sb := createJSON(t, root, "--image", makeImage(t))
	before := pingSupervisor(t, root, sb.ID)
	if before.PID != sb.Supervisor.Pid || before.CASHA256 == "" {
		t.Fatalf("supervisor answers %+v, journal says pid %d", before, sb.Supervisor.Pid)
	}
	pem, err := os.ReadFile(filepath.Join(root, "supervisors", sb.ID, "mitm-ca.pem"))
	if err != nil {
		t.Fatal(err)
	}

	killAndAwait(t, sb.Supervisor)
	rep := recoverReport(t, root)
	if !slices.Contains(rep.Restarted, sb.ID) || len(rep.Killed) != 0 || len(rep.Stopped) != 0 {
		t.Fatalf("recover report: %+v", rep)
	}
	after := pingSupervisor(t, root, sb.ID)
	if after.CASHA256 != before.CASHA256 {
		t.Fatalf("replacement supervisor minted a new CA: %s, was %s", after.CASHA256, before.CASHA256)
	}
	if after.PID == before.PID {
		t.Fatalf("supervisor pid unchanged (%d): nothing was replaced", after.PID)
	}
	if again, _ := os.ReadFile(filepath.Join(root, "supervisors", sb.ID, "mitm-ca.pem")); string(again) != string(pem) {
		t.Fatal("mitm-ca.pem was rewritten")
	}
	list := sandboxes(t, root)
	if len(list) != 1 || list[0].State != projections.StateRunning || list[0].Supervisor == nil || list[0].Supervisor.Pid != after.PID {
		t.Fatalf("journal after recover: %+v (want running with supervisor pid %d)", list, after.PID)
	}
	if rep := recoverReport(t, root); len(rep.Restarted)+len(rep.Killed)+len(rep.Stopped) != 0 {
		t.Fatalf("second recover still had work: %+v", rep)
	}
	// The replacement goes on with the console's time index.
	mustOK(t, proc(t, root, "snapshot", sb.ID), "snapshot")
	waitIndexed(t, root, sb.ID)
	mustOK(t, proc(t, root, "rm", "-f", "--with-snapshots", sb.ID), "rm")
	assertNothingLeft(t, root)
}

// TestRecoverKillsTheSupervisorOfADeadVMM: the VMM dies,
// leaving its detached supervisor running; recover records the sandbox as
// stopped, kills the now-orphaned supervisor (its pid and start time match
// the journal) and reclaims the stale sockets. A later start seeds
// a new supervisor from the same CA.
func TestRecoverKillsTheSupervisorOfADeadVMM(t *testing.T) {
	testutil.StartsSandboxes(t)
	t.Parallel()
	root := shortRoot(t)
	sb := createJSON(t, root, "--image", makeImage(t))
	ca := pingSupervisor(t, root, sb.ID).CASHA256

	killAndAwait(t, sb.VMM)
	rep := recoverReport(t, root)
	if !slices.Contains(rep.Stopped, sb.ID) || !slices.Contains(rep.Killed, sb.ID) {
		t.Fatalf("recover report: %+v", rep)
	}
	if alive, _ := hostproc.Alive(hostproc.Identity{Pid: sb.Supervisor.Pid, StartTicks: sb.Supervisor.StartTicks}); alive {
		t.Fatal("orphaned supervisor still alive after recover")
	}
	for _, s := range []string{".sock", ".vsock", ".iid"} {
		if _, err := os.Lstat(filepath.Join(root, "run", "sb-"+sb.ID+s)); !os.IsNotExist(err) {
			t.Errorf("stale socket run/sb-%s%s left (RL-11): %v", sb.ID, s, err)
		}
	}
	list := sandboxes(t, root)
	if len(list) != 1 || list[0].State != projections.StateStopped {
		t.Fatalf("after recover: %+v", list)
	}
	assertClean(t, root)
	if left := liveProcesses(t, root); len(left) > 0 {
		t.Fatalf("processes left: %v", left)
	}

	mustOK(t, proc(t, root, "start", sb.ID), "start")
	if got := pingSupervisor(t, root, sb.ID).CASHA256; got != ca {
		t.Fatalf("restarted sandbox's supervisor serves CA %s, was %s", got, ca)
	}
	mustOK(t, proc(t, root, "rm", "-f", "--with-snapshots", sb.ID), "rm")
	assertNothingLeft(t, root)
}

// TestRecoverTrustsAnIntentOnlyForItsOwnSandbox: recover deletes what an
// uncommitted create's intent covers, so a damaged or planted marker that
// names a volume or another sandbox's disk must cover nothing there.
func TestRecoverTrustsAnIntentOnlyForItsOwnSandbox(t *testing.T) {
	testutil.StartsSandboxes(t)
	t.Parallel()
	root := shortRoot(t)
	image := makeImage(t)
	mustOK(t, proc(t, root, "volume", "create", "keep", "--size", "16M"), "volume create")
	other := createJSON(t, root, "--image", image)
	crashAt(t, root, "create.workspace-disk", "create", "--image", image)

	matches, _ := filepath.Glob(filepath.Join(root, "disks", "*.create-intent.json"))
	if len(matches) != 1 {
		t.Fatalf("want the crashed create's intent, found %v", matches)
	}
	data, err := os.ReadFile(matches[0])
	if err != nil {
		t.Fatal(err)
	}
	var in map[string]any
	if err := json.Unmarshal(data, &in); err != nil {
		t.Fatal(err)
	}
	in["covers"] = append(in["covers"].([]any), "volumes/keep", "disks/"+other.ID+"-workspace.ext4", "journal")
	data, _ = json.Marshal(in)
	if err := os.WriteFile(matches[0], data, 0o600); err != nil {
		t.Fatal(err)
	}
	volBefore := volumeSum(t, root, "keep")

	recoverClean(t, root)
	if volumeSum(t, root, "keep") != volBefore {
		t.Fatal("recover touched a volume an intent claimed to cover")
	}
	if _, err := os.Stat(filepath.Join(root, "disks", other.ID+"-workspace.ext4")); err != nil {
		t.Fatalf("recover deleted another sandbox's disk: %v", err)
	}
	if r := nexus(t, root, "events", "--type", "warning.raised"); strings.Count(r.stdout, "ForeignIntentCover") != 3 {
		t.Fatalf("want three ForeignIntentCover warnings, got:\n%s", r.stdout)
	}
	if list := sandboxes(t, root); len(list) != 1 || list[0].ID != other.ID || list[0].State != projections.StateRunning {
		t.Fatalf("after recover: %+v", list)
	}
	mustOK(t, proc(t, root, "rm", "-f", "--with-snapshots", other.ID), "rm")
}
