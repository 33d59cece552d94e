package ledger

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/oklog/ulid/v2"

	"github.com/nexus-sandbox/nexus/events"
	"github.com/nexus-sandbox/nexus/layout"
	format "github.com/nexus-sandbox/nexus/ledger"
)

// recorder backs Actions with counters; what it stands in for (lifecycle
// rm, the journal) is exercised by the cmd/nexus and client tests.
type recorder struct {
	mu      sync.Mutex
	live    map[string]bool
	removed map[string]int
	swept   []events.RunSweptEvent
	kept    []events.RunKeptEvent
	during  func(name string)
}

func newRecorder(live ...string) *recorder {
	r := &recorder{live: map[string]bool{}, removed: map[string]int{}}
	for _, n := range live {
		r.live[n] = true
	}
	return r
}

func (r *recorder) RemoveSandbox(_ context.Context, name string) (bool, error) {
	if r.during != nil {
		r.during(name)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.live[name] {
		return false, nil
	}
	delete(r.live, name)
	r.removed[name]++
	return true, nil
}

func (r *recorder) RemoveNetwork(context.Context, string) (bool, error) { return false, nil }

func (r *recorder) RecordKept(_ context.Context, ev events.RunKeptEvent) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.kept = append(r.kept, ev)
	return nil
}

func (r *recorder) Record(_ context.Context, ev events.RunSweptEvent) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.swept = append(r.swept, ev)
	return nil
}

// deadPid is the pid of a process that has exited and been reaped.
func deadPid(t *testing.T) int {
	t.Helper()
	c := exec.Command("true")
	if err := c.Run(); err != nil {
		t.Fatal(err)
	}
	return c.Process.Pid
}

func openRun(t *testing.T, dir, run, driver string, pid int, startMs int64, names ...string) *Run {
	t.Helper()
	r, err := Open(dir, format.Record{Schema: 1, Run: run, Pid: pid, StartTimeMs: startMs, Driver: driver})
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range names {
		if err := r.Add(Sandboxes, n); err != nil {
			t.Fatal(err)
		}
	}
	return r
}

// openSelf opens run in dir as this process's own (its liveness lock held).
func openSelf(t *testing.T, dir, run string) *Run {
	t.Helper()
	rec, err := SelfRecord(run, "process", "")
	if err != nil {
		t.Fatal(err)
	}
	r, err := Open(dir, rec)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func TestAddDropCloseKeepSuperset(t *testing.T) {
	dir := t.TempDir()
	r := openSelf(t, dir, "RUNA")
	for _, n := range []string{"a", "b", "c"} {
		if err := r.Add(Sandboxes, n); err != nil {
			t.Fatal(err)
		}
	}
	if err := r.Close(); err == nil {
		t.Fatal("close with names listed must refuse")
	}
	r.Drop(Sandboxes, "b")
	if got, _ := r.Names(Sandboxes); len(got) != 2 || got[0] != "a" || got[1] != "c" {
		t.Fatalf("names %v", got)
	}
	// A torn append (no newline) must not merge with the next name.
	f, _ := os.OpenFile(listPath(dir, "RUNA", Sandboxes), os.O_WRONLY|os.O_APPEND, 0)
	f.WriteString("torn")
	f.Close()
	r.Add(Sandboxes, "d")
	if got, _ := r.Names(Sandboxes); len(got) != 4 || got[2] != "torn" || got[3] != "d" {
		t.Fatalf("after torn append: %v", got)
	}
	for _, n := range []string{"a", "c", "torn", "d"} {
		r.Drop(Sandboxes, n)
	}
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	if left, _ := os.ReadDir(dir); len(left) != 0 {
		t.Fatalf("clean close left %v", left)
	}
}

func TestPlanDecidesOnRealProcesses(t *testing.T) {
	dir := t.TempDir()
	me, err := SelfRecord("SELF", "process", "")
	if err != nil {
		t.Fatal(err)
	}
	openRun(t, dir, "SELF", "process", me.Pid, me.StartTimeMs, "mine")
	openRun(t, dir, "LIVE", "process", me.Pid, me.StartTimeMs+1500, "x")
	openRun(t, dir, "REUSED", "process", me.Pid, me.StartTimeMs-10_000, "y")
	openRun(t, dir, "DEAD", "process", deadPid(t), me.StartTimeMs, "z")
	openRun(t, dir, "OTHER", "cloud-hypervisor", deadPid(t), me.StartTimeMs, "w")
	os.WriteFile(filepath.Join(dir, "YOUNG.json"), []byte(`{"schema":1,"run":`), 0o600)
	os.WriteFile(filepath.Join(dir, "OLD.json"), []byte(`garbage`), 0o600)
	os.WriteFile(filepath.Join(dir, "OLD.sandboxes"), []byte("v\n"), 0o600)
	old := time.Now().Add(-2 * time.Hour)
	os.Chtimes(filepath.Join(dir, "OLD.json"), old, old)
	os.Chtimes(filepath.Join(dir, "OLD.sandboxes"), old, old)
	os.WriteFile(filepath.Join(dir, ".DEAD.json.tmp-1"), nil, 0o600) // not a run

	plan, err := Plan(dir, format.Self{Run: "SELF", Driver: "process"}, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{
		"SELF": format.ReasonSelf, "LIVE": format.ReasonOwnerAlive, "REUSED": format.ReasonPidReused,
		"DEAD": format.ReasonOwnerGone, "OTHER": format.ReasonOtherDriver,
		"YOUNG": format.ReasonUnparseableYoung, "OLD": format.ReasonUnparseableOld,
	}
	if len(plan) != len(want) {
		t.Fatalf("plan has %d runs, want %d: %+v", len(plan), len(want), plan)
	}
	for _, p := range plan {
		if want[p.Run] != p.Reason {
			t.Errorf("%s: %s (%s), want %s", p.Run, p.Verdict, p.Reason, want[p.Run])
		}
	}
	act := newRecorder("mine", "x", "y", "z", "w", "v")
	out, err := Apply(context.Background(), dir, plan, format.Self{Run: "SELF", Driver: "process"}, "init", act)
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range []string{"y", "z", "v"} {
		if act.removed[n] != 1 {
			t.Errorf("%s removed %d times, want 1 (%+v)", n, act.removed[n], out)
		}
	}
	for _, n := range []string{"mine", "x", "w"} {
		if !act.live[n] {
			t.Errorf("%s of a kept run was removed", n)
		}
	}
	if len(act.swept) != 3 {
		t.Fatalf("journaled %d sweeps, want 3", len(act.swept))
	}
	// Every keep but our own run's is journaled, in one event.
	if len(act.kept) != 1 {
		t.Fatalf("journaled %d run.kept events, want 1: %+v", len(act.kept), act.kept)
	}
	keptBy := map[string]string{}
	for _, g := range act.kept[0].Kept {
		for _, run := range g.Runs {
			keptBy[run] = g.Reason
		}
	}
	if len(keptBy) != 3 || keptBy["LIVE"] != format.ReasonOwnerAlive || keptBy["OTHER"] != format.ReasonOtherDriver || keptBy["YOUNG"] != format.ReasonUnparseableYoung {
		t.Fatalf("journaled keeps %v", keptBy)
	}
	for _, run := range []string{"REUSED", "DEAD", "OLD"} {
		for _, suf := range []string{".json", ".sandboxes", ".networks"} {
			if _, err := os.Lstat(filepath.Join(dir, run+suf)); !os.IsNotExist(err) {
				t.Errorf("%s%s survived its sweep", run, suf)
			}
		}
	}
}

// TestRacingSweepsRemoveEachOnce: two sweepers over the same dead runs, the
// first held inside a removal until the second has planned and tried.
func TestRacingSweepsRemoveEachOnce(t *testing.T) {
	dir := t.TempDir()
	var names []string
	for _, run := range []string{"R1", "R2", "R3"} {
		var list []string
		for _, s := range []string{"a", "b", "c"} {
			list = append(list, run+"-"+s)
		}
		openRun(t, dir, run, "process", deadPid(t), 1_700_000_000_000, list...)
		names = append(names, list...)
	}
	act := newRecorder(names...)
	self := format.Self{Run: "ME", Driver: "process"}
	var wg sync.WaitGroup
	outs := make([][]format.Outcome, 4)
	errs := make([]error, 4)
	for i := range outs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			plan, err := Plan(dir, self, time.Now())
			if err == nil {
				outs[i], err = Apply(context.Background(), dir, plan, self, "init", act)
			}
			errs[i] = err
		}()
	}
	wg.Wait()
	for i := range outs {
		if errs[i] != nil {
			t.Fatalf("sweeper %d: %v", i, errs[i])
		}
		for _, o := range outs[i] {
			if o.Error != "" {
				t.Fatalf("sweeper %d: %+v", i, o)
			}
		}
	}
	for _, n := range names {
		if act.removed[n] != 1 {
			t.Errorf("%s removed %d times", n, act.removed[n])
		}
	}
	if len(act.swept) != 3 {
		t.Errorf("journaled %d sweeps for 3 runs", len(act.swept))
	}
	if left, _ := os.ReadDir(dir); len(left) != 0 {
		t.Fatalf("left %v", left)
	}
}

// TestLockedRunIsSkipped: a run whose lock another sweeper holds is left to
// it, without error and without removals.
func TestLockedRunIsSkipped(t *testing.T) {
	dir := t.TempDir()
	openRun(t, dir, "R1", "process", deadPid(t), 1_700_000_000_000, "a")
	lk, err := lockRecord(recordPath(dir, "R1"), true)
	if err != nil {
		t.Fatal(err)
	}
	self := format.Self{Driver: "process"}
	plan, _ := Plan(dir, self, time.Now())
	act := newRecorder("a")
	out, err := Apply(context.Background(), dir, plan, self, "init", act)
	if err != nil || len(out) != 1 || out[0].Skipped == "" || act.removed["a"] != 0 {
		t.Fatalf("out %+v err %v removed %v", out, err, act.removed)
	}
	lk.Close()
	out, _ = Apply(context.Background(), dir, plan, self, "init", act)
	if out[0].Skipped != "" || act.removed["a"] != 1 {
		t.Fatalf("after unlock: %+v", out)
	}
}

// TestPlanManyRunsKeepsOrderAndVerdicts exercises the parallel plan: 300
// runs, every third dead, each verdict where its run is.
func TestPlanManyRunsKeepsOrderAndVerdicts(t *testing.T) {
	dir := t.TempDir()
	me, err := SelfRecord("x", "process", "")
	if err != nil {
		t.Fatal(err)
	}
	dead := deadPid(t)
	for i := range 300 {
		pid := me.Pid
		if i%3 == 0 {
			pid = dead
		}
		openRun(t, dir, fmt.Sprintf("run-%03d", i), "process", pid, me.StartTimeMs)
	}
	plan, err := Plan(dir, format.Self{Driver: "process"}, time.Now())
	if err != nil || len(plan) != 300 {
		t.Fatalf("plan: %d runs, %v", len(plan), err)
	}
	for i, p := range plan {
		want := format.Keep
		if i%3 == 0 {
			want = format.Sweep
		}
		if p.Run != fmt.Sprintf("run-%03d", i) || p.Verdict != want {
			t.Fatalf("plan[%d] = %s %s, want run-%03d %s", i, p.Run, p.Verdict, i, want)
		}
	}
}

// TestKeptEventsGroupAndSplit: keeps are grouped by reason, the sweeper's
// own run is left out, and a large sweep is split into numbered parts that
// together name every kept run exactly once.
func TestKeptEventsGroupAndSplit(t *testing.T) {
	self := format.Self{Run: "ME", Driver: "process"}
	if evs := KeptEvents("init", self, time.Now(), []format.Outcome{{Run: "ME", Verdict: "keep", Reason: format.ReasonSelf}}); evs != nil {
		t.Fatalf("only our own run: %+v", evs)
	}
	var out []format.Outcome
	for i := range 2*keptPerEvent + 10 {
		reason := format.ReasonOwnerLocked
		if i%3 == 0 {
			reason = format.ReasonOtherDriver
		}
		out = append(out, format.Outcome{Run: fmt.Sprintf("r%05d", i), Verdict: "keep", Reason: reason})
	}
	out = append(out, format.Outcome{Run: "gone", Verdict: "sweep", Reason: format.ReasonOwnerGone}, format.Outcome{Run: "ME", Verdict: "keep", Reason: format.ReasonSelf})
	evs := KeptEvents("init", self, time.UnixMilli(42), out)
	if len(evs) != 3 {
		t.Fatalf("%d events, want 3", len(evs))
	}
	seen := map[string]string{}
	for i, ev := range evs {
		if ev.Part != i+1 || ev.Parts != 3 || ev.By != "init" || ev.Sweeper != "ME" || ev.Driver != "process" || ev.AtMs != 42 {
			t.Fatalf("event %d header %+v", i, ev)
		}
		n := 0
		for _, g := range ev.Kept {
			for _, run := range g.Runs {
				if _, dup := seen[run]; dup {
					t.Fatalf("%s named twice", run)
				}
				seen[run] = g.Reason
				n++
			}
		}
		if n > keptPerEvent {
			t.Fatalf("event %d names %d runs", i, n)
		}
	}
	if len(seen) != 2*keptPerEvent+10 {
		t.Fatalf("%d runs journaled", len(seen))
	}
	for _, o := range out[:2*keptPerEvent+10] {
		if seen[o.Run] != o.Reason {
			t.Fatalf("%s: %q, want %q", o.Run, seen[o.Run], o.Reason)
		}
	}
	// Round trip through the journal's codec: the event stays in bounds.
	data, err := events.Encode(events.New(ulid.Make(), time.Now(), "", evs[0]))
	if err != nil {
		t.Fatal(err)
	}
	back, err := events.Decode(data)
	if err != nil {
		t.Fatal(err)
	}
	if got := back.Payload.(events.RunKeptEvent); len(got.Kept) != len(evs[0].Kept) || len(data) > 128<<10 {
		t.Fatalf("decoded %d groups from %d bytes", len(got.Kept), len(data))
	}
}

// TestRunsTakeTheirWatchdogLogs: a run's watchdog log (logs/ beside runs/)
// goes with the run, whether a sweep removes the run or its owner closes
// it; a live run's log and another run's stay.
func TestRunsTakeTheirWatchdogLogs(t *testing.T) {
	root := t.TempDir()
	dir := Dir(root)
	log := func(run string) string { return layout.Root(root).WatchdogLog(run) }
	os.MkdirAll(filepath.Join(root, "logs"), 0o700)
	for _, run := range []string{"DEAD", "MINE", "LIVE", "NORUN"} {
		if err := os.WriteFile(log(run), []byte("nexus watchdog: ...\n"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	openRun(t, dir, "DEAD", "process", deadPid(t), 1_700_000_000_000, "a")
	openSelf(t, dir, "LIVE")
	if err := openSelf(t, dir, "MINE").Close(); err != nil {
		t.Fatal(err)
	}
	self := format.Self{Run: "LIVE", Driver: "process"}
	plan, err := Plan(dir, self, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	out, err := Apply(context.Background(), dir, plan, self, "init", newRecorder("a"))
	if err != nil {
		t.Fatal(err)
	}
	if len(out) != 2 || out[0].Run != "DEAD" || out[0].Verdict != string(format.Sweep) || out[0].Error != "" {
		t.Fatalf("outcomes %+v: want DEAD swept", out)
	}
	for run, kept := range map[string]bool{"DEAD": false, "MINE": false, "LIVE": true, "NORUN": true} {
		_, err := os.Stat(log(run))
		if got := err == nil; got != kept {
			t.Errorf("%s's watchdog log kept=%v, want %v (%v)", run, got, kept, err)
		}
	}
}
