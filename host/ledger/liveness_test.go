package ledger

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	format "github.com/nexus-sandbox/nexus/ledger"
)

// The helper process: opens its own run in the directory named by
// LEDGER_HOLD_DIR, spawns a grandchild that outlives it, prints the
// grandchild's pid and waits to be killed.
func TestMain(m *testing.M) {
	if dir := os.Getenv("LEDGER_HOLD_DIR"); dir != "" {
		rec, err := SelfRecord(os.Getenv("LEDGER_HOLD_RUN"), "process", "")
		if err == nil {
			_, err = Open(dir, rec)
		}
		if err != nil {
			fmt.Println("error:", err)
			os.Exit(1)
		}
		// The grandchild is exec'd like anything a client spawns.
		gc := exec.Command("sleep", "300")
		if err := gc.Start(); err != nil {
			fmt.Println("error:", err)
			os.Exit(1)
		}
		fmt.Println(gc.Process.Pid)
		select {}
	}
	os.Exit(m.Run())
}

func planOf(t *testing.T, dir, run string) format.Decision {
	t.Helper()
	plan, err := Plan(dir, format.Self{Run: "SWEEPER", Driver: "process"}, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range plan {
		if p.Run == run {
			return p.Decision
		}
	}
	t.Fatalf("run %s not in the plan %+v", run, plan)
	return format.Decision{}
}

// TestLivenessLockDiesWithItsOwner: a real owner process holds its record's
// lock, so a sweep keeps the run without /proc; once the owner is
// SIGKILLed, a grandchild it spawned (and that still runs) does not hold
// the lock, and the run is judged dead by pid and start time.
func TestLivenessLockDiesWithItsOwner(t *testing.T) {
	dir := t.TempDir()
	owner := exec.Command(os.Args[0], "-test.run=^$")
	owner.Env = append(os.Environ(), "LEDGER_HOLD_DIR="+dir, "LEDGER_HOLD_RUN=OWNER")
	out, err := owner.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := owner.Start(); err != nil {
		t.Fatal(err)
	}
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil || strings.HasPrefix(line, "error") {
		owner.Process.Kill()
		t.Fatalf("owner: %q %v", line, err)
	}
	var grandchild int
	fmt.Sscan(line, &grandchild)
	t.Cleanup(func() { syscall.Kill(grandchild, syscall.SIGKILL) })

	if d := planOf(t, dir, "OWNER"); d.Verdict != format.Keep || d.Reason != format.ReasonOwnerLocked {
		t.Fatalf("live owner: %+v, want keep by its lock", d)
	}
	owner.Process.Signal(syscall.SIGKILL)
	owner.Wait()
	if err := syscall.Kill(grandchild, 0); err != nil {
		t.Fatalf("the grandchild should still run: %v", err)
	}
	if d := planOf(t, dir, "OWNER"); d.Verdict != format.Sweep || d.Reason != format.ReasonOwnerGone {
		t.Fatalf("killed owner: %+v, want swept as gone", d)
	}
}

// TestLivenessLockIsOnlyTakenForOwnRecord: a record this process writes for
// another process carries no lock (it would be a false proof of life), and
// a clean close releases the lock of our own.
func TestLivenessLockIsOnlyTakenForOwnRecord(t *testing.T) {
	dir := t.TempDir()
	me, err := SelfRecord("MINE", "process", "")
	if err != nil {
		t.Fatal(err)
	}
	mine, err := Open(dir, me)
	if err != nil {
		t.Fatal(err)
	}
	if mine.live == nil {
		t.Fatal("own run opened without its liveness lock")
	}
	foreign := me
	foreign.Run, foreign.StartTimeMs = "FOREIGN", me.StartTimeMs-60_000
	if r, err := Open(dir, foreign); err != nil || r.live != nil {
		t.Fatalf("foreign record: %v, locked %v", err, r != nil && r.live != nil)
	}
	if d := planOf(t, dir, "MINE"); d.Reason != format.ReasonOwnerLocked {
		t.Fatalf("own run seen by another sweeper: %+v", d)
	}
	if d := planOf(t, dir, "FOREIGN"); d.Reason != format.ReasonPidReused {
		t.Fatalf("foreign run: %+v", d)
	}
	if err := mine.Close(); err != nil || mine.live != nil {
		t.Fatalf("close: %v, lock still held %v", err, mine.live != nil)
	}
}
