package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/oklog/ulid/v2"

	"github.com/nexus-sandbox/nexus/internal/testutil"
	"github.com/nexus-sandbox/nexus/projections"
)

var (
	daemonPids         = testutil.DaemonPids
	stopDaemons        = testutil.StopDaemons
	stopBinaryDaemons  = testutil.StopBinaryDaemons
	killProcessesUnder = testutil.KillProcessesUnder
)

var daemonCleanups sync.Map

// stopDaemonsAtEnd stops, when t ends, the daemon a command on root may have
// started on demand. Registered after the root was made, it runs before the
// root is removed.
func stopDaemonsAtEnd(t testing.TB, root string) {
	type key struct {
		t    testing.TB
		root string
	}
	if _, loaded := daemonCleanups.LoadOrStore(key{t, root}, true); loaded {
		return
	}
	t.Cleanup(func() {
		stopDaemons(root)
		daemonCleanups.Delete(key{t, root})
	})
}

// waitUntil polls cond until it holds or a generous deadline passes (then the
// test fails naming what): a condition, not a timing, is what is asserted.
func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	testutil.WaitUntil(t, 2*time.Minute, what, cond)
}

// pauseAll starts n creates that each stop themselves (SIGSTOP) at the step
// at, and waits until every one of them is stopped there: all n are then mid
// saga at the same moment. A create that cannot get there (the state root
// busy) fails the test with its error.
func pauseAll(t *testing.T, root string, n int, at string, args ...string) []*exec.Cmd {
	t.Helper()
	cmds := make([]*exec.Cmd, n)
	lines := make(chan string, n)
	for i := range cmds {
		c := exec.Command(nexusBin, append([]string{"--state-dir", root, "--driver", "process", "create", "--json"}, args...)...)
		c.Env = append(os.Environ(), "NEXUS_STATE_DIR=", "NEXUS_PAUSE_AT="+at)
		c.Stdout = &strings.Builder{}
		stderr, err := c.StderrPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := c.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Process.Kill(); c.Wait() })
		cmds[i] = c
		go func() {
			r := bufio.NewReader(stderr)
			line, _ := r.ReadString('\n')
			lines <- line
			for {
				if _, err := r.ReadString('\n'); err != nil {
					return
				}
			}
		}()
	}
	for range cmds {
		if line := <-lines; !strings.Contains(line, "paused at "+at) {
			t.Fatalf("a create did not reach %s while the others were there: %q", at, line)
		}
	}
	for _, c := range cmds {
		waitStopped(t, c.Process.Pid)
	}
	return cmds
}

func resumeAll(t *testing.T, cmds []*exec.Cmd) []jsonSandbox {
	t.Helper()
	var out []jsonSandbox
	for _, c := range cmds {
		c.Process.Signal(syscall.SIGCONT)
	}
	for _, c := range cmds {
		if err := c.Wait(); err != nil {
			t.Fatalf("create %d: %v", c.Process.Pid, err)
		}
		var sb jsonSandbox
		if err := json.Unmarshal([]byte(c.Stdout.(*strings.Builder).String()), &sb); err != nil {
			t.Fatalf("create --json: %v", err)
		}
		out = append(out, sb)
	}
	return out
}

// TestParallelCreatesWithoutDaemon: on a root where nobody started a daemon,
// 4 creates are all frozen mid saga at once (each after copying its disk,
// before journaling it), and ls answers meanwhile; resumed, all 4 succeed.
// With commands owning journal/LOCK for their whole run, only one create
// could get there; the other 3 fail "busy" after 10 s.
func TestParallelCreatesWithoutDaemon(t *testing.T) {
	testutil.StartsSandboxes(t)
	t.Parallel()
	root := shortRoot(t)
	img := makeImage(t)
	cmds := pauseAll(t, root, 4, "create.workspace-disk:before", "--image", img)
	list := sandboxes(t, root)
	if len(list) != 4 {
		t.Fatalf("ls during 4 frozen creates listed %d sandboxes", len(list))
	}
	for _, sb := range list {
		if sb.State != projections.StateCreating {
			t.Fatalf("frozen create shows %s", sb.State)
		}
	}
	done := resumeAll(t, cmds)
	for _, sb := range done {
		if sb.State != projections.StateRunning {
			t.Fatalf("create ended %s", sb.State)
		}
	}
	if n := len(daemonPids(root)); n != 1 {
		t.Fatalf("%d daemons serve the root, want the 1 started on demand", n)
	}
	assertClean(t, root)
	for _, sb := range done {
		mustOK(t, proc(t, root, "rm", "-f", "--with-snapshots", sb.ID), "rm")
	}
	assertNothingLeft(t, root)
}

// TestLsAnswersDuringLongCreate: a create of a large sparse image is frozen
// right after its disk copy; ls, inspect and events answer, and a second
// create runs to the end, while it stays frozen.
func TestLsAnswersDuringLongCreate(t *testing.T) {
	testutil.StartsSandboxes(t)
	t.Parallel()
	root := shortRoot(t)
	big := filepath.Join(t.TempDir(), "big.raw")
	f, err := os.Create(big)
	if err != nil {
		t.Fatal(err)
	}
	f.WriteAt(bytes.Repeat([]byte{1}, 1<<20), 0)
	f.Truncate(16 << 30)
	f.Close()
	frozen := pauseAll(t, root, 1, "create.workspace-disk:before", "--image", big)
	if list := sandboxes(t, root); len(list) != 1 || list[0].State != projections.StateCreating {
		t.Fatalf("ls during the copy: %+v", list)
	}
	mustOK(t, nexus(t, root, "events"), "events")
	other := createJSON(t, root, "--image", makeImage(t))
	mustOK(t, nexus(t, root, "inspect", other.ID), "inspect")
	resumeAll(t, frozen)
	list := sandboxes(t, root)
	if len(list) != 2 {
		t.Fatalf("%d sandboxes after both creates", len(list))
	}
	for _, sb := range list {
		mustOK(t, proc(t, root, "rm", "-f", "--with-snapshots", sb.ID), "rm")
	}
	assertNothingLeft(t, root)
}

// TestEventsFollowDoesNotBlock: a follower stays connected while other
// commands run to the end, and it hears their events.
func TestEventsFollowDoesNotBlock(t *testing.T) {
	t.Parallel()
	root := shortRoot(t)
	stopDaemonsAtEnd(t, root)
	_, heard := followCreates(t, nexusBin, root, nil)
	waitUntil(t, "serving the follower", func() bool { return len(daemonPids(root)) == 1 })
	for range 2 {
		mustOK(t, nexus(t, root, "demo"), "demo beside a follower")
	}
	mustOK(t, nexus(t, root, "ls"), "ls beside a follower")
	for i := range 2 {
		hearCreate(t, heard, fmt.Sprintf("create %d of 2", i+1))
	}
}

// followCreates runs bin's `events --follow --type sandbox.created` on
// root until the test ends, its stderr to stderr (when not nil); heard is
// its lines, closed when it exits.
func followCreates(t *testing.T, bin, root string, stderr io.Writer) (f *exec.Cmd, heard <-chan string) {
	t.Helper()
	f = exec.Command(bin, "--state-dir", root, "events", "--follow", "--type", "sandbox.created")
	f.Env = append(os.Environ(), "NEXUS_STATE_DIR=")
	f.Stderr = stderr
	out, err := f.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	testutil.StartChild(t, f)
	lines := make(chan string, 64)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
	}()
	return f, lines
}

// hearCreate fails unless the follower's next line is a sandbox.created.
func hearCreate(t *testing.T, heard <-chan string, what string) {
	t.Helper()
	select {
	case line, ok := <-heard:
		if !ok || !strings.Contains(line, "sandbox.created") {
			t.Fatalf("%s: follower heard %q (open %v)", what, line, ok)
		}
	case <-time.After(testutil.Scale(2 * time.Minute)):
		t.Fatalf("%s: follower heard nothing", what)
	}
}

// TestRacingFirstCommandsStartOneDaemon: 8 commands start at once on a root
// with no daemon; all succeed and exactly one daemon was ever started (its
// log says so once).
func TestRacingFirstCommandsStartOneDaemon(t *testing.T) {
	t.Parallel()
	root := shortRoot(t)
	var wg sync.WaitGroup
	results := make([]result, 8)
	for i := range results {
		wg.Go(func() { results[i] = nexus(t, root, "ls", "--json") })
	}
	wg.Wait()
	for i, r := range results {
		if r.code != 0 {
			t.Fatalf("command %d: exit %d: %s", i, r.code, r.stderr)
		}
	}
	log, err := os.ReadFile(filepath.Join(root, "logs", "daemon.log"))
	if err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(string(log), "serving"); n != 1 || strings.Count(string(log), "\n") != 1 {
		t.Fatalf("daemon log after 8 racing first commands:\n%s", log)
	}
	if pids := daemonPids(root); len(pids) != 1 {
		t.Fatalf("daemons running: %v", pids)
	}
}

// TestAutoDaemonExitsWhenIdle: with NEXUS_DAEMON_IDLE=1s the daemon started
// on demand stays while a follower is connected, exits (socket gone) once
// nobody is, and the next command starts a new one.
func TestAutoDaemonExitsWhenIdle(t *testing.T) {
	root := shortRoot(t)
	t.Setenv("NEXUS_DAEMON_IDLE", "1s")
	f := exec.Command(nexusBin, "--state-dir", root, "events", "--all", "--follow", "-q")
	f.Env = append(os.Environ(), "NEXUS_STATE_DIR=")
	out, _ := f.StdoutPipe()
	if err := f.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Process.Kill(); f.Wait() })
	mustOK(t, nexus(t, root, "demo"), "demo")
	if line, err := bufio.NewReader(out).ReadString('\n'); err != nil {
		t.Fatalf("follower: %q, %v", line, err)
	}
	pids := daemonPids(root)
	if len(pids) != 1 {
		t.Fatalf("daemons with a follower: %v", pids)
	}
	time.Sleep(3 * time.Second) // three idle periods with a follower connected
	if now := daemonPids(root); !slices.Equal(now, pids) {
		t.Fatalf("daemon %v left while a follower was connected (now %v)", pids, now)
	}
	f.Process.Kill()
	f.Wait()
	waitUntil(t, "idled out", func() bool { return len(daemonPids(root)) == 0 })
	if _, err := os.Lstat(filepath.Join(root, "nexus.sock")); !os.IsNotExist(err) {
		t.Fatalf("socket left by the idle daemon: %v", err)
	}
	if r := mustOK(t, nexus(t, root, "events", "--all", "-q"), "events after idle exit"); strings.Count(r.stdout, "\n") != 10 {
		t.Fatalf("events after the idle exit: %q", r.stdout)
	}
	if now := daemonPids(root); len(now) != 1 || now[0] == pids[0] {
		t.Fatalf("after idle exit, daemons %v (before %v)", now, pids)
	}
}

// TestKilledAutoDaemonMidCommand: the daemon started on demand is SIGKILLed
// while a create is frozen mid saga. The create, resumed, reaches a new
// daemon by itself; `recover` finishes whatever is open, and the journal and
// the disk agree.
func TestKilledAutoDaemonMidCommand(t *testing.T) {
	testutil.StartsSandboxes(t)
	t.Parallel()
	root := shortRoot(t)
	img := makeImage(t)
	first := createJSON(t, root, "--image", img)
	frozen := pauseAll(t, root, 1, "create.workspace-disk:before", "--image", img)
	old := daemonPids(root)
	if len(old) != 1 {
		t.Fatalf("daemons: %v", old)
	}
	syscall.Kill(old[0], syscall.SIGKILL)
	waitUntil(t, "dead", func() bool { return len(daemonPids(root)) == 0 })
	c := frozen[0]
	c.Process.Signal(syscall.SIGCONT)
	err := c.Wait()
	t.Logf("create after its daemon was killed: %v", err)
	now := daemonPids(root)
	if len(now) != 1 || now[0] == old[0] {
		t.Fatalf("daemons after the kill: %v (killed %d)", now, old[0])
	}
	mustOK(t, nexus(t, root, "recover"), "recover")
	if r := nexus(t, root, "replay", "verify"); r.code != 0 {
		t.Fatalf("replay verify: %s%s", r.stdout, r.stderr)
	}
	assertClean(t, root)
	found := false
	for _, sb := range sandboxes(t, root) {
		found = found || sb.ID == first.ID
	}
	if !found {
		t.Fatal("the sandbox created before the kill is gone")
	}
	for _, sb := range sandboxes(t, root) {
		mustOK(t, proc(t, root, "rm", "-f", "--with-snapshots", sb.ID), "rm")
	}
	assertNothingLeft(t, root)
}

// TestNoAutoDaemonKeepsInProcess: NEXUS_NO_AUTO_DAEMON=1 opens the journal
// in the command itself, as before: no daemon, no socket.
func TestNoAutoDaemonKeepsInProcess(t *testing.T) {
	t.Parallel()
	root := shortRoot(t)
	mustOK(t, nexusEnv(t, root, []string{"NEXUS_NO_AUTO_DAEMON=1"}, "demo"), "demo")
	if pids := daemonPids(root); len(pids) != 0 {
		t.Fatalf("a daemon started: %v", pids)
	}
	if _, err := os.Lstat(filepath.Join(root, "nexus.sock")); !os.IsNotExist(err) {
		t.Fatalf("socket: %v", err)
	}
}

// TestSweepRetiresAutoDaemon: a ledger sweep that removes owns the journal
// in its own process (its rule "every open saga's runner is dead" needs
// that); an on-demand daemon steps down for it, a hand-started one does
// not. recover goes through the daemon like any command.
func TestSweepRetiresAutoDaemon(t *testing.T) {
	t.Parallel()
	root := shortRoot(t)
	mustOK(t, nexus(t, root, "demo"), "demo")
	auto := daemonPids(root)
	if len(auto) != 1 {
		t.Fatal("no daemon started on demand")
	}
	mustOK(t, nexus(t, root, "recover"), "recover")
	if now := daemonPids(root); !slices.Equal(now, auto) {
		t.Fatalf("recover changed the daemon: %v, was %v", now, auto)
	}
	dir := deadRun(t, root, "dead")
	writeHand(t, dir, "dead.sandboxes", ulidString()+"\n")
	if out := sweepJSON(t, root); len(out) != 1 || out[0].Verdict != "sweep" || out[0].Error != "" {
		t.Fatalf("sweep: %+v", out)
	}
	waitUntil(t, "retired", func() bool { return !slices.Contains(daemonPids(root), auto[0]) })

	stopDaemons(root)
	d := startDaemon(t, root)
	deadRun(t, root, "dead2")
	writeHand(t, dir, "dead2.sandboxes", ulidString()+"\n")
	sweepJSON(t, root)
	if pids := daemonPids(root); len(pids) != 1 || pids[0] != d.Cmd.Process.Pid {
		t.Fatalf("daemons after a sweep: %v, want the hand-started %d", pids, d.Cmd.Process.Pid)
	}
}

func ulidString() string { return ulid.Make().String() }

// BenchmarkConcurrentCreatesAutoVsHand: rounds of 4 creates at once, with
// no daemon started by hand (the first command starts one on demand) and
// through a daemon started by hand (before the clock runs), alternating
// within one run. ratio is the on-demand throughput over the hand-started
// one over b.N rounds on one root each (the start on demand is in the
// first round; it should stay at 0.8 or above). cold-ratio is the same
// with a fresh root every round, so every on-demand round pays a start.
func BenchmarkConcurrentCreatesAutoVsHand(b *testing.B) {
	img := makeImage(b)
	const n = 4
	round := func(root string) time.Duration {
		start := time.Now()
		var wg sync.WaitGroup
		for range n {
			wg.Go(func() { mustOK(b, proc(b, root, "create", "--image", img), "create") })
		}
		wg.Wait()
		return time.Since(start)
	}
	autoRoot, handRoot := shortRoot(b), shortRoot(b)
	startDaemon(b, handRoot)
	var auto, hand, coldAuto, coldHand time.Duration
	for i := 0; i < b.N; i++ {
		auto += round(autoRoot)
		hand += round(handRoot)
		b.StopTimer()
		a, h := shortRoot(b), shortRoot(b)
		startDaemon(b, h)
		b.StartTimer()
		coldAuto += round(a)
		coldHand += round(h)
		b.StopTimer()
		// The sandboxes' VMMs and supervisors are not what is measured.
		for _, r := range []string{a, h, autoRoot, handRoot} {
			killProcessesUnder(r)
		}
		b.StartTimer()
	}
	b.ReportMetric(float64(hand)/float64(auto), "ratio")
	b.ReportMetric(float64(coldHand)/float64(coldAuto), "cold-ratio")
	b.ReportMetric(ms(auto/time.Duration(b.N)), "auto-ms/round")
	b.ReportMetric(ms(hand/time.Duration(b.N)), "hand-ms/round")
	b.ReportMetric(ms(coldAuto/time.Duration(b.N)), "cold-auto-ms/round")
	b.ReportMetric(ms(coldHand/time.Duration(b.N)), "cold-hand-ms/round")
}

// TestFollowerSurvivesRetire: a hand-started daemon retires the on-demand
// one while `events --follow` is connected; the takeover is not kept
// waiting by the follower, which resumes through the new daemon and hears
// what comes after, once.
func TestFollowerSurvivesRetire(t *testing.T) {
	t.Parallel()
	root := shortRoot(t)
	// Stop the follower before its daemon: it would start a new one.
	stopDaemonsAtEnd(t, root)
	_, heard := followCreates(t, nexusBin, root, nil)
	mustOK(t, nexus(t, root, "demo"), "demo")
	hearCreate(t, heard, "first demo")
	before := daemonPids(root)
	d := startDaemon(t, root) // retires the on-demand daemon, whose follow stream ends
	mustOK(t, nexus(t, root, "demo"), "demo after the takeover")
	hearCreate(t, heard, "demo after the takeover")
	// A daemon the follower started on demand while the takeover waited
	// for the journal finds the hand-started one serving and leaves.
	waitUntil(t, "served by the hand-started daemon alone", func() bool {
		after := daemonPids(root)
		return len(after) == 1 && after[0] == d.Cmd.Process.Pid
	})
	if len(before) != 1 || before[0] == d.Cmd.Process.Pid {
		t.Fatalf("daemons before the takeover: %v", before)
	}
	select {
	case line := <-heard:
		t.Fatalf("follower heard an event twice or out of place: %q", line)
	default:
	}
}

// TestHandDaemonTakesOver: `nexus daemon` started by hand on a root an
// on-demand daemon serves retires that one and serves in its place.
func TestHandDaemonTakesOver(t *testing.T) {
	t.Parallel()
	root := shortRoot(t)
	mustOK(t, nexus(t, root, "demo"), "demo")
	auto := daemonPids(root)
	if len(auto) != 1 {
		t.Fatalf("daemons after demo: %v", auto)
	}
	d := startDaemon(t, root)
	waitUntil(t, "retired", func() bool { return !slices.Contains(daemonPids(root), auto[0]) })
	if r := mustOK(t, nexus(t, root, "events", "--all", "-q"), "events"); strings.Count(r.stdout, "\n") != 10 {
		t.Fatalf("events through the hand-started daemon: %q", r.stdout)
	}
	if pids := daemonPids(root); len(pids) != 1 || pids[0] != d.Cmd.Process.Pid {
		t.Fatalf("daemons %v, want only the hand-started %d", pids, d.Cmd.Process.Pid)
	}
}
