package main

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/nexus-sandbox/nexus/internal/testutil"
	"github.com/nexus-sandbox/nexus/projections"
	"github.com/nexus-sandbox/nexus/replay"
)

// Crash points per saga, as the crash tests name them. A random action may
// kill its command at any of them, before or after the step's events.
var sagaSteps = map[string][]string{
	"create":   {"intents", "image-cache", "workspace-disk", "supervisor-state", "record-dir", "commit", "retire-intents", "run-mark", "supervisor", "vmm"},
	"fork":     {"intents", "workspace-disk", "supervisor-state", "record-dir", "commit", "retire-intents", "run-mark", "supervisor", "vmm"},
	"restore":  {"intents", "workspace-disk", "stage-restore", "supervisor-state", "record-dir", "commit", "retire-intents", "run-mark", "supervisor", "vmm"},
	"rm":       {"vmm-stop", "supervisor-stop", "reclaim", "remove"},
	"snapshot": {"capture"},
	"start":    {"overlay-check", "run-mark", "supervisor", "vmm"},
	"stop":     {"vmm-stop", "vmm-sockets", "supervisor-stop"},
}

// modelRun is one random sequence of lifecycle operations on one state
// root, some killed by SIGKILL at a random saga step.
type modelRun struct {
	t       *testing.T
	rng     *rand.Rand
	root    string
	image   string
	volumes map[string]string // name → sha256sum line, taken at creation
	log     []string
	crashes int
}

// TestModelRandomLifecycles runs random sequences of create, fork,
// snapshot, restore, start, stop, rm and volume operations, killing about a
// third of them at a random saga step, with `nexus recover` after each
// kill. After every operation it runs `reap --apply` (which must delete
// nothing owned and leave no orphan) and checks the invariants: every sandbox owns
// files that exist (nothing owned was deleted), nothing under the root is
// untracked, no volume's bytes changed, the journal verifies and replays to
// the same sandboxes as the live projection. At the end everything is
// removed and nothing may be left.
//
// NEXUS_MODEL_RUNS and NEXUS_MODEL_OPS size it (make soak raises both);
// NEXUS_MODEL_SEED replays one failing sequence.
func TestModelRandomLifecycles(t *testing.T) {
	testutil.StartsSandboxes(t)
	t.Parallel()
	runs, ops := envInt("NEXUS_MODEL_RUNS", 3), envInt("NEXUS_MODEL_OPS", 10)
	seed := envSeed()
	image := makeImage(t)
	// The sequences run in parallel: the total is counted atomically and
	// logged once every one has ended.
	var total atomic.Int64
	t.Cleanup(func() {
		t.Logf("%d sequences of %d operations, %d of them killed at a saga step", runs, ops, total.Load())
	})
	for i := range runs {
		s := seed + uint64(i)
		if seed == 0 {
			s = rand.Uint64()
		}
		t.Run(fmt.Sprintf("seed=%d", s), func(t *testing.T) {
			t.Parallel()
			m := &modelRun{t: t, rng: rand.New(rand.NewPCG(s, s)), root: shortRoot(t), image: image, volumes: map[string]string{}}
			t.Cleanup(func() {
				if t.Failed() {
					t.Logf("operations (NEXUS_MODEL_SEED=%d NEXUS_MODEL_RUNS=1 NEXUS_MODEL_OPS=%d):\n  %s", s, ops, strings.Join(m.log, "\n  "))
				}
			})
			for range ops {
				m.step()
				m.check()
			}
			m.teardown()
			total.Add(int64(m.crashes))
		})
	}
}

func envInt(name string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil && v > 0 {
		return v
	}
	return def
}

func (m *modelRun) pick(list []jsonSandbox, state projections.State) (jsonSandbox, bool) {
	var c []jsonSandbox
	for _, sb := range list {
		if state == "" || sb.State == state {
			c = append(c, sb)
		}
	}
	if len(c) == 0 {
		return jsonSandbox{}, false
	}
	return c[m.rng.IntN(len(c))], true
}

// step performs one random operation. Refusals (exit 1) are legitimate
// outcomes, for example forking a sandbox with a volume; only a usage
// error or an unexpected crash is a failure.
func (m *modelRun) step() {
	saga, args := m.choose(sandboxes(m.t, m.root))
	if args == nil || (saga != "" && slices.Contains(args, "")) {
		return
	}
	m.runStep(saga, args)
}

// choose picks a random operation on the current sandboxes: its saga kind
// and its arguments (nil: nothing to do).
func (m *modelRun) choose(list []jsonSandbox) (saga string, args []string) {
	switch op := m.rng.IntN(10); {
	case op < 3 || len(list) == 0:
		saga, args = "create", []string{"create", "--image", m.image}
		if m.rng.IntN(3) == 0 {
			args = append(args, "--handle", fmt.Sprintf("h/%d", m.rng.IntN(1000)), "--shadow", "cfg="+filepath.Dir(m.image))
		}
		if m.rng.IntN(4) == 0 {
			name := fmt.Sprintf("v%d", len(m.volumes))
			if m.volumes[name] == "" {
				m.run("volume", "create", name, "--size", "16M")
				m.volumes[name] = volumeSum(m.t, m.root, name)
			}
			args = append(args, "--volume", name+":/data")
		}
	case op == 3:
		sb, _ := m.pick(list, projections.StateRunning)
		saga, args = "fork", []string{"fork", sb.ID, "--count", strconv.Itoa(1 + m.rng.IntN(2)), "--readonly-volumes"}
	case op == 4:
		sb, _ := m.pick(list, "")
		saga, args = "snapshot", []string{"snapshot", sb.ID}
	case op == 5:
		var snaps []string
		for _, sb := range list {
			snaps = append(snaps, sb.Snapshots...)
		}
		if len(snaps) == 0 {
			return
		}
		snap := snaps[m.rng.IntN(len(snaps))]
		saga, args = "restore", []string{"restore", snap}
		if m.rng.IntN(3) == 0 {
			saga, args = "snapshot-rm", []string{"snapshot", "rm", snap}
		}
	case op == 6:
		if sb, ok := m.pick(list, projections.StateRunning); ok {
			saga, args = "stop", []string{"stop", sb.ID}
		}
	case op == 7:
		if sb, ok := m.pick(list, projections.StateStopped); ok {
			saga, args = "start", []string{"start", sb.ID}
		}
	default:
		sb, _ := m.pick(list, "")
		saga, args = "rm", []string{"rm", "-f", "--with-snapshots", sb.ID}
	}
	return saga, args
}

// runStep runs one chosen operation, killing it at a random saga step about
// a third of the time (then recovering).
func (m *modelRun) runStep(saga string, args []string) {
	if saga != "" && m.rng.IntN(3) == 0 {
		steps := sagaSteps[saga]
		if saga == "snapshot-rm" {
			steps = []string{"delete:" + args[len(args)-1]} // the step names its snapshot
		}
		point := saga + "." + steps[m.rng.IntN(len(steps))]
		if m.rng.IntN(2) == 0 {
			point += ":before"
		}
		m.log = append(m.log, "NEXUS_CRASH_AT="+point+" nexus "+strings.Join(args, " "))
		r := nexusEnv(m.t, m.root, []string{"NEXUS_CRASH_AT=" + point}, append([]string{"--driver", "process"}, args...)...)
		if r.code == 2 {
			m.t.Fatalf("usage error: %s", r.stderr)
		}
		if r.code == -1 {
			m.crashes++
		}
		if m.rng.IntN(2) == 0 {
			// A reap that runs before anyone recovered: whatever the dead
			// saga left is in flight (an open saga names it) and must be
			// kept, or the recover below, and the checks after it, fail.
			m.log = append(m.log, "nexus reap --apply")
			if _, r := reapRun(m.t, m.root, "--apply"); r.code != 0 {
				m.t.Fatalf("reap --apply before recover: exit %d: %s", r.code, r.stderr)
			}
		}
		m.run("recover")
		return
	}
	m.run(args...)
}

func (m *modelRun) run(args ...string) {
	m.log = append(m.log, "nexus "+strings.Join(args, " "))
	r := proc(m.t, m.root, args...)
	if r.code != 0 && r.code != 1 {
		m.t.Fatalf("nexus %s: exit %d: %s", strings.Join(args, " "), r.code, r.stderr)
	}
}

// check asserts the invariants that must hold after any operation, killed
// or not, once recover has run.
func (m *modelRun) check() {
	t := m.t
	t.Helper()
	m.reapTwice(sandboxes(t, m.root))
	list := sandboxes(t, m.root)
	for _, sb := range list {
		if sb.State == projections.StateCreating {
			t.Fatalf("after recover, %s is still creating", sb.ID)
		}
		for _, r := range sb.Resources {
			if _, err := os.Lstat(filepath.Join(m.root, r.Path)); err != nil {
				t.Fatalf("%s owns %s (%s), which is gone: %v", sb.ID, r.Path, r.Kind, err)
			}
		}
	}
	if left := untracked(t, m.root); len(left) > 0 {
		t.Fatalf("untracked by the journal: %v", left)
	}
	for name, sum := range m.volumes {
		if _, err := os.Stat(filepath.Join(m.root, "volumes", name, "disk.ext4")); err != nil {
			t.Fatalf("volume %s went missing: %v", name, err)
		}
		if volumeSum(t, m.root, name) != sum {
			// A volume attached read-write may be written by its sandbox's
			// guest; the process driver's guest never writes to volumes, so
			// any change here is nexus's doing.
			t.Fatalf("volume %s changed", name)
		}
	}
	m.checkReplay(list)
}

// reapTwice runs `reap --apply` and then a dry run: the apply deletes
// nothing any sandbox owns and fails nothing, and the dry run after it
// finds no orphan left (recover plus one reap leaves none).
func (m *modelRun) reapTwice(before []jsonSandbox) {
	t := m.t
	t.Helper()
	owned := map[string]string{}
	for _, sb := range before {
		for _, r := range sb.Resources {
			owned[r.Path] = sb.ID
		}
	}
	run := func(args ...string) reapJSON {
		rep, r := reapRun(t, m.root, args...)
		if r.code != 0 {
			t.Fatalf("reap %v: exit %d: %s", args, r.code, r.stderr)
		}
		return rep
	}
	applied := run("--apply")
	for _, d := range applied.Deleted {
		rel, _ := filepath.Rel(m.root, d.Path)
		for dir := rel; dir != "." && dir != "/"; dir = filepath.Dir(dir) {
			if sb, ok := owned[dir]; ok {
				t.Fatalf("reap deleted %s, owned by %s", d.Path, sb)
			}
		}
	}
	if len(applied.Failed) > 0 {
		t.Fatalf("reap failed to delete %v", paths(applied.Failed))
	}
	if again := run(); len(again.Orphans) > 0 {
		t.Fatalf("orphans left after recover and reap --apply: %v", paths(again.Orphans))
	}
}

// checkReplay: the journal verifies, `replay diff` finds the state root
// matching it, and a fold from scratch over it gives the sandboxes the live
// projections report.
func (m *modelRun) checkReplay(list []jsonSandbox) {
	t := m.t
	t.Helper()
	r := nexus(t, m.root, "replay", "verify", "--json")
	var rep replay.Report
	if err := json.Unmarshal([]byte(r.stdout), &rep); err != nil || r.code != 0 || !rep.OK() || len(rep.OpenSagas) != 0 {
		t.Fatalf("replay verify: exit %d %v %+v %s", r.code, err, rep, r.stderr)
	}
	if r := nexus(t, m.root, "replay", "diff"); r.code != 0 {
		t.Fatalf("replay diff after recover and reap: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	var st struct {
		Sandboxes []jsonSandbox `json:"sandboxes"`
	}
	out := mustOK(t, nexus(t, m.root, "replay", "at", "999999999", "--json"), "replay at").stdout
	if err := json.Unmarshal([]byte(out), &st); err != nil {
		t.Fatal(err)
	}
	key := func(l []jsonSandbox) []string {
		var k []string
		for _, sb := range l {
			k = append(k, fmt.Sprintf("%s:%s:%d", sb.ID, sb.State, len(sb.Resources)))
		}
		slices.Sort(k)
		return k
	}
	if a, b := key(st.Sandboxes), key(list); !slices.Equal(a, b) {
		t.Fatalf("replay from scratch %v != live projection %v", a, b)
	}
}

func (m *modelRun) teardown() {
	for _, sb := range sandboxes(m.t, m.root) {
		mustOK(m.t, proc(m.t, m.root, "rm", "-f", "--with-snapshots", sb.ID), "rm "+sb.ID)
	}
	m.check()
	if list := sandboxes(m.t, m.root); len(list) != 0 {
		m.t.Fatalf("%d sandboxes left after removing all", len(list))
	}
	if left := liveProcesses(m.t, m.root); len(left) > 0 {
		m.t.Fatalf("processes left: %v", left)
	}
}
