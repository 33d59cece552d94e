package main

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/nexus-sandbox/nexus/internal/testutil"
)

// A sandbox's supervisor and VMM run from nexus-shim, the small binary
// beside the CLI, not from nexusd.
func TestSandboxProcessesRunFromTheShim(t *testing.T) {
	testutil.StartsSandboxes(t)
	t.Parallel()
	root := shortRoot(t)
	sb := createJSON(t, root, "--image", makeImage(t))
	shim := filepath.Join(filepath.Dir(nexusBin), "nexus-shim")
	seen := map[string]bool{}
	for _, p := range testutil.ProcessesUnder(root) {
		for _, role := range []string{" supervisor --sandbox " + sb.ID, " vmm-process --api-socket "} {
			if p.Zombie || !strings.Contains(p.Cmdline, role) {
				continue
			}
			seen[role] = true
			if exe, err := os.Readlink(filepath.Join("/proc", strconv.Itoa(p.Pid), "exe")); err != nil || exe != shim {
				t.Errorf("%s runs %s (%v), want %s", p.Cmdline, exe, err, shim)
			}
		}
	}
	if len(seen) != 2 {
		t.Fatalf("want the sandbox's supervisor and VMM running, saw %v among %+v", seen, testutil.ProcessesUnder(root))
	}
	mustOK(t, proc(t, root, "rm", "-f", sb.ID), "rm")
}

// A supervisor SIGKILLed as it starts fails the create at once, in one
// line that says so and quotes what it wrote to its log; nothing of it is
// left running.
func TestShimKilledAtStartupFailsTheCreateClearly(t *testing.T) {
	testutil.StartsSandboxes(t)
	t.Parallel()
	root := shortRoot(t)
	shim := filepath.Join(t.TempDir(), "nexus-shim")
	testutil.WriteExecutable(t, shim, []byte("#!/bin/sh\necho 'shim starting' >&2\nkill -9 $$\n"))
	r := nexusEnv(t, root, []string{ShimEnv + "=" + shim}, "--driver", "process", "create", "--image", makeImage(t))
	wantFailure(t, r, 1, "supervisor exited before answering (signal: killed)")
	for _, want := range []string{"shim starting", ".supervisor.log"} {
		if !strings.Contains(r.stderr, want) {
			t.Errorf("the error does not quote the supervisor's log (%q): %s", want, r.stderr)
		}
	}
	if live := liveProcesses(t, root); len(live) > 0 {
		for _, p := range live {
			if !strings.Contains(p, " daemon") {
				t.Fatalf("left running: %v", live)
			}
		}
	}
}
