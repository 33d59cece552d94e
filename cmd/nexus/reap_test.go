package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/oklog/ulid/v2"

	"github.com/nexus-sandbox/nexus/internal/testutil"
)

type reapR struct {
	Kind      string `json:"kind"`
	Path      string `json:"path"`
	Owner     string `json:"owner"`
	Verdict   string `json:"verdict"`
	Reason    string `json:"reason"`
	Allocated int64  `json:"allocated_bytes"`
	Error     string `json:"error"`
}

type reapJSON struct {
	Apply     bool    `json:"apply"`
	Plan      string  `json:"plan"`
	Scanned   int     `json:"scanned"`
	Orphans   []reapR `json:"orphans"`
	Kept      []reapR `json:"kept"`
	Deleted   []reapR `json:"deleted"`
	Failed    []reapR `json:"failed"`
	Allocated int64   `json:"allocated_bytes"`
	Journal   string  `json:"journal"`
}

// reapOnce runs `nexus reap --json` once and decodes its report.
func reapOnce(t *testing.T, root string, args ...string) (reapJSON, result) {
	t.Helper()
	r := nexus(t, root, append([]string{"reap", "--json"}, args...)...)
	var rep reapJSON
	if err := json.Unmarshal([]byte(r.stdout), &rep); err != nil {
		t.Fatalf("reap --json %v: exit %d, %v\nstdout %s\nstderr %s", args, r.code, err, r.stdout, r.stderr)
	}
	return rep, r
}

// reapRun runs reap until no entry is kept only because its /proc scan
// was inconclusive (testutil.ReapUntilConclusive), and returns that run;
// an apply's Deleted and Allocated carry what earlier runs deleted.
func reapRun(t *testing.T, root string, args ...string) (reapJSON, result) {
	t.Helper()
	var deleted []reapR
	var freed int64
	var rep reapJSON
	var r result
	testutil.ReapUntilConclusive(t, fmt.Sprintf("reap %v", args), func() (bool, string) {
		rep, r = reapOnce(t, root, args...)
		deleted = append(deleted, rep.Deleted...)
		if rep.Apply {
			freed += rep.Allocated
		}
		for _, k := range rep.Kept {
			if testutil.KeptInconclusive(k.Verdict, k.Reason) {
				return true, fmt.Sprintf("%+v", rep.Kept)
			}
		}
		return false, ""
	})
	rep.Deleted = deleted
	if rep.Apply {
		rep.Allocated = freed
	}
	return rep, r
}

func paths(list []reapR) []string {
	out := []string{}
	for _, r := range list {
		out = append(out, r.Path)
	}
	sort.Strings(out)
	return out
}

func has(list []reapR, path string) *reapR {
	for i := range list {
		if list[i].Path == path {
			return &list[i]
		}
	}
	return nil
}

func exists(path string) bool {
	_, err := os.Lstat(path)
	return err == nil
}

// staleSocket leaves a socket file whose listener is gone.
func staleSocket(t *testing.T, path string) {
	t.Helper()
	l, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	l.(*net.UnixListener).SetUnlinkOnClose(false)
	l.Close()
}

func write(t *testing.T, path string, size int) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, make([]byte, size), 0o600); err != nil {
		t.Fatal(err)
	}
}

// orphansOf plants every reapable kind for a sandbox the journal never
// knew (as a crash that lost everything but the files would leave), and
// returns the planted paths.
func orphansOf(t *testing.T, root string) (string, []string) {
	t.Helper()
	id := ulid.Make().String()
	files := []string{
		"disks/" + id + ".raw", "disks/" + id + "-workspace.ext4", "disks/" + id + ".create-intent.json",
		"disks/gone_h.shadow.cfg.ext4", "disks/gone_h.shadow-intent.json", "disks/ancient.shadow.ext4",
		"disks/" + id + "-gone_h.shadow.cfg.ext4",
		"supervisors/" + id + "/mitm-ca.pem", "builder-supervisors/" + id + "/work", "snapshots/" + id + "/S1/manifest.json",
		"sandboxes/" + id + "/record.json",
	}
	for _, f := range files {
		write(t, filepath.Join(root, f), 8192)
	}
	os.MkdirAll(filepath.Join(root, "run"), 0o700)
	for _, ext := range []string{".sock", ".vsock", ".iid"} {
		staleSocket(t, filepath.Join(root, "run", "sb-"+id+ext))
	}
	want := []string{}
	for _, f := range []string{"disks/" + id + ".raw", "disks/" + id + "-workspace.ext4", "disks/" + id + ".create-intent.json",
		"disks/gone_h.shadow.cfg.ext4", "disks/gone_h.shadow-intent.json", "disks/ancient.shadow.ext4", "disks/" + id + "-gone_h.shadow.cfg.ext4",
		"supervisors/" + id, "builder-supervisors/" + id, "snapshots/" + id, "sandboxes/" + id,
		"run/sb-" + id + ".sock", "run/sb-" + id + ".vsock", "run/sb-" + id + ".iid"} {
		want = append(want, filepath.Join(root, f))
	}
	sort.Strings(want)
	return id, want
}

// Dry run by default, --apply deletes and verifies, every decision
// is in the journal, and a second pass has nothing left to do.
func TestReapDryRunThenApply(t *testing.T) {
	testutil.StartsSandboxes(t)
	t.Parallel()
	root := shortRoot(t)
	image := makeImage(t)
	shadowSrc := t.TempDir()
	os.WriteFile(filepath.Join(shadowSrc, "cfg"), []byte("x"), 0o644)
	sb := createJSON(t, root, "--image", image, "--handle", "dev/one", "--shadow", "cfg="+shadowSrc)
	_, planted := orphansOf(t, root)

	human := mustOK(t, nexus(t, root, "reap"), "reap")
	if !strings.Contains(human.stdout, "dry run") || !strings.Contains(human.stdout, "orphan") || !strings.Contains(human.stdout, "--apply --plan") {
		t.Fatalf("human report: %s", human.stdout)
	}
	for _, p := range planted {
		if !exists(p) {
			t.Fatalf("dry run deleted %s", p)
		}
	}

	_, r := reapRun(t, root)
	if r.code != 0 {
		t.Fatalf("reap --json: %+v", r)
	}
	var raw map[string]json.RawMessage
	json.Unmarshal([]byte(r.stdout), &raw)
	for _, k := range []string{"apply", "scanned", "orphans", "kept", "deleted", "failed"} {
		if _, ok := raw[k]; !ok {
			t.Fatalf("reap --json lacks %q: %s", k, r.stdout)
		}
	}
	var rep reapJSON
	json.Unmarshal([]byte(r.stdout), &rep)
	if got := paths(rep.Orphans); rep.Apply || strings.Join(got, "\n") != strings.Join(planted, "\n") {
		t.Fatalf("orphans:\n%s\nwant:\n%s", strings.Join(paths(rep.Orphans), "\n"), strings.Join(planted, "\n"))
	}
	var total int64
	for _, o := range rep.Orphans {
		if o.Verdict != "orphan" || o.Reason == "" || !filepath.IsAbs(o.Path) {
			t.Fatalf("orphan entry %+v", o)
		}
		total += o.Allocated
	}
	if total != rep.Allocated || total < 8*8192 {
		t.Fatalf("allocated total %d, sum %d", rep.Allocated, total)
	}
	for _, k := range rep.Kept {
		if k.Verdict != "owned" || k.Owner != sb.ID {
			t.Fatalf("kept %+v, want owned by %s", k, sb.ID)
		}
	}
	if len(rep.Kept) < 8 {
		t.Fatalf("only %d owned resources kept", len(rep.Kept))
	}

	app, ar := reapRun(t, root, "--apply")
	if ar.code != 0 || !app.Apply || len(app.Failed) != 0 || strings.Join(paths(app.Deleted), "\n") != strings.Join(planted, "\n") {
		t.Fatalf("apply: exit %d deleted %v failed %+v", ar.code, paths(app.Deleted), app.Failed)
	}
	for _, p := range planted {
		if exists(p) {
			t.Fatalf("%s survived --apply", p)
		}
	}
	// --apply reports what it freed, once: the sum over what it deleted,
	// not the dry run's total plus the deletions again.
	var freed int64
	for _, d := range app.Deleted {
		freed += d.Allocated
	}
	if app.Allocated != freed || freed != total {
		t.Fatalf("--apply reports %d bytes; deleted entries sum to %d, the dry run planned %d", app.Allocated, freed, total)
	}
	for _, k := range app.Kept {
		if !exists(k.Path) {
			t.Fatalf("owned %s was deleted", k.Path)
		}
	}
	assertClean(t, root)
	evs := mustOK(t, nexus(t, root, "events", "--type", "reap"), "events --type reap").stdout
	if !strings.Contains(evs, "reap.decided") || !strings.Contains(evs, "reap.applied") || !strings.Contains(evs, "disks/ancient.shadow.ext4") || !strings.Contains(evs, "legacy") {
		t.Fatalf("events --type reap does not say what was deleted and why:\n%s", evs)
	}
	again, _ := reapRun(t, root, "--apply")
	if len(again.Deleted) != 0 || len(again.Orphans) != 0 {
		t.Fatalf("second --apply still deleted %v", paths(again.Deleted))
	}
	mustOK(t, proc(t, root, "rm", "-f", "--with-snapshots", sb.ID), "rm")
}

func TestReapUsageErrors(t *testing.T) {
	t.Parallel()
	root := t.TempDir()
	wantFailure(t, nexus(t, root, "reap", "--kind", "teapot"), 2, "--kind")
	wantFailure(t, nexus(t, root, "reap", "--older-than", "soon"), 2, "--older-than")
	wantFailure(t, nexus(t, root, "reap", "--plan", ulid.Make().String()), 2, "--plan needs --apply")
	wantFailure(t, nexus(t, root, "reap", "--apply", "--plan", "nope"), 2, "not a plan id")
	wantFailure(t, nexus(t, root, "reap", "extra"), 2, "unknown command")
	wantFailure(t, nexus(t, root, "reap", "--apply", "--plan", ulid.Make().String()), 1, "no such reap plan")
}

// --apply never follows a link out of the state root.
func TestReapSymlinkOutsideRootSurvives(t *testing.T) {
	t.Parallel()
	root, outside := shortRoot(t), t.TempDir()
	victim := filepath.Join(outside, "precious")
	write(t, victim, 4096)
	id := ulid.Make().String()
	os.MkdirAll(filepath.Join(root, "disks"), 0o700)
	os.Symlink(victim, filepath.Join(root, "disks", id+".raw"))
	write(t, filepath.Join(root, "supervisors", id, "mitm-ca.pem"), 100)
	os.Symlink(victim, filepath.Join(root, "supervisors", id, "link"))
	os.Symlink(outside, filepath.Join(root, "snapshots"))
	os.Symlink(outside, filepath.Join(root, "builder-supervisors", id))

	rep, r := reapRun(t, root, "--apply")
	if r.code != 0 {
		t.Fatalf("apply: %+v", r)
	}
	if data, err := os.ReadFile(victim); err != nil || len(data) != 4096 {
		t.Fatalf("file outside the root was touched: %v", err)
	}
	if exists(filepath.Join(root, "supervisors", id)) || has(rep.Deleted, filepath.Join(root, "supervisors", id)) == nil {
		t.Fatal("orphan state dir holding a link was not deleted")
	}
	if k := has(rep.Kept, filepath.Join(root, "disks", id+".raw")); k == nil || k.Verdict != "ambiguous" || !strings.Contains(k.Reason, "symbolic link") {
		t.Fatalf("link in place of a disk: %+v", k)
	}
	if !exists(filepath.Join(root, "disks", id+".raw")) || !exists(filepath.Join(outside)) {
		t.Fatal("link or its target removed")
	}
}

// Volumes are never scanned (they are user-owned), and the shared build
// cache is never reaped, even with resource-shaped names inside them.
func TestReapNeverTouchesVolumesOrBuildCache(t *testing.T) {
	t.Parallel()
	root := shortRoot(t)
	mustOK(t, proc(t, root, "volume", "create", "data", "--size", "16M"), "volume create")
	id := ulid.Make().String()
	keep := []string{
		filepath.Join(root, "volumes", "data", "disk.ext4"),
		filepath.Join(root, "volumes", id, id+".raw"),
		filepath.Join(root, "caches", "buildkit.ext4"),
	}
	write(t, keep[1], 10)
	write(t, keep[2], 10)
	rep, r := reapRun(t, root, "--apply")
	if r.code != 0 {
		t.Fatalf("apply: %+v", r)
	}
	for _, p := range keep {
		if !exists(p) {
			t.Fatalf("%s was deleted", p)
		}
	}
	for _, list := range [][]reapR{rep.Orphans, rep.Kept, rep.Deleted, rep.Failed} {
		for _, e := range list {
			if strings.Contains(e.Path, "/volumes/") || strings.Contains(e.Path, "/caches/") {
				t.Fatalf("reap looked at %s", e.Path)
			}
		}
	}
}

func TestReapFilters(t *testing.T) {
	testutil.StartsSandboxes(t)
	t.Parallel()
	root := shortRoot(t)
	// A daemon that starts after the planting would finish the planted
	// create intent itself (as it starts, it retires intents of creates
	// that never started); the filters are what is under test here.
	testutil.StartDaemon(t, nexusBin, root)
	a, plantedA := orphansOf(t, root)
	b := ulid.Make().String()
	old := filepath.Join(root, "disks", b+".raw")
	write(t, old, 4096)
	past := time.Now().Add(-48 * time.Hour)
	os.Chtimes(old, past, past)

	rep, _ := reapRun(t, root, "--kind", "raw-disk")
	if got := paths(rep.Orphans); len(got) != 2 || has(rep.Orphans, old) == nil || has(rep.Orphans, filepath.Join(root, "disks", a+".raw")) == nil {
		t.Fatalf("--kind raw-disk: %v", got)
	}
	rep, _ = reapRun(t, root, "--sandbox", strings.ToLower(b))
	if got := paths(rep.Orphans); len(got) != 1 || got[0] != old {
		t.Fatalf("--sandbox %s: %v", b, got)
	}
	rep, _ = reapRun(t, root, "--sandbox", "gone/h")
	if got := paths(rep.Orphans); len(got) != 2 || has(rep.Orphans, filepath.Join(root, "disks", "gone_h.shadow.cfg.ext4")) == nil {
		t.Fatalf("--sandbox gone/h: %v", got)
	}
	rep, _ = reapRun(t, root, "--older-than", "24h")
	if got := paths(rep.Orphans); len(got) != 1 || got[0] != old {
		t.Fatalf("--older-than 24h: %v", got)
	}
	rep, _ = reapRun(t, root, "--apply", "--sandbox", a, "--kind", "supervisor-state")
	if got := paths(rep.Deleted); len(got) != 1 || got[0] != filepath.Join(root, "supervisors", a) {
		t.Fatalf("filtered apply deleted %v", got)
	}
	for _, p := range append(plantedA, old) {
		if p != filepath.Join(root, "supervisors", a) && !exists(p) {
			t.Fatalf("filtered apply deleted %s", p)
		}
	}
}

// TestReapWatchdogLogs: a client run's watchdog log whose run has left
// the ledger (no runs/<run>.json) is an orphan and --apply deletes it; the
// log of a run still in the ledger is kept for the run's own sweep.
func TestReapWatchdogLogs(t *testing.T) {
	t.Parallel()
	root := shortRoot(t)
	gone, live := filepath.Join(root, "logs", "run-gone.watchdog.log"), filepath.Join(root, "logs", "run-live.watchdog.log")
	write(t, gone, 100)
	write(t, live, 100)
	os.MkdirAll(filepath.Join(root, "runs"), 0o700)
	writeHand(t, filepath.Join(root, "runs"), "live.json", handRecord("live", os.Getpid(), 1_700_000_000_000, "process"))

	rep, _ := reapRun(t, root)
	if o := has(rep.Orphans, gone); o == nil || o.Kind != "watchdog-log" || !strings.Contains(o.Reason, "no record in runs/") {
		t.Fatalf("orphans %+v: want %s, a watchdog-log without its run", rep.Orphans, gone)
	}
	if k := has(rep.Kept, live); k == nil || k.Verdict != "live" || !strings.Contains(k.Reason, "in the ledger") {
		t.Fatalf("kept %+v: want %s, live with its run", rep.Kept, live)
	}
	rep, _ = reapRun(t, root, "--apply", "--kind", "watchdog-log")
	if got := paths(rep.Deleted); len(got) != 1 || got[0] != gone {
		t.Fatalf("apply deleted %v, want only %s", got, gone)
	}
	if exists(gone) || !exists(live) {
		t.Fatalf("after apply: %s exists %v (want gone), %s exists %v (want kept)", gone, exists(gone), live, exists(live))
	}
}

// A plan-bound apply deletes only what the dry run listed, and re-judges
// each entry: what changed since is kept and reported.
func TestReapPlanBoundApply(t *testing.T) {
	testutil.StartsSandboxes(t)
	t.Parallel()
	root := shortRoot(t)
	a := ulid.Make().String()
	b := ulid.Make().String()
	write(t, filepath.Join(root, "disks", a+".raw"), 100)
	write(t, filepath.Join(root, "disks", b+".raw"), 100)
	plan, _ := reapRun(t, root)
	if len(plan.Orphans) != 2 || plan.Plan == "" {
		t.Fatalf("dry run: %+v", plan)
	}
	// Since the plan: a process now names b (a sandbox came alive), and a
	// new orphan c appeared that the plan never listed.
	c := ulid.Make().String()
	write(t, filepath.Join(root, "disks", c+".raw"), 100)
	live := exec.Command("sh", "-c", "sleep 60; :", "--api-socket", filepath.Join(root, "run", "sb-"+b+".sock"))
	if err := live.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { live.Process.Kill(); live.Wait() }()

	rep, r := reapRun(t, root, "--apply", "--plan", plan.Plan)
	if r.code != 0 || rep.Plan != plan.Plan {
		t.Fatalf("plan apply: %+v", r)
	}
	if got := paths(rep.Deleted); len(got) != 1 || got[0] != filepath.Join(root, "disks", a+".raw") {
		t.Fatalf("plan apply deleted %v", got)
	}
	if k := has(rep.Kept, filepath.Join(root, "disks", b+".raw")); k == nil || !strings.Contains(k.Reason, "changed since plan") || k.Verdict != "live" {
		t.Fatalf("b changed since the plan: %+v", k)
	}
	if k := has(rep.Kept, filepath.Join(root, "disks", c+".raw")); k == nil || !strings.Contains(k.Reason, "not in plan") {
		t.Fatalf("c is not in the plan: %+v", k)
	}
	for _, id := range []string{b, c} {
		if !exists(filepath.Join(root, "disks", id+".raw")) {
			t.Fatalf("%s deleted", id)
		}
	}
}

// A journal that cannot be fully read keeps everything, and says why: what
// cannot be attributed might be in use.
func TestReapUnreadableJournalKeepsEverything(t *testing.T) {
	testutil.StartsSandboxes(t)
	t.Parallel()
	for _, spoil := range []string{"damaged", "newer schema"} {
		t.Run(spoil, func(t *testing.T) {
			t.Parallel()
			root := shortRoot(t)
			mustOK(t, nexus(t, root, "demo"), "demo")
			_, planted := orphansOf(t, root)
			stopDaemons(root) // the store is changed behind nexus's back
			os.RemoveAll(filepath.Join(root, "projections"))
			if spoil == "damaged" {
				blk := blockFile(t, root)
				info, _ := os.Stat(blk)
				os.Truncate(blk, info.Size()-7)
			} else {
				appendFutureEvent(t, filepath.Join(root, "journal"))
			}
			rep, r := reapRun(t, root)
			if r.code != 0 || rep.Journal == "" || len(rep.Orphans) != 0 || len(rep.Kept) != len(planted) {
				t.Fatalf("dry run over an unreadable journal: exit %d %+v", r.code, rep)
			}
			for _, k := range rep.Kept {
				if k.Verdict != "ambiguous" || !strings.Contains(k.Reason, "journal cannot be fully read") {
					t.Fatalf("kept %+v", k)
				}
			}
			rep, r = reapRun(t, root, "--apply")
			if r.code != 1 || len(rep.Deleted) != 0 || !strings.Contains(r.stderr, "nothing deleted") {
				t.Fatalf("apply over an unreadable journal: exit %d stderr %q", r.code, r.stderr)
			}
			for _, p := range planted {
				if !exists(p) {
					t.Fatalf("%s deleted", p)
				}
			}
		})
	}
}

// startDaemon runs `nexus daemon` on root until the test ends.
func startDaemon(t testing.TB, root string) *testutil.Proc {
	t.Helper()
	return testutil.StartDaemon(t, nexusBin, root)
}

// pausedCreate starts `nexus create` through the daemon and waits until it
// stops itself (SIGSTOP) at the given saga step, holding its intent leases.
func pausedCreate(t *testing.T, root, at string, args ...string) (*exec.Cmd, *strings.Builder) {
	t.Helper()
	cmd := exec.Command(nexusBin, append([]string{"--state-dir", root, "--driver", "process", "create", "--json"}, args...)...)
	cmd.Env = append(os.Environ(), "NEXUS_STATE_DIR=", "NEXUS_PAUSE_AT="+at)
	out := &strings.Builder{}
	cmd.Stdout = out
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	line, err := bufio.NewReader(stderr).ReadString('\n')
	if err != nil || !strings.Contains(line, "paused at "+at) {
		cmd.Process.Kill()
		t.Fatalf("creator said %q, %v", line, err)
	}
	waitStopped(t, cmd.Process.Pid)
	go func() {
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
		}
	}()
	return cmd, out
}

// A real concurrent creator: a create frozen after materialising a disk but
// before journaling it holds its leases; reap --apply (even the /proc gate
// sees no VMM yet) must keep it, and the create then completes.
func TestReapKeepsInFlightCreate(t *testing.T) {
	t.Parallel()
	image := makeImage(t)
	shadowSrc := t.TempDir()
	os.WriteFile(filepath.Join(shadowSrc, "cfg"), []byte("x"), 0o644)
	for _, at := range []string{"create.workspace-disk:before", "create.shadow.cfg:before", "create.commit:before"} {
		t.Run(at, func(t *testing.T) {
			t.Parallel()
			root := shortRoot(t)
			startDaemon(t, root)
			creator, out := pausedCreate(t, root, at, "--image", image, "--handle", "in/flight", "--shadow", "cfg="+shadowSrc)
			rep, r := reapRun(t, root, "--apply")
			if r.code != 0 || len(rep.Deleted) != 0 {
				t.Fatalf("reap during a create deleted %v (exit %d, %s)", paths(rep.Deleted), r.code, r.stderr)
			}
			var sawDisk bool
			for _, k := range rep.Kept {
				if strings.HasSuffix(k.Path, "-workspace.ext4") {
					sawDisk = true
					if k.Verdict != "live" && k.Verdict != "owned" {
						t.Fatalf("in-flight disk judged %+v", k)
					}
				}
			}
			if !sawDisk {
				t.Fatalf("the in-flight disk was not even seen: %+v", rep.Kept)
			}
			creator.Process.Signal(syscall.SIGCONT)
			if err := creator.Wait(); err != nil {
				t.Fatalf("create after reap: %v", err)
			}
			var sb struct {
				ID    string `json:"id"`
				State string `json:"state"`
			}
			json.Unmarshal([]byte(out.String()), &sb)
			if sb.State != "running" {
				t.Fatalf("create finished as %q: %s", sb.State, out.String())
			}
			after, _ := reapRun(t, root, "--apply")
			if len(after.Deleted) != 0 {
				t.Fatalf("reap after the create deleted %v", paths(after.Deleted))
			}
			assertClean(t, root)
			mustOK(t, proc(t, root, "rm", "-f", "--with-snapshots", sb.ID), "rm")
		})
	}
}

// The window between the reaper's two observations: it is frozen after
// probing the leases and before reading the journal, while a real creator
// commits and releases its lease; the reaper then sees the commit, so it
// deletes nothing.
func TestReapLeaseReleasedBetweenObservations(t *testing.T) {
	testutil.StartsSandboxes(t)
	t.Parallel()
	image := makeImage(t)
	root := shortRoot(t)
	startDaemon(t, root)
	creator, out := pausedCreate(t, root, "create.workspace-disk:before", "--image", image)
	reap := exec.Command(nexusBin, "--state-dir", root, "reap", "--apply", "--json")
	reap.Env = append(os.Environ(), "NEXUS_STATE_DIR=", "NEXUS_PAUSE_AT=reap.observe-leases")
	var reapOut strings.Builder
	reap.Stdout = &reapOut
	stderr, _ := reap.StderrPipe()
	if err := reap.Start(); err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(stderr)
	if line, err := br.ReadString('\n'); err != nil || !strings.Contains(line, "paused at reap.observe-leases") {
		t.Fatalf("reaper said %q, %v", line, err)
	}
	go func() {
		for {
			if _, err := br.ReadString('\n'); err != nil {
				return
			}
		}
	}()
	// The creator runs to the end: commit, lease released, intents retired.
	creator.Process.Signal(syscall.SIGCONT)
	if err := creator.Wait(); err != nil {
		t.Fatalf("create: %v", err)
	}
	var sb struct {
		ID string `json:"id"`
	}
	json.Unmarshal([]byte(out.String()), &sb)
	if _, err := os.Stat(filepath.Join(root, "disks", sb.ID+".create-intent.json")); !os.IsNotExist(err) {
		t.Fatal("create intent not retired: the window was not exercised")
	}
	waitStopped(t, reap.Process.Pid)
	reap.Process.Signal(syscall.SIGCONT)
	if err := reap.Wait(); err != nil {
		t.Fatalf("reap: %v", err)
	}
	var rep reapJSON
	if err := json.Unmarshal([]byte(reapOut.String()), &rep); err != nil {
		t.Fatal(err)
	}
	if len(rep.Deleted) != 0 {
		t.Fatalf("reap deleted %v of a create that committed between its observations", paths(rep.Deleted))
	}
	if k := has(rep.Kept, filepath.Join(root, "disks", sb.ID+"-workspace.ext4")); k == nil || k.Verdict != "owned" {
		t.Fatalf("the committed disk: %+v\nreport: %s\nls: %+v\nevents:\n%s", k, reapOut.String(), sandboxes(t, root), nexus(t, root, "events", "--all").stdout)
	}
	assertClean(t, root)
	mustOK(t, proc(t, root, "rm", "-f", "--with-snapshots", sb.ID), "rm")
}

// After any crash, one recover plus one reap --apply leaves no orphan, and
// a second reap --apply deletes nothing.
func TestReapIdempotentAfterCrash(t *testing.T) {
	testutil.StartsSandboxes(t)
	t.Parallel()
	image := makeImage(t)
	for _, point := range []string{"create.workspace-disk:before", "create.supervisor-state", "create.commit", "create.vmm:before", "rm.reclaim:before", "fork.commit:before", "fork.workspace-disk", "reap.delete:before", "reap.decide"} {
		t.Run(point, func(t *testing.T) {
			t.Parallel()
			root := shortRoot(t)
			if strings.HasPrefix(point, "create.") {
				crashAt(t, root, point, "create", "--image", image)
			} else {
				sb := createJSON(t, root, "--image", image)
				orphansOf(t, root)
				switch {
				case strings.HasPrefix(point, "rm."):
					crashAt(t, root, point, "rm", "-f", "--with-snapshots", sb.ID)
				case strings.HasPrefix(point, "fork."):
					crashAt(t, root, point, "fork", sb.ID)
				default:
					r := nexusEnv(t, root, []string{"NEXUS_CRASH_AT=" + point}, "reap", "--apply")
					if r.code != -1 {
						t.Fatalf("reap did not die at %s: %+v", point, r)
					}
				}
			}
			mustOK(t, proc(t, root, "recover"), "recover")
			first, r := reapRun(t, root, "--apply")
			if r.code != 0 {
				t.Fatalf("reap --apply after recover: %+v", r)
			}
			assertClean(t, root)
			for _, k := range first.Kept {
				if k.Verdict != "owned" {
					t.Fatalf("after recover, still kept %+v", k)
				}
			}
			second, _ := reapRun(t, root, "--apply")
			if len(second.Deleted) != 0 || len(second.Orphans) != 0 {
				t.Fatalf("second pass deleted %v", paths(second.Deleted))
			}
			for _, sb := range sandboxes(t, root) {
				mustOK(t, proc(t, root, "rm", "-f", "--with-snapshots", sb.ID), "rm")
			}
		})
	}
}

// Two state roots, two daemons, the /proc gate on: neither reaps the
// other's resources, and each reaps its own orphans.
func TestReapTwoStateRoots(t *testing.T) {
	testutil.StartsSandboxes(t)
	t.Parallel()
	image := makeImage(t)
	rootA, rootB := shortRoot(t), shortRoot(t)
	startDaemon(t, rootA)
	startDaemon(t, rootB)
	a := createJSON(t, rootA, "--image", image)
	b := createJSON(t, rootB, "--image", image)
	_, orphA := orphansOf(t, rootA)
	_, orphB := orphansOf(t, rootB)
	for _, root := range []string{rootA, rootB} {
		rep, r := reapRun(t, root, "--apply")
		if r.code != 0 {
			t.Fatalf("reap %s: %+v", root, r)
		}
		for _, d := range rep.Deleted {
			if !strings.HasPrefix(d.Path, root+"/") {
				t.Fatalf("reap of %s deleted %s", root, d.Path)
			}
		}
	}
	for _, p := range append(orphA, orphB...) {
		if exists(p) {
			t.Fatalf("orphan %s survived", p)
		}
	}
	assertClean(t, rootA)
	assertClean(t, rootB)
	mustOK(t, proc(t, rootA, "rm", "-f", "--with-snapshots", a.ID), "rm a")
	mustOK(t, proc(t, rootB, "rm", "-f", "--with-snapshots", b.ID), "rm b")
}

// waitStopped waits (wait4 WUNTRACED, no polling) until the child pid has
// stopped itself: its "paused" line is written just before its SIGSTOP.
func waitStopped(t *testing.T, pid int) {
	t.Helper()
	var ws syscall.WaitStatus
	for {
		_, err := syscall.Wait4(pid, &ws, syscall.WUNTRACED, nil)
		if err == syscall.EINTR {
			continue
		}
		if err != nil || !ws.Stopped() {
			t.Fatalf("pid %d did not stop: %v (status %v)", pid, err, ws)
		}
		return
	}
}

// TestReapConcurrentWithLifecycle runs `reap --apply` in a loop through the
// daemon while 50 creates, forks and rms run concurrently as real
// processes, with the real /proc and socket gates. A violation is any
// deletion of something that was not planted as an orphan (everything else
// on disk belongs to a sandbox that is owned or in flight), any lifecycle
// command failing, or anything left untracked at the end.
func TestReapConcurrentWithLifecycle(t *testing.T) {
	testutil.StartsSandboxes(t)
	t.Parallel()
	bin := nexusBin
	if raceEnabled {
		dir := t.TempDir()
		if err := testutil.BuildNexusIn(dir, "-race"); err != nil {
			t.Fatalf("build -race: %v", err)
		}
		bin = filepath.Join(dir, "nexus")
	}
	image := makeImage(t)
	root := shortRoot(t)
	d := testutil.StartDaemon(t, bin, root)
	withRoot := func(args ...string) []string {
		return append([]string{"--state-dir", root, "--driver", "process"}, args...)
	}

	planted := map[string]bool{}
	for i := 0; i < 5; i++ {
		_, list := orphansOf(t, root)
		for _, p := range list {
			planted[p] = true
		}
	}

	stop := make(chan struct{})
	type reapResult struct {
		passes, violations int
		problems           []string
		deleted            map[string]bool
	}
	reapDone := make(chan reapResult)
	go func() {
		res := reapResult{deleted: map[string]bool{}}
		for {
			select {
			case <-stop:
				reapDone <- res
				return
			default:
			}
			cmd := exec.Command(bin, "--state-dir", root, "reap", "--apply", "--json")
			cmd.Env = append(os.Environ(), "NEXUS_STATE_DIR=")
			var out, errb strings.Builder
			cmd.Stdout, cmd.Stderr = &out, &errb
			err := cmd.Run()
			res.passes++
			var rep reapJSON
			if jerr := json.Unmarshal([]byte(out.String()), &rep); jerr != nil || err != nil {
				res.violations++
				res.problems = append(res.problems, "reap pass failed: "+errb.String())
				continue
			}
			for _, del := range rep.Deleted {
				res.deleted[del.Path] = true
				if !planted[del.Path] {
					res.violations++
					res.problems = append(res.problems, "deleted "+del.Path+" ("+del.Reason+")")
				}
			}
			if len(rep.Failed) > 0 {
				res.violations++
				res.problems = append(res.problems, "failed: "+rep.Failed[0].Path+": "+rep.Failed[0].Error)
			}
		}
	}()

	const workers, perWorker = 5, 10 // 50 lifecycle operations
	type opResult struct{ problems []string }
	results := make(chan opResult, workers)
	for w := 0; w < workers; w++ {
		go func() {
			var res opResult
			ops := 0
			do := func(args ...string) string {
				ops++
				cmd := exec.Command(bin, withRoot(args...)...)
				cmd.Env = append(os.Environ(), "NEXUS_STATE_DIR=")
				var out, errb strings.Builder
				cmd.Stdout, cmd.Stderr = &out, &errb
				if err := cmd.Run(); err != nil {
					res.problems = append(res.problems, strings.Join(args, " ")+": "+errb.String())
				}
				return out.String()
			}
			for ops < perWorker {
				var parent struct {
					ID string `json:"id"`
				}
				json.Unmarshal([]byte(do("create", "--json", "--image", image)), &parent)
				if parent.ID == "" {
					continue
				}
				var children []struct {
					ID string `json:"id"`
				}
				json.Unmarshal([]byte(do("fork", "--json", parent.ID)), &children)
				for _, c := range children {
					do("rm", "-f", "--with-snapshots", c.ID)
				}
				if ops%4 == 0 {
					do("create", "--json", "--image", image) // left running, checked at the end
				}
				do("rm", "-f", "--with-snapshots", parent.ID)
			}
			results <- res
		}()
	}
	var problems []string
	for w := 0; w < workers; w++ {
		problems = append(problems, (<-results).problems...)
	}
	close(stop)
	reaped := <-reapDone
	// The checks below run the test's nexus, which refuses a hand-started
	// daemon of another build (the race-instrumented one): stop it first.
	d.Stop(t)
	// One last pass after the churn: every planted orphan must be gone.
	final, r := reapRun(t, root, "--apply")
	if r.code != 0 {
		t.Fatalf("final reap: %+v", r)
	}
	for _, del := range final.Deleted {
		reaped.deleted[del.Path] = true
		if !planted[del.Path] {
			reaped.violations++
			reaped.problems = append(reaped.problems, "final pass deleted "+del.Path)
		}
	}
	for p := range planted {
		if exists(p) {
			problems = append(problems, "planted orphan survived: "+p)
		}
	}
	t.Logf("reap passes: %d, violations: %d, lifecycle problems: %d, orphans reclaimed: %d/%d (race-instrumented binaries: %v)",
		reaped.passes, reaped.violations, len(problems), len(reaped.deleted), len(planted), raceEnabled)
	if reaped.passes < 2 {
		t.Fatalf("only %d reap passes ran during the churn", reaped.passes)
	}
	if reaped.violations > 0 || len(problems) > 0 {
		t.Fatalf("violations: %v\nlifecycle problems: %v", reaped.problems, problems)
	}
	assertClean(t, root)
	for _, sb := range sandboxes(t, root) {
		for _, res := range sb.Resources {
			if !exists(filepath.Join(root, res.Path)) {
				t.Fatalf("sandbox %s lost %s", sb.ID, res.Path)
			}
		}
		mustOK(t, proc(t, root, "rm", "-f", "--with-snapshots", sb.ID), "rm")
	}
}

// An intent that cannot be read keeps what it might cover, and the
// report says so distinctly; the reaper neither hangs on it nor deletes it.
func TestReapUnreadableIntentKeeps(t *testing.T) {
	t.Parallel()
	root := shortRoot(t)
	id := ulid.Make().String()
	write(t, filepath.Join(root, "disks", id+".raw"), 100)
	if err := syscall.Mkfifo(filepath.Join(root, "disks", id+".create-intent.json"), 0o600); err != nil {
		t.Fatal(err)
	}
	rep, r := reapRun(t, root, "--apply")
	if r.code != 0 || len(rep.Deleted) != 0 {
		t.Fatalf("apply: exit %d deleted %v", r.code, paths(rep.Deleted))
	}
	for _, p := range []string{id + ".raw", id + ".create-intent.json"} {
		k := has(rep.Kept, filepath.Join(root, "disks", p))
		if k == nil || k.Verdict != "ambiguous" || !strings.Contains(k.Reason, "intent unreadable") || !strings.Contains(k.Reason, "inspect") {
			t.Fatalf("%s: %+v", p, k)
		}
		if !exists(filepath.Join(root, "disks", p)) {
			t.Fatalf("%s deleted", p)
		}
	}
	human := mustOK(t, nexus(t, root, "reap"), "reap").stdout
	if !strings.Contains(human, "intent unreadable") {
		t.Fatalf("human report hides the unreadable intent:\n%s", human)
	}
}

// A delete that fails lands in failed with its error, the rest is still
// deleted, and --apply exits non-zero. The failure is real: the orphan is a
// mount point (a bind mount), which unlink refuses with EBUSY.
func TestReapApplyFailureExitsNonZero(t *testing.T) {
	t.Parallel()
	root := shortRoot(t)
	id := ulid.Make().String()
	busy := filepath.Join(root, "disks", id+".raw")
	write(t, busy, 10)
	write(t, filepath.Join(root, "disks", id+"-workspace.ext4"), 10)
	src := filepath.Join(t.TempDir(), "src")
	write(t, src, 10)
	if out, err := exec.Command("mount", "--bind", src, busy).CombinedOutput(); err != nil {
		t.Skipf("cannot bind-mount here, failure path not exercised: %v %s", err, out)
	}
	defer exec.Command("umount", busy).Run()
	rep, r := reapRun(t, root, "--apply")
	if r.code != 1 || !strings.Contains(r.stderr, "could not be deleted") {
		t.Fatalf("exit %d stderr %q", r.code, r.stderr)
	}
	if len(rep.Failed) != 1 || rep.Failed[0].Path != busy || rep.Failed[0].Error == "" {
		t.Fatalf("failed %+v", rep.Failed)
	}
	if has(rep.Deleted, filepath.Join(root, "disks", id+"-workspace.ext4")) == nil {
		t.Fatalf("the deletable orphan was not deleted: %v", paths(rep.Deleted))
	}
	if evs := mustOK(t, nexus(t, root, "events", "--type", "reap.applied"), "events").stdout; !strings.Contains(evs, "busy") {
		t.Fatalf("the failure is not journaled: %s", evs)
	}
}

// The verify pass: a path that exists again after its delete reported
// success moves to failed with the contract's message. A real process
// re-creates the file in a tight loop; 2,000 other orphans are deleted
// between its unlink and the verify pass, so it is back by then.
func TestReapVerifyPassCatchesASurvivor(t *testing.T) {
	t.Parallel()
	root := shortRoot(t)
	hot := filepath.Join(root, "disks", "hot.shadow.ext4")
	write(t, hot, 10)
	for i := 0; i < 2000; i++ {
		write(t, filepath.Join(root, "disks", "o"+strings.Repeat("x", 3)+ulid.Make().String()[20:]+".shadow.ext4"), 0)
	}
	loop := exec.Command("sh", "-c", `while :; do : > "$1"; done`, "sh", hot)
	if err := loop.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { loop.Process.Kill(); loop.Wait() }()
	rep, r := reapRun(t, root, "--apply")
	if r.code != 1 {
		t.Fatalf("exit %d, want 1 (stderr %q)", r.code, r.stderr)
	}
	f := has(rep.Failed, hot)
	if f == nil || f.Error != "delete reported success but the path still exists" {
		t.Fatalf("failed %+v", rep.Failed)
	}
	if has(rep.Deleted, hot) != nil || len(rep.Deleted) < 1990 {
		t.Fatalf("deleted %d, hot in deleted: %v", len(rep.Deleted), has(rep.Deleted, hot) != nil)
	}
}
