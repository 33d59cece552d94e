package main

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nexus-sandbox/nexus/internal/testutil"
)

// deadRun writes by hand the ledger of a run whose owner is gone.
func deadRun(t *testing.T, root, run string) string {
	t.Helper()
	dir := filepath.Join(root, "runs")
	os.MkdirAll(dir, 0o700)
	writeHand(t, dir, run+".json", handRecord(run, goneProcessPid(t), 1_700_000_000_000, "process"))
	return dir
}

// TestCrashedCreateInDeadRunIsSwept: the owner's `nexus create` is killed
// at each of several create steps (before commit: the sandbox is still
// "creating"; after: it runs). The sweep of the dead run leaves nothing:
// an uncommitted create is compensated, a committed one removed.
func TestCrashedCreateInDeadRunIsSwept(t *testing.T) {
	testutil.StartsSandboxes(t)
	t.Parallel()
	img := makeImage(t)
	for _, point := range []string{"create.intents", "create.workspace-disk:before", "create.commit", "create.vmm:before", "create.vmm"} {
		t.Run(point, func(t *testing.T) {
			t.Parallel()
			root := shortRoot(t)
			dir := deadRun(t, root, "dead")
			r := nexusEnv(t, root, []string{"NEXUS_CRASH_AT=" + point, "NEXUS_RUN_ID=dead"}, "--driver", "process", "create", "--image", img)
			if r.code != -1 {
				t.Fatalf("want death by SIGKILL, got exit %d (%s)", r.code, r.stderr)
			}
			listed, _ := os.ReadFile(filepath.Join(dir, "dead.sandboxes"))
			if len(strings.Fields(string(listed))) != 1 {
				t.Fatalf("the create was not listed before it started: %q", listed)
			}
			out := sweepJSON(t, root)
			if len(out) != 1 || out[0].Verdict != "sweep" || out[0].Error != "" || out[0].Skipped != "" {
				t.Fatalf("sweep: %+v", out)
			}
			assertNothingLeft(t, root)
			if left, _ := os.ReadDir(dir); len(left) != 0 {
				t.Fatalf("ledger left: %v", left)
			}
		})
	}
}

// TestSweepKilledMidRemoveIsFinished: the sweeper itself is SIGKILLed inside
// a sandbox's removal; the run's ledger survives (nothing was journaled as
// swept), and the next sweep finishes the removal without error.
func TestSweepKilledMidRemoveIsFinished(t *testing.T) {
	testutil.StartsSandboxes(t)
	t.Parallel()
	img := makeImage(t)
	for _, point := range []string{"rm.vmm-stop", "rm.reclaim:before", "rm.remove:before"} {
		t.Run(point, func(t *testing.T) {
			t.Parallel()
			root := shortRoot(t)
			a := createJSON(t, root, "--image", img)
			b := createJSON(t, root, "--image", img)
			dir := deadRun(t, root, "dead")
			writeHand(t, dir, "dead.sandboxes", a.ID+"\n"+b.ID+"\n")
			crashAt(t, root, point, "ledger", "sweep")
			if _, err := os.Stat(filepath.Join(dir, "dead.json")); err != nil {
				t.Fatalf("a killed sweep lost the ledger: %v", err)
			}
			out := sweepJSON(t, root)
			if len(out) != 1 || out[0].Error != "" || len(out[0].Removed)+len(out[0].NotFound) != 2 {
				t.Fatalf("second sweep: %+v", out)
			}
			assertNothingLeft(t, root)
		})
	}
}

// TestRunForwardsSIGTERM: SIGTERM to `nexus run` reaches the command as
// SIGTERM; once it exits, its sandboxes are removed and nexus run exits with
// the command's status.
func TestRunForwardsSIGTERM(t *testing.T) {
	testutil.StartsSandboxes(t)
	t.Parallel()
	root := shortRoot(t)
	img := makeImage(t)
	ready := filepath.Join(t.TempDir(), "ready")
	script := fmt.Sprintf(`%s --driver process create --image %s >/dev/null || exit 9; trap 'kill $!; exit 5' TERM; sleep 600 & echo up > %s; wait`, nexusBin, img, ready)
	cmd := exec.Command(nexusBin, "--state-dir", root, "--driver", "process", "run", "--", "sh", "-c", script)
	cmd.Env = append(os.Environ(), "NEXUS_STATE_DIR=")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(testutil.Scale(30 * time.Second))
	for {
		if data, _ := os.ReadFile(ready); strings.HasSuffix(string(data), "\n") {
			break
		}
		if time.Now().After(deadline) {
			cmd.Process.Kill()
			t.Fatal("command never became ready")
		}
		time.Sleep(20 * time.Millisecond)
	}
	cmd.Process.Signal(syscall.SIGTERM)
	err := cmd.Wait()
	if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 5 {
		t.Fatalf("nexus run exit: %v, want the command's 5", err)
	}
	assertNothingLeft(t, root)
	if left, _ := os.ReadDir(filepath.Join(root, "runs")); len(left) != 0 {
		t.Fatalf("ledger left %v", left)
	}
}
