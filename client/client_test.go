package client_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/nexus-sandbox/nexus/client"
	hostledger "github.com/nexus-sandbox/nexus/host/ledger"
	"github.com/nexus-sandbox/nexus/internal/testutil"
	"github.com/nexus-sandbox/nexus/ledger"
)

var nexusBin string

// TestMain builds the real nexus binary. Run with NEXUS_TEST_CLIENT_MAIN=1,
// the test binary is instead a client program (see clientMain).
func TestMain(m *testing.M) {
	if os.Getenv("NEXUS_TEST_CLIENT_MAIN") == "1" {
		clientMain()
		return
	}
	flag.Parse()
	if testing.Short() {
		// Every test here starts sandboxes (testutil.StartsSandboxes), and
		// so does the example, which cannot skip itself: -short runs
		// neither, nor builds the binaries they would run.
		set := false
		flag.Visit(func(f *flag.Flag) { set = set || f.Name == "test.run" })
		if !set {
			flag.Set("test.run", "^Test")
		}
		os.Exit(m.Run())
	}
	bin, remove, err := testutil.BuildNexus()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	nexusBin = bin
	// The example finds nexus, and nexusd beside it, on PATH.
	os.Setenv("PATH", filepath.Dir(bin)+string(os.PathListSeparator)+os.Getenv("PATH"))
	code := m.Run()
	remove()
	os.Exit(code)
}

type started struct {
	Watchdog int      `json:"watchdog"`
	Child    int      `json:"child"`
	IDs      []string `json:"ids"`
	Run      string   `json:"run"`
}

// clientMain is a program using the client: it creates N sandboxes, starts a
// long-lived child of its own, reports, then waits to be killed.
func clientMain() {
	fail := func(err error) {
		fmt.Fprintln(os.Stderr, "client main:", err)
		os.Exit(1)
	}
	c, err := client.New(client.Options{Nexus: os.Getenv("T_NEXUS"), StateDir: os.Getenv("T_ROOT"), Driver: "process"})
	if err != nil {
		fail(err)
	}
	var n int
	fmt.Sscan(os.Getenv("T_COUNT"), &n)
	var s started
	for i := 0; i < n; i++ {
		sb, err := c.Create(context.Background(), client.CreateSpec{Image: os.Getenv("T_IMAGE")})
		if err != nil {
			fail(err)
		}
		s.IDs = append(s.IDs, sb.ID)
	}
	child := exec.Command("sleep", "600")
	if err := child.Start(); err != nil {
		fail(err)
	}
	s.Watchdog, s.Child, s.Run = c.WatchdogPid(), child.Process.Pid, c.RunID()
	json.NewEncoder(os.Stdout).Encode(s)
	if os.Getenv("T_CLOSE") == "1" {
		if err := c.Close(context.Background()); err != nil {
			fail(err)
		}
		child.Process.Kill()
		return
	}
	select {}
}

// shortRoot: a state root whose processes and daemons never outlive the
// test (testutil.ShortRoot).
var shortRoot = testutil.ShortRoot

// processClient is a client of the state root root on the process
// driver, through the nexus binary the tests built.
func processClient(t testing.TB, root string) *client.Client {
	t.Helper()
	c, err := client.New(client.Options{Nexus: nexusBin, StateDir: root, Driver: "process"})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func image(t testing.TB) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "base.raw")
	if err := os.WriteFile(p, bytes.Repeat([]byte{7}, 1<<20), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(p, 64<<20); err != nil {
		t.Fatal(err)
	}
	return p
}

func startClient(t *testing.T, root string, count int, env ...string) (*exec.Cmd, started) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), "NEXUS_TEST_CLIENT_MAIN=1", "T_NEXUS="+nexusBin, "T_ROOT="+root,
		"T_IMAGE="+image(t), fmt.Sprintf("T_COUNT=%d", count))
	cmd.Env = append(cmd.Env, env...)
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	line, err := bufio.NewReader(out).ReadBytes('\n')
	if err != nil {
		cmd.Process.Kill()
		cmd.Wait()
		t.Fatalf("client program: %v", err)
	}
	var s started
	if err := json.Unmarshal(line, &s); err != nil {
		t.Fatalf("client program said %q: %v", line, err)
	}
	return cmd, s
}

func nexus(t *testing.T, root string, args ...string) string {
	t.Helper()
	cmd := exec.Command(nexusBin, append([]string{"--state-dir", root, "--driver", "process"}, args...)...)
	cmd.Env = append(os.Environ(), "NEXUS_STATE_DIR=", "NEXUS_RUN_ID=")
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("nexus %v: %v", args, err)
	}
	return string(out)
}

func liveIDs(t *testing.T, root string) map[string]bool {
	t.Helper()
	var list []struct {
		ID string `json:"id"`
	}
	if err := json.Unmarshal([]byte(nexus(t, root, "ls", "--json")), &list); err != nil {
		t.Fatal(err)
	}
	ids := map[string]bool{}
	for _, sb := range list {
		ids[sb.ID] = true
	}
	return ids
}

// waitExit waits for a process that is not our child to exit, on its pidfd.
func waitExit(t *testing.T, pid int, d time.Duration) bool {
	t.Helper()
	fd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		return err == unix.ESRCH
	}
	defer unix.Close(fd)
	n, err := unix.Poll([]unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}, int(d/time.Millisecond))
	return err == nil && n == 1
}

func alive(pid int) bool { return syscall.Kill(pid, 0) == nil }

// TestWatchdogReapsKilledClient: a real client program with 3 live
// sandboxes and a live child of its own is SIGKILLed; its watchdog removes
// all 3 within 5 seconds although the child still runs (it never held the
// pipe's write end).
func TestWatchdogReapsKilledClient(t *testing.T) {
	testutil.StartsSandboxes(t)
	root := shortRoot(t)
	cmd, s := startClient(t, root, 3)
	t.Cleanup(func() { syscall.Kill(s.Child, syscall.SIGKILL) })
	if len(s.IDs) != 3 || s.Watchdog == 0 {
		t.Fatalf("client started %+v", s)
	}
	live := liveIDs(t, root)
	for _, id := range s.IDs {
		if !live[id] {
			t.Fatalf("%s not live before the kill", id)
		}
	}
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	cmd.Wait()
	killed := time.Now()
	if !waitExit(t, s.Watchdog, 5*time.Second) {
		t.Fatalf("watchdog %d still running 5 s after the client was killed", s.Watchdog)
	}
	took := time.Since(killed)
	if !alive(s.Child) {
		t.Fatal("the client's child died; the test proves nothing about the pipe")
	}
	live = liveIDs(t, root)
	for _, id := range s.IDs {
		if live[id] {
			t.Fatalf("%s survived the watchdog", id)
		}
	}
	if left, _ := os.ReadDir(filepath.Join(root, "runs")); len(left) != 0 {
		t.Fatalf("ledger files left: %v", left)
	}
	ev := nexus(t, root, "events", "--type", "run.swept", "--json")
	if !strings.Contains(ev, s.Run) || !strings.Contains(ev, `watchdog`) {
		t.Fatalf("no run.swept event by the watchdog: %s", ev)
	}
	t.Logf("watchdog removed 3 sandboxes %v after SIGKILL", took)
}

// TestCleanCloseLeavesNothing: a client that closes removes its sandboxes
// and files; its watchdog exits at once.
func TestCleanCloseLeavesNothing(t *testing.T) {
	testutil.StartsSandboxes(t)
	root := shortRoot(t)
	cmd, s := startClient(t, root, 1, "T_CLOSE=1")
	if err := cmd.Wait(); err != nil {
		t.Fatal(err)
	}
	if !waitExit(t, s.Watchdog, 5*time.Second) {
		t.Fatal("watchdog did not exit after a clean close")
	}
	if len(liveIDs(t, root)) != 0 {
		t.Fatal("clean close left sandboxes")
	}
	if left, _ := os.ReadDir(filepath.Join(root, "runs")); len(left) != 0 {
		t.Fatalf("ledger files left: %v", left)
	}
	if ev := nexus(t, root, "events", "--type", "run.swept"); strings.TrimSpace(ev) != "" {
		t.Fatalf("a clean close journaled a sweep: %s", ev)
	}
}

// TestKeepNeverEntersLedger: a kept sandbox is never listed, so neither
// the watchdog nor a sweep removes it.
func TestKeepNeverEntersLedger(t *testing.T) {
	testutil.StartsSandboxes(t)
	root := shortRoot(t)
	c, err := client.New(client.Options{Nexus: nexusBin, StateDir: root, Driver: "process", Reaper: ledger.ModeSweep})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	img := image(t)
	kept, err := c.Create(ctx, client.CreateSpec{Image: img, Keep: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { exec.Command(nexusBin, "--state-dir", root, "rm", "-f", "--with-snapshots", kept.ID).Run() })
	bound, err := c.Create(ctx, client.CreateSpec{Image: img})
	if err != nil {
		t.Fatal(err)
	}
	if c.WatchdogPid() != 0 {
		t.Fatal("NEXUS_REAPER=sweep spawned a watchdog")
	}
	data, _ := os.ReadFile(filepath.Join(root, "runs", c.RunID()+".sandboxes"))
	if strings.Contains(string(data), kept.ID) || !strings.Contains(string(data), bound.ID) {
		t.Fatalf("ledger %q: kept %s must be absent, bound %s present", data, kept.ID, bound.ID)
	}
	if err := c.Close(ctx); err != nil {
		t.Fatal(err)
	}
	live := liveIDs(t, root)
	if !live[kept.ID] || live[bound.ID] {
		t.Fatalf("after close: %v (kept %s, bound %s)", live, kept.ID, bound.ID)
	}
	// A sweep after this process's run is gone still leaves it alone.
	nexus(t, root, "ledger", "sweep")
	if !liveIDs(t, root)[kept.ID] {
		t.Fatal("a sweep removed the kept sandbox")
	}
	nexus(t, root, "rm", "-f", "--with-snapshots", kept.ID)
}

// TestHappyPathSweepSpawnsNothing: with only live runs the sweep decides in
// process; the nexus binary is needed (and run) only once a run is dead.
func TestHappyPathSweepSpawnsNothing(t *testing.T) {
	testutil.StartsSandboxes(t)
	root := t.TempDir()
	dir := filepath.Join(root, "runs")
	os.MkdirAll(dir, 0o700)
	c, err := client.New(client.Options{Nexus: nexusBin, StateDir: root, Driver: "process", Reaper: ledger.ModeSweep})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Begin(context.Background()); err != nil { // writes a live run: ours
		t.Fatal(err)
	}
	defer c.Close(context.Background())
	missing := filepath.Join(t.TempDir(), "no-nexus-here")
	out, err := client.Sweep(context.Background(), missing, root, "process", "another-run")
	if err != nil || len(out) != 1 || out[0].Verdict != "keep" {
		t.Fatalf("live-only sweep: %+v %v", out, err)
	}
	os.WriteFile(filepath.Join(dir, "dead.json"), []byte(`{"schema":1,"run":"dead","pid":4194304,"start_time_ms":1,"driver":"process","nexus":""}`), 0o600)
	if _, err := client.Sweep(context.Background(), missing, root, "process", "another-run"); err == nil {
		t.Fatal("a dead run was swept without running nexus")
	}
	out, err = client.Sweep(context.Background(), nexusBin, root, "process", "another-run")
	if err != nil || len(out) != 2 {
		t.Fatalf("sweep with a dead run: %+v %v", out, err)
	}
}

// keptEvents reads every run.kept event of root: sweeper -> run -> reason.
func keptEvents(t *testing.T, root string) map[string]map[string]string {
	t.Helper()
	bySweeper := map[string]map[string]string{}
	for _, line := range strings.Split(strings.TrimSpace(nexus(t, root, "events", "--type", "run.kept", "--json")), "\n") {
		if line == "" {
			continue
		}
		var ev struct {
			Data struct {
				By, Sweeper string
				Kept        []struct {
					Reason string
					Runs   []string
				}
			}
		}
		if err := json.Unmarshal([]byte(line), &ev); err != nil {
			t.Fatal(err)
		}
		if ev.Data.By != "init" || bySweeper[ev.Data.Sweeper] != nil {
			t.Fatalf("run.kept %s: want one event per sweep, by init", line)
		}
		runs := map[string]string{}
		for _, g := range ev.Data.Kept {
			for _, r := range g.Runs {
				runs[r] = g.Reason
			}
		}
		bySweeper[ev.Data.Sweeper] = runs
	}
	return bySweeper
}

// TestKeepDecisionsAreJournaled: the happy-path sweep decides in the
// client's own process, and its keep decisions reach the journal through
// the daemon: at Begin, else with the first create. Every kept run is
// named with its rule.
func TestKeepDecisionsAreJournaled(t *testing.T) {
	testutil.StartsSandboxes(t)
	root := shortRoot(t)
	dir := filepath.Join(root, "runs")
	os.MkdirAll(dir, 0o700)
	// A live owner that does not take the liveness lock (as a client in
	// another language may): judged by pid and start time.
	sleeper := exec.Command("sleep", "300")
	if err := sleeper.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sleeper.Process.Kill(); sleeper.Wait() })
	owner, err := hostledger.OwnerOf(sleeper.Process.Pid)
	if err != nil || !owner.Running {
		t.Fatalf("sleeper: %+v %v", owner, err)
	}
	write := func(run, driver string, pid int, start int64) {
		rec := fmt.Sprintf(`{"schema":1,"run":%q,"pid":%d,"start_time_ms":%d,"driver":%q,"nexus":""}`, run, pid, start, driver)
		if err := os.WriteFile(filepath.Join(dir, run+".json"), []byte(rec), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write("foreign-live", "process", sleeper.Process.Pid, owner.StartTimeMs)
	write("other-driver", "cloud-hypervisor", 4194304, 1)

	ctx := context.Background()
	first, err := client.New(client.Options{Nexus: nexusBin, StateDir: root, Driver: "process", Reaper: ledger.ModeSweep})
	if err != nil {
		t.Fatal(err)
	}
	if err := first.Begin(ctx); err != nil || first.SweepErr() != nil {
		t.Fatalf("begin: %v, sweep: %v", err, first.SweepErr())
	}
	defer first.Close(ctx)
	kept := keptEvents(t, root)
	want := map[string]string{"foreign-live": ledger.ReasonOwnerAlive, "other-driver": ledger.ReasonOtherDriver}
	if fmt.Sprint(kept[first.RunID()]) != fmt.Sprint(want) || len(kept) != 1 {
		t.Fatalf("after Begin: %v, want %s: %v", kept, first.RunID(), want)
	}

	second, err := client.New(client.Options{Nexus: nexusBin, StateDir: root, Driver: "process", Reaper: ledger.ModeSweep})
	if err != nil {
		t.Fatal(err)
	}
	sb, err := second.Create(ctx, client.CreateSpec{Image: image(t)})
	if err != nil {
		t.Fatal(err)
	}
	defer second.Close(ctx)
	kept = keptEvents(t, root)
	// The first client's own run is alive by its liveness lock.
	want[first.RunID()] = ledger.ReasonOwnerLocked
	if fmt.Sprint(kept[second.RunID()]) != fmt.Sprint(want) || len(kept) != 2 {
		t.Fatalf("after Create: %v, want %s: %v", kept, second.RunID(), want)
	}
	// Only the first create carries them.
	if err := second.Remove(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := second.Create(ctx, client.CreateSpec{Image: image(t)}); err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(nexus(t, root, "events", "--type", "run.kept"), "\n"); n != 2 {
		t.Fatalf("%d run.kept events, want 2", n)
	}
}
