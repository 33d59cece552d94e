package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/nexus-sandbox/nexus/internal/testutil"
)

// A running sandbox's snapshot is journaled only once nexus itself has
// fsynced every file of its directory, the directory and the directory's
// parent: the VMM does not sync them (Cloud Hypervisor writes them and
// never syncs; the stand-in, like it, does not either), so without nexus's
// sync a power loss could keep a journaled snapshot whose memory reads
// back as zeros.
//
// No power cut is available, so the observable is the kernel's own record
// of the system calls: the snapshot command runs under strace (no daemon:
// the journal's appends are made by the traced process), which names each
// fsync's file (-y) and shows the journal's write carrying snapshot.taken.
// Every file of the snapshot directory must have an fsync of its own path
// before that write.
func TestSnapshotIsDurableBeforeItIsJournaled(t *testing.T) {
	testutil.StartsSandboxes(t)
	strace, err := exec.LookPath("strace")
	if err != nil {
		if os.Getenv("NEXUS_REQUIRE_QEMU") == "1" {
			t.Fatal("strace is not installed: make setup-test installs it")
		}
		t.Skip("strace is not installed: make setup-test installs it")
	}
	root := shortRoot(t)
	noDaemon := []string{"NEXUS_NO_AUTO_DAEMON=1"}
	r := mustOK(t, nexusEnv(t, root, noDaemon, "--driver", "process", "create", "-q", "--image", makeImage(t)), "create")
	id := strings.TrimSpace(r.stdout)

	trace := filepath.Join(t.TempDir(), "strace.log")
	cmd := exec.Command(strace, "-f", "-y", "-qq", "-s", "65536", "-o", trace,
		"-e", "trace=fsync,fdatasync,write,pwrite64,writev,pwritev,pwritev2",
		nexusBin, "--state-dir", root, "--driver", "process", "snapshot", id)
	cmd.Env = append(os.Environ(), "NEXUS_STATE_DIR=", "NEXUS_NO_AUTO_DAEMON=1")
	p := testutil.Run(t, cmd, commandWait)
	if code := p.Cmd.ProcessState.ExitCode(); code != 0 {
		t.Fatalf("snapshot under strace: exit %d: %s", code, p.Stderr.String())
	}
	snap := strings.TrimSpace(p.Stdout.String())
	dir := filepath.Join(root, "snapshots", id, snap)
	data, err := os.ReadFile(trace)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(string(data), "\n")
	journaled := -1
	for i, l := range lines {
		if strings.Contains(l, "<"+filepath.Join(root, "journal")) && strings.Contains(l, "snapshot.taken."+id) {
			journaled = i
			break
		}
	}
	if journaled < 0 {
		t.Fatalf("no journal write carrying snapshot.taken in the trace (%d lines)", len(lines))
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{dir, filepath.Dir(dir)}
	for _, e := range entries {
		want = append(want, filepath.Join(dir, e.Name()))
	}
	for _, name := range []string{"config.json", "state.json", "memory-ranges"} {
		if !exists(filepath.Join(dir, name)) {
			t.Fatalf("the snapshot of a running sandbox has no %s", name)
		}
	}
	for _, path := range want {
		synced := false
		for i, l := range lines[:journaled] {
			if !strings.Contains(l, " fsync(") && !strings.Contains(l, " fdatasync(") {
				continue
			}
			if strings.Contains(l, "<"+path+">) = 0") {
				synced = true
				break
			}
			// On a busy machine strace splits a call another thread
			// interrupts: "<unfinished ...>", then "<... fsync resumed>"
			// on a later line of the same pid, which must come first too.
			if pid, _, _ := strings.Cut(l, " "); strings.Contains(l, "<"+path+"> <unfinished ...>") {
				for _, r := range lines[i+1 : journaled] {
					if strings.HasPrefix(r, pid+" <... f") && strings.Contains(r, "sync resumed>) = 0") {
						synced = true
						break
					}
				}
			}
			if synced {
				break
			}
		}
		if !synced {
			t.Errorf("%s was not fsynced by nexus before snapshot.taken was journaled", path)
		}
	}
}
