package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nexus-sandbox/nexus/internal/testutil"
	"github.com/nexus-sandbox/nexus/lifecycle"
	"github.com/nexus-sandbox/nexus/projections"
)

// The guard, end to end: each test interleaves real commands at an exact
// saga step (NEXUS_PAUSE_AT stops the runner with SIGSTOP) and checks the
// journal against the disk afterwards.

// paused is a nexus command stopped at a saga step.
type paused struct {
	cmd    *exec.Cmd
	out    *strings.Builder
	stderr *strings.Builder
	done   chan struct{}
}

// pauseAt starts a nexus command and waits until it stops itself at a step.
func pauseAt(t *testing.T, root, at string, args ...string) *paused {
	t.Helper()
	cmd := exec.Command(nexusBin, append([]string{"--state-dir", root, "--driver", "process"}, args...)...)
	cmd.Env = append(os.Environ(), "NEXUS_STATE_DIR=", "NEXUS_PAUSE_AT="+at)
	p := &paused{cmd: cmd, out: &strings.Builder{}, stderr: &strings.Builder{}, done: make(chan struct{})}
	cmd.Stdout = p.out
	pipe, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill() })
	rd := bufio.NewReader(pipe)
	line, err := rd.ReadString('\n')
	if err != nil || !strings.Contains(line, "paused at "+at) {
		cmd.Process.Kill()
		t.Fatalf("%v said %q, %v", args, line, err)
	}
	waitStopped(t, cmd.Process.Pid)
	go func() {
		defer close(p.done)
		sc := bufio.NewScanner(rd)
		for sc.Scan() {
			p.stderr.WriteString(sc.Text() + "\n")
		}
	}()
	return p
}

// resume continues the command (after sending it sig, if any) and returns
// its exit code.
func (p *paused) resume(t *testing.T, sig syscall.Signal) int {
	t.Helper()
	if sig != 0 {
		p.cmd.Process.Signal(sig)
	}
	p.cmd.Process.Signal(syscall.SIGCONT)
	<-p.done
	err := p.cmd.Wait()
	if ee, ok := err.(*exec.ExitError); ok {
		return ee.ExitCode()
	}
	if err != nil {
		t.Fatal(err)
	}
	return 0
}

// journalMatchesDisk is the promise: nothing owned missing, nothing
// untracked, the journal verifies, and no saga is left open.
func journalMatchesDisk(t *testing.T, root string) {
	t.Helper()
	if r := nexus(t, root, "replay", "diff"); r.code != 0 {
		t.Fatalf("replay diff: %s%s", r.stdout, r.stderr)
	}
	if r := nexus(t, root, "replay", "verify"); r.code != 0 {
		t.Fatalf("replay verify: %s%s", r.stdout, r.stderr)
	}
	assertClean(t, root)
}

func listed(t *testing.T, root, id string) *jsonSandbox {
	t.Helper()
	for _, sb := range sandboxes(t, root) {
		if sb.ID == id {
			return &sb
		}
	}
	return nil
}

// Ctrl-C once a create's saga has finished, while it waits for the guest
// to be Ready: the sandbox stays as made, and the command says so, and
// how to wait again.
func TestInterruptedReadyWaitSaysTheSandboxIsMade(t *testing.T) {
	testutil.StartsSandboxes(t)
	t.Parallel()
	root := shortRoot(t)
	p := pauseAt(t, root, "create.vmm", "create", "--image", makeImage(t), "-q")
	if code := p.resume(t, syscall.SIGINT); code != 130 {
		t.Fatalf("create interrupted in its Ready wait exited %d, want 130 (stderr %q)", code, p.stderr)
	}
	if msg := p.stderr.String(); !strings.Contains(msg, "interrupted while waiting for its guest to be Ready") || !strings.Contains(msg, "--for ready") {
		t.Fatalf("create interrupted in its Ready wait said %q", msg)
	}
	if list := sandboxes(t, root); len(list) != 1 || list[0].State != "running" {
		t.Fatalf("after an interrupted Ready wait: %+v, want the one sandbox running", list)
	}
	journalMatchesDisk(t, root)
}

// Ctrl-C during create: before the commit every step is undone and each
// undo is journaled; after it the sandbox is kept (stopped) with its files,
// and only the boot steps are undone. Either way the journal matches the
// disk and nothing is left for recover. With and without a daemon.
func TestInterruptedCreateUndoesAndJournals(t *testing.T) {
	testutil.StartsSandboxes(t)
	t.Parallel()
	image := makeImage(t)
	for _, c := range []struct {
		at     string
		daemon bool
		kept   bool
	}{
		{"create.workspace-disk", false, false},
		{"create.workspace-disk", true, false},
		// Right after the supervisor starts, before the VMM's step: its
		// events are held for the VMM's append, so :before is the point
		// between the two.
		{"create.supervisor:before", false, true},
		{"create.supervisor:before", true, true},
	} {
		name := c.at
		if c.daemon {
			name += "/daemon"
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			root := shortRoot(t)
			if c.daemon {
				startDaemon(t, root)
			}
			p := pauseAt(t, root, c.at, "create", "--image", image, "--handle", "ctrl/c")
			if code := p.resume(t, syscall.SIGINT); code != 130 {
				t.Fatalf("interrupted create exit %d, want 130 (stderr %q)", code, p.stderr)
			}
			if !strings.Contains(p.stderr.String(), "undone and journaled") {
				t.Fatalf("stderr does not say what was undone: %q", p.stderr)
			}
			list := sandboxes(t, root)
			if !c.kept {
				if len(list) != 0 {
					t.Fatalf("a create interrupted before its commit left %d sandboxes (stderr %q)", len(list), p.stderr)
				}
				assertNothingLeft(t, root)
			} else {
				if len(list) != 1 || list[0].State != projections.StateStopped {
					t.Fatalf("a create interrupted after its commit left %+v, want one stopped sandbox", list)
				}
				for _, r := range list[0].Resources {
					if _, err := os.Lstat(filepath.Join(root, r.Path)); err != nil {
						t.Fatalf("committed %s is gone: %v", r.Path, err)
					}
				}
			}
			journalMatchesDisk(t, root)
			rep := recoverReport(t, root)
			if len(rep.Compensated)+len(rep.Resumed) != 0 {
				t.Fatalf("recover still had sagas to finish: %+v", rep)
			}
			if c.kept {
				mustOK(t, proc(t, root, "start", list[0].ID), "start the kept sandbox")
				mustOK(t, proc(t, root, "rm", "-f", "--with-snapshots", list[0].ID), "rm")
				assertNothingLeft(t, root)
			}
		})
	}
}

// recover behind a daemon while a snapshot is mid-saga: the snapshot's
// runner holds its lease, so recover leaves the saga alone and says why,
// and the snapshot finishes into one that restores.
func TestRecoverLeavesALiveSagaAlone(t *testing.T) {
	testutil.StartsSandboxes(t)
	t.Parallel()
	root := shortRoot(t)
	startDaemon(t, root)
	sb := createJSON(t, root, "--image", makeImage(t))
	p := pauseAt(t, root, "snapshot.capture:before", "snapshot", sb.ID)
	rep := recoverReport(t, root)
	skipped := false
	for _, s := range rep.Skipped {
		if s.Kind == "snapshot" && strings.Contains(s.Reason, "pid") {
			skipped = true
		}
	}
	if !skipped || len(rep.Compensated) != 0 {
		t.Fatalf("recover touched a live snapshot saga: %+v", rep)
	}
	if code := p.resume(t, 0); code != 0 {
		t.Fatalf("snapshot exit %d: %s", code, p.stderr)
	}
	snap := strings.TrimSpace(p.out.String())
	mustOK(t, proc(t, root, "restore", snap), "restore the snapshot taken beside recover")
	journalMatchesDisk(t, root)
}

// A second command on a sandbox with a live saga is refused naming the
// saga and its pid; with --wait it runs after it. start racing rm never
// leaves a VMM running on deleted disks.
func TestCommandsOnOneSandboxAreSerialised(t *testing.T) {
	testutil.StartsSandboxes(t)
	t.Parallel()
	root := shortRoot(t)
	startDaemon(t, root)
	sb := createJSON(t, root, "--image", makeImage(t))
	mustOK(t, proc(t, root, "stop", sb.ID), "stop")
	p := pauseAt(t, root, "start.supervisor", "start", sb.ID)
	r := proc(t, root, "rm", "-f", "--with-snapshots", sb.ID)
	wantFailure(t, r, 1, "start saga")
	if !strings.Contains(r.stderr, "pid ") {
		t.Fatalf("refusal does not name the runner's pid: %q", r.stderr)
	}
	// rm --wait queues behind the start.
	rm := exec.Command(nexusBin, "--state-dir", root, "--driver", "process", "--wait", "rm", "-f", "--with-snapshots", sb.ID)
	rm.Env = append(os.Environ(), "NEXUS_STATE_DIR=")
	var rmErr strings.Builder
	rm.Stderr = &rmErr
	if err := rm.Start(); err != nil {
		t.Fatal(err)
	}
	if code := p.resume(t, 0); code != 0 {
		t.Fatalf("start exit %d: %s", code, p.stderr)
	}
	if err := rm.Wait(); err != nil {
		t.Fatalf("rm --wait: %v: %s", err, rmErr.String())
	}
	if listed(t, root, sb.ID) != nil {
		t.Fatal("sandbox still listed after rm --wait")
	}
	if left := liveProcesses(t, root); len(left) > 0 {
		t.Fatalf("start racing rm leaked processes: %v", left)
	}
	journalMatchesDisk(t, root)
}

// A guest seen Ready while another command's saga is changing its
// sandbox does not journal Ready between two of that saga's steps: the
// saga, which expects the sandbox as it left it, finishes.
func TestReadyMarkWaitsForAnOpenSaga(t *testing.T) {
	testutil.StartsSandboxes(t)
	t.Parallel()
	root := shortRoot(t)
	startDaemon(t, root)
	sb := createJSON(t, root, "--image", makeImage(t), "--no-wait")
	p := pauseAt(t, root, "rm.saga.started", "rm", "-f", sb.ID)
	mustOK(t, proc(t, root, "wait", sb.ID, "--for", "ready"), "wait for Ready beside an open rm saga")
	if code := p.resume(t, 0); code != 0 {
		t.Fatalf("rm exit %d after a Ready was seen during its saga: %s", code, p.stderr)
	}
	if listed(t, root, sb.ID) != nil {
		t.Fatal("sandbox still listed after rm")
	}
	journalMatchesDisk(t, root)
}

// volume rm and volume prune --include-detached racing a create that
// attaches the volume: the volume is claimed by the create's lease and
// expectation, so neither deletes it.
func TestVolumeCannotBeDeletedUnderAnAttachingCreate(t *testing.T) {
	testutil.StartsSandboxes(t)
	t.Parallel()
	root := shortRoot(t)
	startDaemon(t, root)
	mustOK(t, proc(t, root, "volume", "create", "data", "--size", "16M"), "volume create")
	before := volumeSum(t, root, "data")
	p := pauseAt(t, root, "create.workspace-disk", "create", "--image", makeImage(t), "--volume", "data:/data")
	wantFailure(t, proc(t, root, "volume", "rm", "--yes", "data"), 1, "volume/data is busy")
	r := proc(t, root, "volume", "prune", "--apply", "--include-detached", "--yes")
	if r.code == 0 {
		t.Fatalf("prune --apply ran beside an attaching create: %s", r.stdout)
	}
	if code := p.resume(t, 0); code != 0 {
		t.Fatalf("create exit %d: %s", code, p.stderr)
	}
	if volumeSum(t, root, "data") != before {
		t.Fatal("volume bytes changed")
	}
	var vols []projections.Volume
	json.Unmarshal([]byte(mustOK(t, proc(t, root, "volume", "ls", "--json"), "volume ls").stdout), &vols)
	if len(vols) != 1 || len(vols[0].AttachedTo) != 1 {
		t.Fatalf("volume not attached after the create: %+v", vols)
	}
	wantFailure(t, proc(t, root, "volume", "rm", "--yes", "data"), 1, "attached")
	journalMatchesDisk(t, root)
}

// A live VMM that does not answer its API (stopped with SIGSTOP) is slow,
// not dead: recover neither kills it nor calls the sandbox stopped.
func TestRecoverKeepsASlowVMM(t *testing.T) {
	testutil.StartsSandboxes(t)
	t.Parallel()
	root := shortRoot(t)
	sb := createJSON(t, root, "--image", makeImage(t))
	syscall.Kill(sb.VMM.Pid, syscall.SIGSTOP)
	defer syscall.Kill(sb.VMM.Pid, syscall.SIGCONT)
	// kill(2) returns before the stop takes effect; on a loaded machine the
	// VMM could still answer recover's first request.
	waitFor(t, func() bool { return procState(sb.VMM.Pid) == 'T' })
	rep := recoverReport(t, root)
	if len(rep.Stopped) != 0 {
		t.Fatalf("recover stopped a live VMM: %+v", rep)
	}
	if syscall.Kill(sb.VMM.Pid, 0) != nil {
		t.Fatal("recover killed a live VMM that was slow to answer")
	}
	found := false
	for _, s := range rep.Skipped {
		found = found || (s.Sandbox == sb.ID && strings.Contains(s.Reason, "did not answer"))
	}
	if !found {
		t.Fatalf("recover does not say it left the slow VMM alone: %+v", rep.Skipped)
	}
	if cur := listed(t, root, sb.ID); cur == nil || cur.State != projections.StateRunning {
		t.Fatalf("slow sandbox is now %+v", cur)
	}
	syscall.Kill(sb.VMM.Pid, syscall.SIGCONT)
	mustOK(t, proc(t, root, "rm", "-f", "--with-snapshots", sb.ID), "rm")
}

var _ = lifecycle.RecoverReport{}

// procState is the state letter of /proc/<pid>/stat (R, S, T, Z, ...), or 0.
func procState(pid int) byte {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	// The state follows the command name, which is in parentheses.
	if i := strings.LastIndexByte(string(data), ')'); i >= 0 && i+2 < len(data) {
		return data[i+2]
	}
	return 0
}

// A daemon restarted (SIGTERM, as a service manager sends) while creates
// run through it: no creator may delete what it cannot journal, so after a
// new daemon and recover every sandbox is either gone without a trace or
// committed with all its files, and the journal matches the disk.
func TestDaemonRestartMidCreatesLosesNothing(t *testing.T) {
	testutil.StartsSandboxes(t)
	t.Parallel()
	root := shortRoot(t)
	image := makeImage(t)
	d := startDaemon(t, root)
	// One create is held right after its commit, before its boot: the
	// window where an unguarded compensation deleted committed disks. A
	// poll for that window missed it on a loaded machine, when every
	// create booted between two polls.
	held := pauseAt(t, root, "create.retire-intents", "create", "--image", image)
	var cmds []*testutil.Proc
	for range 3 {
		c := exec.Command(nexusBin, "--state-dir", root, "--driver", "process", "create", "--image", image)
		c.Env = append(os.Environ(), "NEXUS_STATE_DIR=")
		cmds = append(cmds, testutil.Start(t, c))
	}
	d.Stop(t)
	held.resume(t, 0) // success or failure: both are legitimate here
	for _, c := range cmds {
		c.Wait(t, commandWait) // success or failure: both are legitimate here
	}
	startDaemon(t, root)
	recoverReport(t, root)
	for _, sb := range sandboxes(t, root) {
		if sb.State == projections.StateCreating {
			t.Fatalf("%s still creating after recover", sb.ID)
		}
		for _, r := range sb.Resources {
			if _, err := os.Lstat(filepath.Join(root, r.Path)); err != nil {
				t.Fatalf("%s owns %s, which is gone: %v", sb.ID, r.Path, err)
			}
		}
	}
	journalMatchesDisk(t, root)
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(testutil.Scale(60 * time.Second)); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		if cond() {
			return
		}
	}
	t.Fatal("condition not reached within 60 s")
}

// Ctrl-C during a teardown (stop, rm) does not leave it half done: it has
// nothing to undo, so it runs to its end and the journal matches the disk
// (a stop cut short after its VMM was gone would leave the API socket
// owned in the journal but deleted on disk).
func TestInterruptedTeardownFinishes(t *testing.T) {
	testutil.StartsSandboxes(t)
	t.Parallel()
	for _, c := range []struct{ at, cmd string }{{"stop.vmm-stop", "stop"}, {"rm.supervisor-stop", "rm -f"}} {
		t.Run(c.cmd, func(t *testing.T) {
			t.Parallel()
			root := shortRoot(t)
			sb := createJSON(t, root, "--image", makeImage(t))
			p := pauseAt(t, root, c.at, append(strings.Fields(c.cmd), sb.ID)...)
			if code := p.resume(t, syscall.SIGINT); code != 0 {
				t.Fatalf("interrupted %s exit %d, want it finished (stderr %q)", c.cmd, code, p.stderr)
			}
			journalMatchesDisk(t, root)
			if c.cmd == "stop" {
				if cur := listed(t, root, sb.ID); cur == nil || cur.State != projections.StateStopped {
					t.Fatalf("after an interrupted stop: %+v", cur)
				}
			} else if listed(t, root, sb.ID) != nil {
				t.Fatal("an interrupted rm left the sandbox listed")
			}
		})
	}
}

// volume rm killed after its files are gone but before volume.removed is
// journaled (else the journal would list a volume whose files are gone):
// its saga stays open and recover finishes it.
func TestKilledVolumeRmIsFinishedByRecover(t *testing.T) {
	t.Parallel()
	root := shortRoot(t)
	mustOK(t, proc(t, root, "volume", "create", "data", "--size", "16M"), "volume create")
	crashAt(t, root, "volume-rm.delete-volume:data:before", "volume", "rm", "--yes", "data")
	if _, err := os.Stat(filepath.Join(root, "volumes", "data")); !os.IsNotExist(err) {
		t.Fatalf("the crash point is after the delete, yet volumes/data is there: %v", err)
	}
	rep := recoverReport(t, root)
	if len(rep.Resumed) != 1 {
		t.Fatalf("recover did not finish the volume rm: %+v", rep)
	}
	var vols []projections.Volume
	json.Unmarshal([]byte(mustOK(t, proc(t, root, "volume", "ls", "--json"), "volume ls").stdout), &vols)
	if len(vols) != 0 {
		t.Fatalf("journal still lists %+v after recover", vols)
	}
	journalMatchesDisk(t, root)
}

// A daemon that starts on a root whose sagas were left open by dead
// runners finishes them before it serves (a killed daemon leaves only
// sagas with free leases, and the next daemon start resumes or compensates
// them itself).
func TestDaemonStartFinishesDeadSagas(t *testing.T) {
	testutil.StartsSandboxes(t)
	t.Parallel()
	root := shortRoot(t)
	image := makeImage(t)
	// Without a daemon the creator owns the journal and dies with it.
	r := nexusEnv(t, root, []string{"NEXUS_NO_AUTO_DAEMON=1", "NEXUS_CRASH_AT=create.workspace-disk"}, "--driver", "process", "create", "--image", image)
	if r.code != -1 {
		t.Fatalf("create was not killed at its step: exit %d %s", r.code, r.stderr)
	}
	startDaemon(t, root)
	if list := sandboxes(t, root); len(list) != 0 {
		t.Fatalf("the daemon served with a dead create still open: %+v", list)
	}
	assertNothingLeft(t, root)
	journalMatchesDisk(t, root)
}
