package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/nexus-sandbox/nexus/internal/testutil"
)

// crashAt runs a nexus command that SIGKILLs itself at one saga step and
// asserts it died that way.
func crashAt(t *testing.T, root, point string, args ...string) {
	t.Helper()
	r := nexusEnv(t, root, []string{"NEXUS_CRASH_AT=" + point}, append([]string{"--driver", "process"}, args...)...)
	if r.code != -1 {
		t.Fatalf("%s: want death by SIGKILL, got exit %d (stderr %q)", point, r.code, r.stderr)
	}
}

// recoverClean runs recover twice: the first pass must leave nothing
// untracked, the second must find nothing left to do.
func recoverClean(t *testing.T, root string) {
	t.Helper()
	mustOK(t, proc(t, root, "recover"), "recover")
	assertClean(t, root)
	second := mustOK(t, proc(t, root, "recover", "--json"), "second recover")
	for _, field := range []string{"compensated", "resumed", "stopped", "restarted", "killed", "intents"} {
		if strings.Contains(second.stdout, `"`+field+`": [`+"\n") {
			t.Fatalf("second recover still had work (%s): %s", field, second.stdout)
		}
	}
}

func assertNothingLeft(t *testing.T, root string) {
	t.Helper()
	if list := sandboxes(t, root); len(list) != 0 {
		t.Fatalf("%d sandboxes left", len(list))
	}
	assertClean(t, root)
	for _, dir := range []string{"disks", "run", "supervisors", "sandboxes"} {
		if entries, _ := os.ReadDir(filepath.Join(root, dir)); len(entries) != 0 {
			names := []string{}
			for _, e := range entries {
				names = append(names, e.Name())
			}
			t.Fatalf("%s/ still holds %v", dir, names)
		}
	}
	if left := liveProcesses(t, root); len(left) > 0 {
		t.Fatalf("processes left: %v", left)
	}
}

// TestCrashAtEveryCreateStep kills `nexus create` right before and right
// after each step's events are journaled, then checks what recover makes of
// it: before commit the saga is compensated and nothing is left; after it
// the sandbox exists, owns everything on disk, and rm removes it all.
func TestCrashAtEveryCreateStep(t *testing.T) {
	testutil.StartsSandboxes(t)
	t.Parallel()
	image := makeImage(t)
	src := t.TempDir()
	os.WriteFile(filepath.Join(src, "f"), []byte("x"), 0o644)
	steps := []string{"intents", "image-cache", "os-disk", "workspace-disk", "shadow.cfg", "supervisor-state", "record-dir", "commit", "retire-intents", "run-mark", "supervisor", "vmm"}
	commitAt := 7
	for i, step := range steps {
		for _, phase := range []string{":before", ""} {
			point := "create." + step + phase
			t.Run(point, func(t *testing.T) {
				t.Parallel()
				root := shortRoot(t)
				crashAt(t, root, point, "create", "--image", image, "--handle", "crash/h", "--shadow", "cfg="+src)
				recoverClean(t, root)
				committed := i > commitAt || (i == commitAt && phase == "")
				list := sandboxes(t, root)
				if !committed {
					assertNothingLeft(t, root)
					return
				}
				if len(list) != 1 {
					t.Fatalf("committed create: %d sandboxes after recover", len(list))
				}
				sb := list[0]
				for _, want := range []string{"disks/" + sb.ID + ".raw", "disks/" + sb.ID + "-workspace.ext4", "disks/crash_h.shadow.cfg.ext4"} {
					if _, err := os.Stat(filepath.Join(root, want)); err != nil || !owns(sb, want) {
						t.Fatalf("committed sandbox lost %s: %v (owns=%v)", want, err, owns(sb, want))
					}
				}
				if step == "vmm" && phase == "" {
					if sb.State != "running" {
						t.Fatalf("VMM recorded before the crash, sandbox is %s", sb.State)
					}
				}
				mustOK(t, proc(t, root, "rm", "-f", "--with-snapshots", sb.ID), "rm")
				assertNothingLeft(t, root)
			})
		}
	}
}

func TestCrashAtEveryRemoveStep(t *testing.T) {
	testutil.StartsSandboxes(t)
	t.Parallel()
	image := makeImage(t)
	for _, step := range []string{"vmm-stop", "supervisor-stop", "reclaim", "remove"} {
		for _, phase := range []string{":before", ""} {
			point := "rm." + step + phase
			t.Run(point, func(t *testing.T) {
				t.Parallel()
				root := shortRoot(t)
				sb := createJSON(t, root, "--image", image)
				crashAt(t, root, point, "rm", "-f", "--with-snapshots", sb.ID)
				recoverClean(t, root)
				assertNothingLeft(t, root)
			})
		}
	}
}

func TestCrashDuringFork(t *testing.T) {
	testutil.StartsSandboxes(t)
	t.Parallel()
	image := makeImage(t)
	for _, point := range []string{"fork.os-disk:before", "fork.workspace-disk", "fork.commit:before", "fork.commit", "fork.vmm:before"} {
		t.Run(point, func(t *testing.T) {
			t.Parallel()
			root := shortRoot(t)
			parent := createJSON(t, root, "--image", image)
			// Three children, copied concurrently: the others are mid-flight
			// at any step of the first, and recover must settle them all.
			crashAt(t, root, point, "fork", parent.ID, "--count", "3")
			recoverClean(t, root)
			list := sandboxes(t, root)
			var parentState string
			for _, sb := range list {
				if sb.ID == parent.ID {
					parentState = string(sb.State)
				}
			}
			if parentState != "running" {
				t.Fatalf("parent is %q after a crashed fork and recover (a paused VM must be resumed)", parentState)
			}
			for _, sb := range list {
				mustOK(t, proc(t, root, "rm", "-f", "--with-snapshots", sb.ID), "rm")
			}
			assertNothingLeft(t, root)
		})
	}
}

// TestCrashDuringSnapshot kills `nexus snapshot` around its one step. A
// capture never journaled is compensated (its directory removed, the paused
// VM resumed); a journaled one is a snapshot that restores.
func TestCrashDuringSnapshot(t *testing.T) {
	testutil.StartsSandboxes(t)
	t.Parallel()
	image := makeImage(t)
	for _, point := range []string{"snapshot.capture:before", "snapshot.capture"} {
		t.Run(point, func(t *testing.T) {
			t.Parallel()
			root := shortRoot(t)
			sb := createJSON(t, root, "--image", image)
			crashAt(t, root, point, "snapshot", sb.ID)
			recoverClean(t, root)
			list := sandboxes(t, root)
			if len(list) != 1 || list[0].State != "running" {
				t.Fatalf("after a crashed snapshot and recover: %+v (the paused VM must be resumed)", list)
			}
			journaled := !strings.HasSuffix(point, ":before")
			if got := len(list[0].Snapshots); got != map[bool]int{true: 1, false: 0}[journaled] {
				t.Fatalf("%d snapshots recorded", got)
			}
			entries, _ := os.ReadDir(filepath.Join(root, "snapshots", sb.ID))
			if journaled != (len(entries) == 1) {
				t.Fatalf("snapshots/%s holds %d entries, journaled=%v", sb.ID, len(entries), journaled)
			}
			if journaled {
				mustOK(t, proc(t, root, "restore", list[0].Snapshots[0]), "restore the crashed-after snapshot")
			}
			for _, s := range sandboxes(t, root) {
				mustOK(t, proc(t, root, "rm", "-f", "--with-snapshots", s.ID), "rm")
			}
			assertNothingLeft(t, root)
		})
	}
}

// TestCrashAtEveryRestoreStep kills `nexus restore` before and after each
// step of its fork-path saga. Before commit the child is compensated and
// only the source remains; after it the restored child exists and owns
// every file it made.
func TestCrashAtEveryRestoreStep(t *testing.T) {
	testutil.StartsSandboxes(t)
	t.Parallel()
	image := makeImage(t)
	steps := []string{"intents", "os-disk", "workspace-disk", "stage-restore", "supervisor-state", "record-dir", "commit", "retire-intents", "run-mark", "supervisor", "vmm"}
	commitAt := 6
	for i, step := range steps {
		for _, phase := range []string{":before", ""} {
			point := "restore." + step + phase
			t.Run(point, func(t *testing.T) {
				t.Parallel()
				root := shortRoot(t)
				src := createJSON(t, root, "--image", image)
				snap := strings.TrimSpace(mustOK(t, proc(t, root, "snapshot", src.ID), "snapshot").stdout)
				crashAt(t, root, point, "restore", snap)
				recoverClean(t, root)
				list := sandboxes(t, root)
				committed := i > commitAt || (i == commitAt && phase == "")
				if want := map[bool]int{true: 2, false: 1}[committed]; len(list) != want {
					t.Fatalf("%d sandboxes after recover, want %d", len(list), want)
				}
				for _, sb := range list {
					if sb.ID == src.ID {
						continue
					}
					if sb.Parent != src.ID {
						t.Fatalf("restored child's parent = %q", sb.Parent)
					}
					for _, want := range []string{"disks/" + sb.ID + ".raw", "disks/" + sb.ID + "-workspace.ext4"} {
						if _, err := os.Stat(filepath.Join(root, want)); err != nil || !owns(sb, want) {
							t.Fatalf("restored child lost %s: %v (owns=%v)", want, err, owns(sb, want))
						}
					}
				}
				for _, sb := range list {
					mustOK(t, proc(t, root, "rm", "-f", "--with-snapshots", sb.ID), "rm")
				}
				assertNothingLeft(t, root)
			})
		}
	}
}
