package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/nexus-sandbox/nexus/internal/powerfs"
	"github.com/nexus-sandbox/nexus/internal/testutil"
)

// powerRoot is a state root on powerfs: what nexus did not fsync is lost
// at each cut, directory entries included.
type powerRoot struct {
	root string // the mount, nexus's state root
	fs   *powerfs.FS
}

func mountPowerRoot(t *testing.T) *powerRoot {
	t.Helper()
	dir := shortRoot(t)
	root := filepath.Join(dir, "r")
	if err := os.Mkdir(root, 0o755); err != nil {
		t.Fatal(err)
	}
	p, err := powerfs.Mount(filepath.Join(dir, "backing"), root)
	if err != nil {
		t.Skipf("no FUSE here: %v", err)
	}
	// Runs before shortRoot's cleanup: the processes first, then the mount.
	t.Cleanup(func() {
		killRootProcesses(root)
		if err := p.Unmount(); err != nil {
			t.Error(err)
		}
	})
	return &powerRoot{root: root, fs: p}
}

// killRootProcesses SIGKILLs the live processes naming root in their
// command line: its daemon (--state-dir root), its commands, its
// supervisors and VMMs; it returns how many there were.
func killRootProcesses(root string) int {
	n := 0
	for _, p := range testutil.ProcessesOf(root) {
		if !p.Zombie {
			syscall.Kill(p.Pid, syscall.SIGKILL)
			n++
		}
	}
	return n
}

// powerWorker drives real commands on a power root until stopped, and
// remembers what each acknowledged command (exit 0) claimed.
type powerWorker struct {
	root, image string
	env         []string
	rng         *rand.Rand
	stop        atomic.Bool
	done        chan struct{}

	mu      sync.Mutex
	present map[string]bool // sandboxes an acknowledged create or fork made
	removed map[string]bool // sandboxes an acknowledged rm removed
	snaps   map[string]string
	acked   int
	checked int
	// reclaimed counts what reap deleted after the cuts.
	reclaimed int
	failed    []string // commands that failed without being killed
}

func (w *powerWorker) run(args ...string) (string, bool) {
	ctx, cancel := context.WithTimeout(context.Background(), commandWait)
	defer cancel()
	cmd := exec.CommandContext(ctx, nexusBin, append([]string{"--state-dir", w.root, "--driver", "process"}, args...)...)
	cmd.Env = append(append(os.Environ(), "NEXUS_STATE_DIR="), w.env...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	if err == nil {
		w.mu.Lock()
		w.acked++
		w.mu.Unlock()
		return stdout.String(), true
	}
	if !w.stop.Load() {
		w.mu.Lock()
		w.failed = append(w.failed, fmt.Sprintf("%v: %v: %s", args, err, strings.TrimSpace(stderr.String())))
		w.mu.Unlock()
	}
	return "", false
}

// forget marks ids as neither surely present nor surely removed: a command
// on them did not return.
func (w *powerWorker) forget(ids ...string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, id := range ids {
		delete(w.present, id)
		delete(w.removed, id)
		for s, of := range w.snaps {
			if of == id {
				delete(w.snaps, s)
			}
		}
	}
}

func (w *powerWorker) made(ids ...string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, id := range ids {
		w.present[id] = true
	}
}

func (w *powerWorker) gone(id string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	delete(w.present, id)
	w.removed[id] = true
	for s, of := range w.snaps {
		if of == id {
			delete(w.snaps, s)
		}
	}
}

func (w *powerWorker) loop() {
	defer close(w.done)
	for !w.stop.Load() {
		out, ok := w.run("create", "--image", w.image, "-q")
		if !ok {
			continue
		}
		a := strings.TrimSpace(out)
		w.made(a)
		if w.stop.Load() {
			return
		}
		var b string
		if out, ok := w.run("fork", a, "-q"); ok {
			b = strings.TrimSpace(out)
			w.made(b)
		}
		if w.stop.Load() {
			return
		}
		if out, ok := w.run("snapshot", a, "-q"); ok {
			w.mu.Lock()
			w.snaps[strings.TrimSpace(out)] = a
			w.mu.Unlock()
		} else {
			w.forget(a)
		}
		if w.stop.Load() {
			return
		}
		if _, ok := w.run("stop", a); !ok {
			w.forget(a)
		}
		if w.stop.Load() {
			return
		}
		if b != "" {
			if _, ok := w.run("rm", "-f", b); ok {
				w.gone(b)
			} else {
				w.forget(b)
			}
		}
		if w.stop.Load() {
			return
		}
		// Every other sandbox lives on into the next cut.
		if w.rng.IntN(2) == 0 {
			if _, ok := w.run("rm", "-f", "--with-snapshots", a); ok {
				w.gone(a)
			} else {
				w.forget(a)
			}
		}
		if w.stop.Load() {
			return
		}
		w.run("reap", "--apply")
	}
}

// smallImage is a sparse 8 MiB image with 1 MiB of data: a clone writes
// it through the FUSE mount, held in memory until its fsync.
func smallImage(t *testing.T) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "small.raw")
	data := make([]byte, 1<<20)
	for i := range data {
		data[i] = byte(i*7 + i>>11)
	}
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteAt(data, 2<<20); err != nil {
		t.Fatal(err)
	}
	if err := f.Truncate(8 << 20); err != nil {
		t.Fatal(err)
	}
	return path
}

// powerCutFigures is what a run of cuts found.
type powerCutFigures struct {
	cuts, acked, checked, lost, unopened, reclaimed int
}

// powerCutRun says how cutPower runs: how many cuts, each round's
// environment for the commands (and the daemons they start), and, for a
// negative control, how many commands to let succeed in a round before
// cutting at once (0: cut at a random instant).
type powerCutRun struct {
	cuts      int
	env       func(round int) []string
	afterAcks int
}

// cutPower runs rounds on one root: commands in the background, a power
// cut at a random instant (every process of the root SIGKILLed,
// everything not fsynced dropped), a remount, then the checks. It
// returns what it found instead of failing, so a negative control can
// assert the failure.
func cutPower(t *testing.T, run powerCutRun) (powerCutFigures, []string) {
	pr := mountPowerRoot(t)
	root := pr.root
	seed := uint64(time.Now().UnixNano())
	if s := os.Getenv("NEXUS_POWERCUT_SEED"); s != "" {
		seed, _ = strconv.ParseUint(s, 10, 64)
	}
	t.Logf("NEXUS_POWERCUT_SEED=%d", seed)
	rng := rand.New(rand.NewPCG(seed, 1))
	w := &powerWorker{root: root, image: smallImage(t), rng: rng,
		present: map[string]bool{}, removed: map[string]bool{}, snaps: map[string]string{}}
	var fig powerCutFigures
	var problems []string
	for i := range run.cuts {
		w.done = make(chan struct{})
		w.stop.Store(false)
		if run.env != nil {
			w.env = run.env(i)
		}
		w.mu.Lock()
		before := w.acked
		w.mu.Unlock()
		go w.loop()
		// Instants spread over whole command lifecycles, however slow the
		// machine: after a random number of the round's commands were
		// acknowledged (none: during the first, which starts the daemon),
		// a random delay into the ones under way.
		acks := rng.IntN(4)
		at := time.Duration(rng.Int64N(int64(testutil.Scale(2 * time.Second))))
		if run.afterAcks > 0 {
			acks, at = run.afterAcks, 0
		}
		testutil.WaitUntil(t, 5*time.Minute, "commands acknowledged before the cut", func() bool {
			w.mu.Lock()
			defer w.mu.Unlock()
			// A command that failed uncut ends the wait: the problems
			// below carry its error.
			return w.acked-before >= acks || len(w.failed) > 0
		})
		select {
		case <-time.After(at):
		case <-w.done:
		}
		w.stop.Store(true)
		testutil.WaitUntil(t, 2*time.Minute, "every process of the root killed at the cut", func() bool {
			n := killRootProcesses(root)
			select {
			case <-w.done:
				return n == 0
			default:
				return false
			}
		})
		if err := pr.fs.Cut(); err != nil {
			t.Fatalf("cut %d: %v", i, err)
		}
		fig.cuts++
		w.mu.Lock()
		t.Logf("cut %d (%v): %d commands acknowledged so far", i, w.env, w.acked)
		w.mu.Unlock()
		p := checkAfterCut(t, w, root)
		if len(p) > 0 {
			problems = append(problems, fmt.Sprintf("cut %d: %s", i, strings.Join(p, "; ")))
			if slices.ContainsFunc(p, func(s string) bool { return strings.HasPrefix(s, "root does not open") }) {
				fig.unopened++
				break
			}
		}
		fig.lost += countLost(p)
	}
	w.mu.Lock()
	fig.acked, fig.checked, fig.reclaimed = w.acked, w.checked, w.reclaimed
	if len(w.failed) > 0 {
		problems = append(problems, "commands failed before any cut: "+strings.Join(w.failed, "; "))
	}
	w.mu.Unlock()
	return fig, problems
}

func countLost(problems []string) int {
	n := 0
	for _, p := range problems {
		if strings.HasPrefix(p, "acknowledged") {
			n++
		}
	}
	return n
}

// checkAfterCut checks a root after a cut and returns what is wrong: every
// acknowledged sandbox and snapshot is there and every acknowledged
// removal holds; the root opens; recover, then replay verify and replay
// diff are clean; reap finds nothing owned to delete.
func checkAfterCut(t *testing.T, w *powerWorker, root string) []string {
	t.Helper()
	var problems []string
	lsq := nexus(t, root, "ls", "-q")
	if lsq.code != 0 {
		return []string{fmt.Sprintf("root does not open: ls: exit %d: %s", lsq.code, lsq.stderr)}
	}
	if r := proc(t, root, "recover"); r.code != 0 {
		problems = append(problems, fmt.Sprintf("recover: exit %d: %s", r.code, r.stderr))
	}
	lsq = nexus(t, root, "ls", "-q")
	have := map[string]bool{}
	for _, id := range strings.Fields(lsq.stdout) {
		have[id] = true
	}
	snq := nexus(t, root, "snapshot", "ls", "-q")
	haveSnap := map[string]bool{}
	for _, id := range strings.Fields(snq.stdout) {
		haveSnap[id] = true
	}
	w.mu.Lock()
	for id := range w.present {
		w.checked++
		if !have[id] {
			problems = append(problems, "acknowledged sandbox "+id+" is gone")
		}
	}
	for id := range w.removed {
		w.checked++
		if have[id] {
			problems = append(problems, "acknowledged removal of "+id+" undone")
		}
	}
	for s, of := range w.snaps {
		w.checked++
		if !haveSnap[s] {
			problems = append(problems, "acknowledged snapshot "+s+" is gone")
		} else if why := snapshotWhole(root, of, s); why != "" {
			problems = append(problems, "acknowledged snapshot "+s+" "+why)
		}
	}
	w.mu.Unlock()
	// What a cut brought back of a command cut short is an orphan, which
	// reap reclaims, and which replay diff then no longer lists. A file
	// of an acknowledged removal must not be among them: removals are
	// fsynced before they are journaled.
	rep, r := reapRun(t, root, "--apply")
	if r.code != 0 || len(rep.Failed) > 0 {
		problems = append(problems, fmt.Sprintf("reap --apply: exit %d: %s %+v", r.code, r.stderr, rep.Failed))
	}
	w.mu.Lock()
	w.reclaimed += len(rep.Deleted)
	problems = append(problems, cameBack(rep.Deleted, w.removed)...)
	w.mu.Unlock()
	for _, args := range [][]string{{"replay", "verify"}, {"replay", "diff"}} {
		if r := nexus(t, root, args...); r.code != 0 {
			problems = append(problems, fmt.Sprintf("%v: exit %d: %s%s", args, r.code, r.stdout, r.stderr))
		}
	}
	if rep, _ := reapRun(t, root); len(rep.Orphans) > 0 {
		problems = append(problems, fmt.Sprintf("reap still finds %+v", rep.Orphans))
	}
	return problems
}

// snapshotWhole says what an acknowledged snapshot lacks on disk ("" if
// nothing): its manifest, each disk copy it lists and, with VM state, the
// VMM's files a restore reads, each holding data.
func snapshotWhole(root, sandbox, snap string) string {
	dir := filepath.Join(root, "snapshots", sandbox, snap)
	data, err := os.ReadFile(filepath.Join(dir, "manifest.json"))
	if err != nil {
		return "lost its manifest: " + err.Error()
	}
	var man struct {
		VMState bool `json:"vm_state"`
		Disks   []struct {
			File string `json:"file"`
		} `json:"disks"`
	}
	if err := json.Unmarshal(data, &man); err != nil {
		return "has a damaged manifest: " + err.Error()
	}
	var want []string
	for _, d := range man.Disks {
		want = append(want, d.File)
	}
	if man.VMState {
		want = append(want, "config.json", "state.json", "memory-ranges")
	}
	for _, f := range want {
		if fi, err := os.Lstat(filepath.Join(dir, f)); err != nil || fi.Size() == 0 {
			return fmt.Sprintf("lost %s (%v)", f, err)
		}
	}
	return ""
}

// cameBack lists the reaped files that belong to a sandbox an
// acknowledged rm removed: a removal a cut undid.
func cameBack(deleted []reapR, removed map[string]bool) []string {
	var out []string
	for _, d := range deleted {
		for id := range removed {
			if strings.Contains(d.Path, id) {
				out = append(out, "acknowledged removal of "+id+" came back: "+d.Path)
			}
		}
	}
	return out
}

// TestPowerCut cuts power under real commands on the process driver, at
// random instants, and checks that nothing acknowledged was lost and
// that the root opens and audits clean. NEXUS_POWERCUT_CUTS sizes it
// (make soak raises it); NEXUS_POWERCUT_SEED replays one run.
func TestPowerCut(t *testing.T) {
	testutil.StartsSandboxes(t)
	t.Parallel()
	// Every other round runs the server with SyncAlways, the journal's
	// configuration before group commit.
	fig, problems := cutPower(t, powerCutRun{cuts: envInt("NEXUS_POWERCUT_CUTS", 6), env: func(round int) []string {
		if round%2 == 1 {
			return []string{"NEXUS_JOURNAL_SYNC_ALWAYS=1"}
		}
		return nil
	}})
	t.Logf("cuts %d, acknowledged commands %d, acknowledged facts checked %d, lost %d, roots that would not open %d, orphans reaped %d",
		fig.cuts, fig.acked, fig.checked, fig.lost, fig.unopened, fig.reclaimed)
	for _, p := range problems {
		t.Error(p)
	}
}

// The harness's negative control: with the journal's fsyncs removed, a
// cut after acknowledged commands loses them.
func TestPowerCutLosesAcknowledgedEventsWithoutTheJournalsFsync(t *testing.T) {
	testutil.StartsSandboxes(t)
	t.Parallel()
	fig, problems := cutPower(t, powerCutRun{cuts: 1, afterAcks: 2, env: func(int) []string {
		return []string{"NEXUS_JOURNAL_NO_FSYNC=1"}
	}})
	t.Logf("cuts %d, acknowledged commands %d, lost %d: %v", fig.cuts, fig.acked, fig.lost, problems)
	if fig.lost == 0 {
		t.Fatalf("no acknowledged sandbox or snapshot lost with the journal's fsyncs removed: the harness cannot see the failure")
	}
}

// The harness's negative control: with host/durable's directory fsync
// removed, a cut loses a published file's name (a disk renamed into
// place, an intent), which the journal still claims.
func TestPowerCutLosesPublishedFilesWithoutTheDirectoryFsync(t *testing.T) {
	testutil.StartsSandboxes(t)
	t.Parallel()
	fig, problems := cutPower(t, powerCutRun{cuts: 1, afterAcks: 3, env: func(int) []string {
		return []string{"NEXUS_DURABLE_NO_DIR_FSYNC=1"}
	}})
	t.Logf("cuts %d, acknowledged commands %d: %v", fig.cuts, fig.acked, problems)
	if !slices.ContainsFunc(problems, func(p string) bool { return strings.Contains(p, "missing on disk") }) {
		t.Fatalf("no owned file missing after the cut with the directory fsync removed: the harness cannot see the failure")
	}
}

// A VMM socket a cut start left behind, of a sandbox that exists but is
// stopped, with no event recording it: replay diff lists it, reap calls it
// an orphan (not owned), and reap --apply reclaims it, after which both
// are clean.
func TestReapAndDiffAgreeOnALeftSocket(t *testing.T) {
	testutil.StartsSandboxes(t)
	t.Parallel()
	root := shortRoot(t)
	sb := createJSON(t, root, "--image", smallImage(t))
	mustOK(t, proc(t, root, "stop", sb.ID), "stop")
	sock := filepath.Join(root, "run", "sb-"+sb.ID+".sock")
	if _, err := os.Lstat(sock); err == nil {
		t.Fatalf("stop left %s", sock)
	}
	l, err := net.ListenUnix("unix", &net.UnixAddr{Name: sock, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	l.SetUnlinkOnClose(false)
	l.Close()
	rel := "run/sb-" + sb.ID + ".sock"
	if r := nexus(t, root, "replay", "diff"); r.code != 1 || !strings.Contains(r.stdout, rel) {
		t.Fatalf("replay diff: exit %d, want 1 listing %s:\n%s%s", r.code, rel, r.stdout, r.stderr)
	}
	rep, _ := reapRun(t, root)
	if len(rep.Orphans) != 1 || !strings.HasSuffix(rep.Orphans[0].Path, rel) {
		t.Fatalf("reap: orphans %+v, kept %+v; want %s alone", rep.Orphans, rep.Kept, rel)
	}
	rep, r := reapRun(t, root, "--apply")
	if r.code != 0 || len(rep.Deleted) != 1 {
		t.Fatalf("reap --apply: exit %d, deleted %+v, kept %+v: %s", r.code, rep.Deleted, rep.Kept, r.stderr)
	}
	mustOK(t, nexus(t, root, "replay", "diff"), "replay diff after the reap")
	mustOK(t, proc(t, root, "start", sb.ID), "start after the reap")
}

// The harness's negative controls for a removal and for a snapshot, cut
// at a known instant: with SyncUnlink left out, an acknowledged rm's
// files come back at the cut (replay diff lists them, reap reclaims them
// as orphans: nothing owned is touched, but the removal the journal
// records was undone on disk, which the harness counts as a failure);
// with the snapshot's SyncDirFiles left out, an acknowledged snapshot
// loses the VMM's files. With the fsyncs, neither happens.
func TestPowerCutRemovalsAndSnapshotsAreDurable(t *testing.T) {
	testutil.StartsSandboxes(t)
	t.Parallel()
	for _, c := range []struct {
		name string
		env  []string
	}{
		{"fsynced", nil},
		{"without the unlink fsync", []string{"NEXUS_DURABLE_NO_UNLINK_FSYNC=1"}},
		{"without the snapshot fsync", []string{"NEXUS_DURABLE_NO_SNAPSHOT_FSYNC=1"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			pr := mountPowerRoot(t)
			root := pr.root
			run := func(args ...string) string {
				t.Helper()
				r := nexusEnv(t, root, c.env, append([]string{"--driver", "process"}, args...)...)
				return strings.TrimSpace(mustOK(t, r, strings.Join(args, " ")).stdout)
			}
			img := smallImage(t)
			kept := run("create", "--image", img, "-q")
			snap := run("snapshot", kept, "-q")
			gone := run("create", "--image", img, "-q")
			run("rm", "-f", gone)
			testutil.WaitUntil(t, 2*time.Minute, "every process of the root killed at the cut", func() bool {
				return killRootProcesses(root) == 0
			})
			if err := pr.fs.Cut(); err != nil {
				t.Fatal(err)
			}
			lost := snapshotWhole(root, kept, snap)
			diff := nexus(t, root, "replay", "diff")
			mustOK(t, proc(t, root, "recover"), "recover after the cut")
			rep, r := reapRun(t, root, "--apply")
			if r.code != 0 {
				t.Fatalf("reap --apply after the cut: exit %d: %s", r.code, r.stderr)
			}
			back := cameBack(rep.Deleted, map[string]bool{gone: true})
			t.Logf("snapshot: %q; came back: %v; replay diff exit %d", lost, back, diff.code)
			switch {
			case c.env == nil && (lost != "" || len(back) > 0 || diff.code != 0):
				t.Fatalf("with every fsync, the cut lost the snapshot's files (%q) or undid the rm (%v); replay diff exit %d:\n%s", lost, back, diff.code, diff.stdout)
			case strings.Contains(c.name, "unlink") && (len(back) == 0 || diff.code != 1 || !strings.Contains(diff.stdout, gone)):
				t.Fatalf("without the unlink fsync no file of the removed sandbox came back (reaped %+v; replay diff exit %d:\n%s): the harness cannot see the failure", rep.Deleted, diff.code, diff.stdout)
			case strings.Contains(c.name, "snapshot") && lost == "":
				t.Fatalf("without the snapshot fsync the snapshot kept its files: the harness cannot see the failure")
			}
			mustOK(t, nexus(t, root, "replay", "diff"), "replay diff after the reap")
		})
	}
}

// A create killed between publishing its intents and journaling its
// saga's start, then a power cut: the creator's lease file, synced before
// its first intent, survives the cut with the intents, so recover still
// follows it to them, removes them, and the handle is free.
func TestPowerCutKeepsADeadCreatorsTrace(t *testing.T) {
	testutil.StartsSandboxes(t)
	t.Parallel()
	pr := mountPowerRoot(t)
	image := makeImage(t)
	r := nexusEnv(t, pr.root, []string{"NEXUS_CRASH_AT=create.intents-published"}, "--driver", "process", "create", "--image", image, "--handle", "pc")
	if r.code != -1 {
		t.Fatalf("create was not killed at its step: exit %d %s", r.code, r.stderr)
	}
	testutil.WaitUntil(t, 2*time.Minute, "every process of the root killed at the cut", func() bool {
		return killRootProcesses(pr.root) == 0
	})
	if err := pr.fs.Cut(); err != nil {
		t.Fatal(err)
	}
	if left := intentsOnDisk(t, pr.root); len(left) != 2 {
		t.Fatalf("after the cut disks/ holds the intents %v, want the create and shadow intents (published durably)", left)
	}
	mustOK(t, proc(t, pr.root, "recover"), "recover after the cut")
	if left := intentsOnDisk(t, pr.root); len(left) != 0 {
		t.Fatalf("recover after the cut left the dead creator's intents %v", left)
	}
	handleFree(t, pr.root, image, "pc")
}
