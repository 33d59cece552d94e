package main

// A conformance test for the ledger format in docs/ledger.md: it writes
// ledgers the way a Python or Rust client would, with nothing but the
// document (no nexus package is imported here), and checks what the nexus
// binary's sweep does with them.

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nexus-sandbox/nexus/events"
	"github.com/nexus-sandbox/nexus/internal/testutil"
	"github.com/nexus-sandbox/nexus/ledger"
)

// handStartMs computes a process's start time as docs/ledger.md says:
// btime from /proc/stat (seconds) * 1000 + field 22 of /proc/<pid>/stat
// * 1000 / 100 (USER_HZ).
func handStartMs(t *testing.T, pid int) int64 {
	t.Helper()
	stat, err := os.ReadFile("/proc/stat")
	if err != nil {
		t.Fatal(err)
	}
	var btime int64
	for _, line := range strings.Split(string(stat), "\n") {
		if v, ok := strings.CutPrefix(line, "btime "); ok {
			btime, _ = strconv.ParseInt(v, 10, 64)
		}
	}
	ps, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		t.Fatal(err)
	}
	fields := strings.Fields(string(ps[strings.LastIndexByte(string(ps), ')')+1:]))
	ticks, err := strconv.ParseInt(fields[19], 10, 64)
	if err != nil || btime == 0 {
		t.Fatalf("stat: %v btime %d", err, btime)
	}
	return btime*1000 + ticks*10
}

func writeHand(t *testing.T, dir, name, content string) {
	t.Helper()
	if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
}

func handRecord(run string, pid int, startMs int64, driver string) string {
	return fmt.Sprintf(`{"schema":1,"run":%q,"pid":%d,"start_time_ms":%d,"driver":%q,"nexus":""}`+"\n", run, pid, startMs, driver)
}

func goneProcessPid(t *testing.T) int {
	t.Helper()
	c := exec.Command("true")
	if err := c.Run(); err != nil {
		t.Fatal(err)
	}
	return c.Process.Pid
}

func sweepJSON(t *testing.T, root string, args ...string) []ledger.Outcome {
	t.Helper()
	r := mustOK(t, proc(t, root, append([]string{"ledger", "sweep", "--json"}, args...)...), "ledger sweep")
	var out []ledger.Outcome
	if err := json.Unmarshal([]byte(r.stdout), &out); err != nil {
		t.Fatalf("sweep --json %q: %v", r.stdout, err)
	}
	return out
}

func TestLedgerConformanceHandWritten(t *testing.T) {
	testutil.StartsSandboxes(t)
	t.Parallel()
	root := shortRoot(t)
	img := makeImage(t)
	a := createJSON(t, root, "--image", img)
	b := createJSON(t, root, "--image", img, "--handle", "by-handle")
	c := createJSON(t, root, "--image", img)
	d := createJSON(t, root, "--image", img)
	dir := filepath.Join(root, "runs")
	os.MkdirAll(dir, 0o700)

	owner := exec.Command("sleep", "600")
	if err := owner.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { owner.Process.Kill(); owner.Wait() })
	start := handStartMs(t, owner.Process.Pid)

	// dead: owner gone; lists a ULID, a handle, a never-created name (torn
	// last line, no newline) and a network.
	writeHand(t, dir, "dead-run.json", handRecord("dead-run", goneProcessPid(t), start, "process"))
	writeHand(t, dir, "dead-run.sandboxes", a.ID+"\nby-handle\nnever-created")
	writeHand(t, dir, "dead-run.networks", "net-1\n")
	// alive: a live owner, start time 1.5 s off (inside the tolerance).
	writeHand(t, dir, "alive-run.json", handRecord("alive-run", owner.Process.Pid, start+1500, "process"))
	writeHand(t, dir, "alive-run.sandboxes", c.ID+"\n")
	writeHand(t, dir, "alive-run.networks", "")
	// reused: the same live pid, but another start time: not its owner.
	writeHand(t, dir, "reused-run.json", handRecord("reused-run", owner.Process.Pid, start-60_000, "process"))
	writeHand(t, dir, "reused-run.sandboxes", d.ID+"\n")
	// other driver: left for a cloud-hypervisor process to judge.
	writeHand(t, dir, "ch-run.json", handRecord("ch-run", goneProcessPid(t), start, "cloud-hypervisor"))
	writeHand(t, dir, "ch-run.sandboxes", c.ID+"\n")
	// unparseable, young: may be mid-write.
	writeHand(t, dir, "young-run.json", `{"schema":1,"run":"young-`)
	writeHand(t, dir, "young-run.sandboxes", c.ID+"\n")
	// unparseable, old, and without a record at all.
	writeHand(t, dir, "old-run.sandboxes", "no-such-sandbox\n")
	old := time.Now().Add(-2 * time.Hour)
	os.Chtimes(filepath.Join(dir, "old-run.sandboxes"), old, old)
	// newer schema: never ours to judge.
	writeHand(t, dir, "future-run.json", `{"schema":2,"run":"future-run","pid":1,"owner":{"pid":1}}`)

	// ledger ls decides the same and changes nothing.
	var listed []ledger.Outcome
	r := mustOK(t, proc(t, root, "ledger", "ls", "--json"), "ledger ls")
	if err := json.Unmarshal([]byte(r.stdout), &listed); err != nil || len(listed) != 7 {
		t.Fatalf("ledger ls: %v %q", err, r.stdout)
	}
	if _, err := os.Stat(filepath.Join(dir, "dead-run.json")); err != nil {
		t.Fatal("ledger ls removed a ledger")
	}
	got := map[string]ledger.Outcome{}
	for _, o := range listed {
		got[o.Run] = o
	}
	for _, o := range sweepJSON(t, root) {
		if got[o.Run].Verdict != o.Verdict {
			t.Errorf("%s: ls said %s, sweep did %s", o.Run, got[o.Run].Verdict, o.Verdict)
		}
		got[o.Run] = o
		if o.Error != "" {
			t.Errorf("%s: %s", o.Run, o.Error)
		}
	}
	want := map[string]string{"dead-run": "sweep", "alive-run": "keep", "reused-run": "sweep", "ch-run": "keep",
		"young-run": "keep", "old-run": "sweep", "future-run": "keep"}
	for run, v := range want {
		if got[run].Verdict != v {
			t.Errorf("%s: %+v, want %s", run, got[run], v)
		}
	}
	if r := got["dead-run"]; strings.Join(r.Removed, ",") != a.ID+",by-handle" || strings.Join(r.NotFound, ",") != "never-created" || strings.Join(r.Networks, ",") != "net-1" {
		t.Errorf("dead-run outcome %+v", r)
	}
	live := map[string]bool{}
	for _, sb := range sandboxes(t, root) {
		live[sb.ID] = true
	}
	if live[a.ID] || live[b.ID] || live[d.ID] || !live[c.ID] {
		t.Fatalf("live after sweep: %v (want only %s)", live, c.ID)
	}
	var left []string
	des, _ := os.ReadDir(dir)
	for _, de := range des {
		left = append(left, de.Name())
	}
	if strings.Join(left, " ") != "alive-run.json alive-run.networks alive-run.sandboxes ch-run.json ch-run.sandboxes future-run.json young-run.json young-run.sandboxes" {
		t.Fatalf("files left: %v", left)
	}
	// Each sweep decision is in the journal: one run.swept per swept run,
	// one run.kept naming every kept run with its rule.
	ev := mustOK(t, nexus(t, root, "events", "--type", "run.swept", "--json"), "events").stdout
	for _, run := range []string{"dead-run", "reused-run", "old-run"} {
		if !strings.Contains(ev, `"run":"`+run+`"`) {
			t.Errorf("no run.swept event for %s in %s", run, ev)
		}
	}
	keptLines := strings.Split(strings.TrimSpace(mustOK(t, nexus(t, root, "events", "--type", "run.kept", "--json"), "events").stdout), "\n")
	var kept struct {
		Data events.RunKeptEvent `json:"data"`
	}
	if len(keptLines) != 1 || json.Unmarshal([]byte(keptLines[0]), &kept) != nil {
		t.Fatalf("run.kept events: %q", keptLines)
	}
	keptBy := map[string]string{}
	for _, g := range kept.Data.Kept {
		for _, run := range g.Runs {
			keptBy[run] = g.Reason
		}
	}
	wantKept := map[string]string{"alive-run": ledger.ReasonOwnerAlive, "ch-run": ledger.ReasonOtherDriver,
		"young-run": ledger.ReasonUnparseableYoung, "future-run": ledger.ReasonSchemaTooNew}
	if fmt.Sprint(keptBy) != fmt.Sprint(wantKept) || kept.Data.By != "init" || kept.Data.Driver != "process" {
		t.Errorf("run.kept %+v, want %v", kept.Data, wantKept)
	}
	// Bad input to the hidden journal-kept is refused with one line.
	bad := exec.Command(nexusBin, "--state-dir", root, "--driver", "process", "ledger", "journal-kept")
	bad.Stdin = strings.NewReader(`[{"by":"init","driver":"process","part":1,"parts":1,"kept":[{"reason":"x","runs":["../x"]}]}]`)
	if out, err := bad.CombinedOutput(); err == nil || strings.Count(strings.TrimSpace(string(out)), "\n") != 0 {
		t.Errorf("journal-kept of a bad run id: %v %q", err, out)
	}
	mustOK(t, proc(t, root, "rm", "-f", "--with-snapshots", c.ID), "rm")
}

// TestRacingSweepsRemoveEachSandboxOnce: two nexus processes sweep the same
// dead run at once; each sandbox is removed once (one sandbox.removed) and
// neither reports an error. Without a daemon the journal lock orders them
// (the second finds the run gone); with one they run side by side and the
// run's flock decides.
func TestRacingSweepsRemoveEachSandboxOnce(t *testing.T) {
	testutil.StartsSandboxes(t)
	t.Parallel()
	t.Run("no-daemon", func(t *testing.T) { racingSweeps(t, false) })
	t.Run("daemon", func(t *testing.T) { racingSweeps(t, true) })
}

func racingSweeps(t *testing.T, daemon bool) {
	root := shortRoot(t)
	if daemon {
		startDaemon(t, root)
	}
	img := makeImage(t)
	var ids []string
	for range 3 {
		ids = append(ids, createJSON(t, root, "--image", img).ID)
	}
	dir := filepath.Join(root, "runs")
	os.MkdirAll(dir, 0o700)
	writeHand(t, dir, "dead.json", handRecord("dead", goneProcessPid(t), 1_700_000_000_000, "process"))
	writeHand(t, dir, "dead.sandboxes", strings.Join(ids, "\n")+"\n")
	writeHand(t, dir, "dead.networks", "")

	var cmds []*exec.Cmd
	for range 2 {
		c := exec.Command(nexusBin, "--state-dir", root, "--driver", "process", "ledger", "sweep", "--json")
		c.Env = append(os.Environ(), "NEXUS_STATE_DIR=")
		cmds = append(cmds, c)
	}
	outs := make([][]byte, 2)
	errs := make([]error, 2)
	done := make(chan int)
	for i, c := range cmds {
		go func() { outs[i], errs[i] = c.CombinedOutput(); done <- i }()
	}
	<-done
	<-done
	for i := range cmds {
		if errs[i] != nil {
			t.Fatalf("sweeper %d: %v\n%s", i, errs[i], outs[i])
		}
	}
	ev := mustOK(t, nexus(t, root, "events", "--type", "sandbox.removed", "--json"), "events").stdout
	for _, id := range ids {
		if n := strings.Count(ev, id); n != 1 {
			t.Errorf("%s: %d sandbox.removed events, want 1", id, n)
		}
	}
	swept := mustOK(t, nexus(t, root, "events", "--type", "run.swept", "--json"), "events").stdout
	if n := strings.Count(swept, `"run":"dead"`); n != 1 {
		t.Errorf("%d run.swept events for the run, want 1:\n%s", n, swept)
	}
	if left, _ := os.ReadDir(dir); len(left) != 0 {
		t.Fatalf("left %v", left)
	}
	if p := liveProcesses(t, root); len(p) != 0 {
		t.Fatalf("processes left: %v", p)
	}
}

// TestRunBindsAndKeeps: `nexus run` removes what its command created and
// returns the command's status; --keep binds nothing, even under an
// inherited NEXUS_RUN_ID.
func TestRunBindsAndKeeps(t *testing.T) {
	testutil.StartsSandboxes(t)
	t.Parallel()
	root := shortRoot(t)
	img := makeImage(t)
	script := fmt.Sprintf(`%s --driver process create --image %s >/dev/null && %s --driver process create --image %s --json | grep '"id"'; cat "$NEXUS_STATE_DIR/runs/$NEXUS_RUN_ID.sandboxes" | wc -l; exit 7`, nexusBin, img, nexusBin, img)
	r := proc(t, root, "run", "--", "sh", "-c", script)
	if r.code != 7 {
		t.Fatalf("run exit %d, want the command's 7 (stderr %s)", r.code, r.stderr)
	}
	if !strings.Contains(r.stdout, "\n2\n") {
		t.Fatalf("the command's ledger did not list its 2 sandboxes: %q", r.stdout)
	}
	if n := len(sandboxes(t, root)); n != 0 {
		t.Fatalf("%d sandboxes outlived their run", n)
	}
	if left, _ := os.ReadDir(filepath.Join(root, "runs")); len(left) != 0 {
		t.Fatalf("ledger left %v", left)
	}
	r = nexusEnv(t, root, []string{"NEXUS_RUN_ID=inherited"}, "--driver", "process", "run", "--keep", "--",
		"sh", "-c", fmt.Sprintf(`test -z "$NEXUS_RUN_ID" && %s --driver process create --image %s`, nexusBin, img))
	mustOK(t, r, "run --keep")
	list := sandboxes(t, root)
	if len(list) != 1 {
		t.Fatalf("--keep: %d sandboxes, want 1 kept", len(list))
	}
	if left, _ := os.ReadDir(filepath.Join(root, "runs")); len(left) != 0 {
		t.Fatalf("--keep wrote a ledger: %v", left)
	}
	mustOK(t, proc(t, root, "rm", "-f", "--with-snapshots", list[0].ID), "rm")
	wantFailure(t, proc(t, root, "run"), 2, "needs a command")
	wantFailure(t, proc(t, root, "ledger", "watchdog", "--run", "x"), 2, "owner's pipe")
	wantFailure(t, proc(t, root, "run", "--", "/no/such/program"), 1, "no such file")
}

// TestReaperModes: NEXUS_REAPER=off neither sweeps nor watches, sweep only
// sweeps, anything else does both.
func TestReaperModes(t *testing.T) {
	testutil.StartsSandboxes(t)
	t.Parallel()
	for _, c := range []struct {
		mode           string
		sweeps, watchs bool
	}{{"off", false, false}, {"sweep", true, false}, {"on", true, true}, {"bogus", true, true}, {"", true, true}} {
		t.Run("mode="+c.mode, func(t *testing.T) {
			t.Parallel()
			root := shortRoot(t)
			dir := filepath.Join(root, "runs")
			os.MkdirAll(dir, 0o700)
			writeHand(t, dir, "dead.json", handRecord("dead", goneProcessPid(t), 1_700_000_000_000, "process"))
			writeHand(t, dir, "dead.sandboxes", "gone-already\n")
			// The watchdog's log exists while the run does (its clean end
			// removes it with the run's files), so the command looks.
			r := nexusEnv(t, root, []string{"NEXUS_REAPER=" + c.mode}, "--driver", "process", "run", "--", "sh", "-c",
				`echo "$NEXUS_RUN_ID"; test -e "`+root+`/logs/run-$NEXUS_RUN_ID.watchdog.log" && echo watched; true`)
			mustOK(t, r, "run")
			out := strings.Fields(r.stdout)
			run := out[0]
			_, err := os.Stat(filepath.Join(dir, "dead.json"))
			if swept := os.IsNotExist(err); swept != c.sweeps {
				t.Errorf("swept=%v, want %v", swept, c.sweeps)
			}
			if watched := slices.Contains(out, "watched"); watched != c.watchs {
				t.Errorf("watchdog spawned=%v, want %v (run %s)", watched, c.watchs, run)
			}
			if _, err := os.Stat(filepath.Join(root, "logs", "run-"+run+".watchdog.log")); err == nil {
				t.Errorf("run %s ended cleanly but left its watchdog log", run)
			}
		})
	}
}

// TestRunKilledWatchdogReaps: SIGKILL `nexus run` itself while its command
// (still alive afterwards) holds sandboxes: the watchdog removes them.
func TestRunKilledWatchdogReaps(t *testing.T) {
	testutil.StartsSandboxes(t)
	t.Parallel()
	root := shortRoot(t)
	img := makeImage(t)
	ready := filepath.Join(t.TempDir(), "ready")
	cmd := exec.Command(nexusBin, "--state-dir", root, "--driver", "process", "run", "--", "sh", "-c",
		fmt.Sprintf(`%s --driver process create --image %s >/dev/null && echo $$ > %s && exec sleep 600`, nexusBin, img, ready))
	cmd.Env = append(os.Environ(), "NEXUS_STATE_DIR=")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(testutil.Scale(30 * time.Second))
	var childPid int
	for time.Now().Before(deadline) {
		if data, err := os.ReadFile(ready); err == nil && len(data) > 0 && data[len(data)-1] == '\n' {
			childPid, _ = strconv.Atoi(strings.TrimSpace(string(data)))
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if childPid == 0 {
		cmd.Process.Kill()
		t.Fatal("command never became ready")
	}
	t.Cleanup(func() { syscall.Kill(childPid, syscall.SIGKILL) })
	cmd.Process.Signal(syscall.SIGKILL)
	cmd.Wait()
	deadline = time.Now().Add(testutil.Scale(5 * time.Second))
	for len(sandboxes(t, root)) != 0 {
		if time.Now().After(deadline) {
			t.Fatal("the watchdog did not reap within 5 s")
		}
		time.Sleep(50 * time.Millisecond)
	}
	if syscall.Kill(childPid, 0) != nil {
		t.Fatal("the command died too; nothing shown about the pipe")
	}
}
