package main

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nexus-sandbox/nexus/internal/testutil"
	"github.com/nexus-sandbox/nexus/projections"
)

// TestModelConcurrentLifecycles is the model harness with operations at
// once: each round starts several random operations together, on
// overlapping sandboxes and volumes (and now and then `recover` or
// `volume rm` beside them), interrupts some with SIGINT and kills some with
// SIGKILL after a random delay, and, when the run has a daemon, sometimes
// kills the daemon mid-round. Then recover runs and every invariant of the
// sequential harness must hold: nothing owned missing, nothing untracked,
// no volume byte changed (a volume may only disappear through `volume rm`
// and then no sandbox may still have it attached), the journal verifies
// with no saga open, replay diff is clean, no process without its sandbox.
//
// NEXUS_MODEL_CONC_RUNS and NEXUS_MODEL_ROUNDS size it; NEXUS_MODEL_SEED
// replays one run.
func TestModelConcurrentLifecycles(t *testing.T) {
	testutil.StartsSandboxes(t)
	t.Parallel()
	runs, rounds := envInt("NEXUS_MODEL_CONC_RUNS", 2), envInt("NEXUS_MODEL_ROUNDS", 4)
	seed := envSeed()
	image := makeImage(t)
	for i := range runs {
		s := seed + uint64(i)
		if seed == 0 {
			s = rand.Uint64()
		}
		t.Run(fmt.Sprintf("seed=%d", s), func(t *testing.T) {
			t.Parallel()
			m := &modelRun{t: t, rng: rand.New(rand.NewPCG(s, s)), root: shortRoot(t), image: image, volumes: map[string]string{}}
			withDaemon := m.rng.IntN(2) == 0
			t.Cleanup(func() {
				if t.Failed() {
					t.Logf("daemon=%v operations (NEXUS_MODEL_SEED=%d NEXUS_MODEL_CONC_RUNS=1 NEXUS_MODEL_ROUNDS=%d):\n  %s", withDaemon, s, rounds, strings.Join(m.log, "\n  "))
				}
			})
			var d *testutil.Proc
			if withDaemon {
				d = startDaemon(t, m.root)
			}
			for range rounds {
				d = m.concurrentRound(d)
				m.checkVolumes()
				m.check()
			}
			m.teardown()
		})
	}
}

// envSeed is NEXUS_MODEL_SEED as the full uint64 the harness prints.
func envSeed() uint64 {
	s, _ := strconv.ParseUint(os.Getenv("NEXUS_MODEL_SEED"), 10, 64)
	return s
}

// concurrentRound runs one round and returns the daemon serving the root
// afterwards (restarted if the round killed it; nil if the run has none).
func (m *modelRun) concurrentRound(d *testutil.Proc) *testutil.Proc {
	t := m.t
	list := sandboxes(t, m.root)
	type running struct {
		args []string
		p    *testutil.Proc
	}
	var cmds []running
	for range 2 + m.rng.IntN(3) {
		saga, args := m.choose(list)
		switch r := m.rng.IntN(8); {
		case r == 0:
			args = []string{"recover"}
		case r == 1 && len(m.volumes) > 0:
			names := make([]string, 0, len(m.volumes))
			for n := range m.volumes {
				names = append(names, n)
			}
			slices.Sort(names)
			args = []string{"volume", "rm", "--yes", names[m.rng.IntN(len(names))]}
		case r == 2 && len(m.volumes) > 0:
			// A second create on an existing volume: at most one may get it.
			for n := range m.volumes {
				args = []string{"create", "--image", m.image, "--volume", n + ":/data"}
				break
			}
		}
		if args == nil || (saga != "" && slices.Contains(args, "")) {
			continue
		}
		cmd := exec.Command(nexusBin, append([]string{"--state-dir", m.root, "--driver", "process"}, args...)...)
		cmd.Env = append(os.Environ(), "NEXUS_STATE_DIR=")
		cmds = append(cmds, running{args, testutil.Start(t, cmd)})
	}
	var fates []string
	for _, c := range cmds {
		delay := time.Duration(m.rng.IntN(400)) * time.Millisecond
		switch m.rng.IntN(4) {
		case 0:
			fates = append(fates, fmt.Sprintf("SIGINT after %v: nexus %s", delay, strings.Join(c.args, " ")))
			time.AfterFunc(delay, func() { c.p.Cmd.Process.Signal(syscall.SIGINT) })
		case 1:
			fates = append(fates, fmt.Sprintf("SIGKILL after %v: nexus %s", delay, strings.Join(c.args, " ")))
			time.AfterFunc(delay, func() { c.p.Cmd.Process.Signal(syscall.SIGKILL) })
		default:
			fates = append(fates, "nexus "+strings.Join(c.args, " "))
		}
	}
	killedDaemon := false
	if d != nil && m.rng.IntN(4) == 0 {
		delay := time.Duration(m.rng.IntN(400)) * time.Millisecond
		fates = append(fates, fmt.Sprintf("daemon SIGKILL after %v", delay))
		killedDaemon = true
		time.AfterFunc(delay, func() { d.Cmd.Process.Signal(syscall.SIGKILL) })
	}
	m.log = append(m.log, "round: "+strings.Join(fates, " | "))
	for _, c := range cmds {
		code := c.p.Wait(t, commandWait)
		errb := c.p.Stderr.String()
		// 0 done, 1 refused or failed cleanly, 130 interrupted, -1 killed.
		if code != 0 && code != 1 && code != 130 && code != -1 {
			t.Fatalf("nexus %s: exit %d: %s", strings.Join(c.args, " "), code, errb)
		}
		if code == 1 && strings.Contains(errb, "panic") {
			t.Fatalf("nexus %s panicked: %s", strings.Join(c.args, " "), errb)
		}
	}
	if killedDaemon {
		d.Wait(t, time.Minute)
		d = startDaemon(t, m.root)
	}
	m.log = append(m.log, "nexus recover")
	mustOK(t, proc(t, m.root, "recover"), "recover after the round")
	return d
}

// checkVolumes: a volume may be gone only through `volume rm`, which the
// journal then records, and no sandbox may still have it attached.
func (m *modelRun) checkVolumes() {
	t := m.t
	var vols []projections.Volume
	r := mustOK(t, proc(t, m.root, "volume", "ls", "--json"), "volume ls")
	if err := json.Unmarshal([]byte(r.stdout), &vols); err != nil {
		t.Fatal(err)
	}
	known := map[string]bool{}
	for _, v := range vols {
		known[v.Name] = true
	}
	for name := range m.volumes {
		if _, err := os.Stat(filepath.Join(m.root, "volumes", name)); err == nil {
			continue
		}
		if known[name] {
			t.Fatalf("volume %s is gone from disk but the journal still lists it", name)
		}
		for _, sb := range sandboxes(t, m.root) {
			for _, a := range sb.Volumes {
				if a.Name == name {
					t.Fatalf("volume %s was removed while %s has it attached", name, sb.ID)
				}
			}
		}
		delete(m.volumes, name)
	}
}
