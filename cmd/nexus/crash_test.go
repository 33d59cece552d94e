package main

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/nexus-sandbox/nexus/host/ext4/ext4test"
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
// after each step's events are journaled, under the overlay root (under
// the private copy, at the step it adds and at the commit), then
// checks what recover makes of it: before commit the saga is compensated
// and nothing is left; after it the sandbox exists, owns everything on
// disk, and rm removes it all. Under the overlay root the sandbox never
// owns an OS disk of its own, and the image cache entry it boots on
// survives every crash whole: read-only, its bytes the image's, and
// referenced by the sandbox exactly when the sandbox was committed.
func TestCrashAtEveryCreateStep(t *testing.T) {
	testutil.StartsSandboxes(t)
	t.Parallel()
	image := makeImage(t)
	imageSum := ext4test.SHA256(t, image)
	src := t.TempDir()
	os.WriteFile(filepath.Join(src, "f"), []byte("x"), 0o644)
	for _, mode := range []string{"overlay", "copy"} {
		steps := []string{"intents", "image-cache", "workspace-disk", "shadow.cfg", "supervisor-state", "record-dir", "commit", "retire-intents", "run-mark", "supervisor", "vmm"}
		if mode == "copy" {
			steps = slices.Insert(steps, 2, "os-disk")
		}
		commitAt := slices.Index(steps, "commit")
		cacheAt := slices.Index(steps, "image-cache")
		for i, step := range steps {
			// The private copy walks the step it adds and the commit
			// boundary here: its other steps are the overlay's, crashed
			// here under SIGKILL, and lifecycle's recover tests crash a
			// private-copy create at every step.
			if mode == "copy" && step != "os-disk" && step != "commit" {
				continue
			}
			for _, phase := range []string{":before", ""} {
				point := "create." + step + phase
				t.Run(mode+"/"+point, func(t *testing.T) {
					t.Parallel()
					root := shortRoot(t)
					if mode == "copy" {
						copyRoot(t, root)
					}
					crashAt(t, root, point, "create", "--image", image, "--handle", "crash/h", "--shadow", "cfg="+src)
					recoverClean(t, root)
					committed := i > commitAt || (i == commitAt && phase == "")
					list := sandboxes(t, root)
					if mode == "overlay" {
						cached := i > cacheAt || (i == cacheAt && phase == "")
						var users []string
						if committed && len(list) == 1 {
							users = []string{list[0].ID}
						}
						assertEntryWhole(t, root, image, imageSum, cached, users)
						assertReapAndDiffClean(t, root)
					}
					if !committed {
						assertNothingLeft(t, root)
						return
					}
					if len(list) != 1 {
						t.Fatalf("committed create: %d sandboxes after recover", len(list))
					}
					sb := list[0]
					want := []string{"disks/" + sb.ID + "-workspace.ext4", "disks/crash_h.shadow.cfg.ext4"}
					raw := "disks/" + sb.ID + ".raw"
					if mode == "copy" {
						want = append(want, raw)
					} else if _, err := os.Lstat(filepath.Join(root, raw)); err == nil || owns(sb, raw) {
						t.Fatalf("an overlay-root sandbox has an OS disk of its own: %s (owns=%v)", raw, owns(sb, raw))
					}
					for _, want := range want {
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
					if mode == "overlay" {
						assertEntryWhole(t, root, image, imageSum, true, nil)
					}
				})
			}
		}
	}
}

// assertEntryWhole checks root's image cache after a crash and recover:
// when cached, exactly one entry, read-only (0400), holding the image's
// bytes (sum), listed with users as the sandboxes booting on it, and kept
// by a prune while it has any; without cached, any entry left there (one
// prepared but not journaled) is just as whole and has no users.
func assertEntryWhole(t *testing.T, root, image, sum string, cached bool, users []string) {
	t.Helper()
	rows := cacheList(t, root)
	if len(rows) > 1 || cached && len(rows) != 1 {
		t.Fatalf("image cache entries %+v, want %s", rows, map[bool]string{true: "one", false: "at most one"}[cached])
	}
	for _, row := range rows {
		entry := filepath.Join(root, "images", row.CacheID, "disk.raw")
		fi, err := os.Stat(entry)
		if err != nil {
			t.Fatalf("listed entry %s: %v", row.CacheID, err)
		}
		if fi.Mode().Perm() != 0o400 {
			t.Errorf("entry %s has mode %o, want 400", entry, fi.Mode().Perm())
		}
		if got := ext4test.SHA256(t, entry); got != sum {
			t.Errorf("entry %s has SHA-256 %s, the image %s", entry, got, sum)
		}
		if !slices.Equal(row.Sandboxes, users) && (len(row.Sandboxes) != 0 || len(users) != 0) {
			t.Errorf("entry %s lists sandboxes %v, want %v", row.CacheID, row.Sandboxes, users)
		}
	}
	if len(users) == 0 {
		return
	}
	rep := pruneJSON(t, root, "--dry-run")
	if len(rep.Removed) != 0 || len(rep.Kept) != 1 || !strings.Contains(rep.Kept[0].Reason, users[0]) {
		t.Errorf("prune --dry-run with %v booting on the entry: %+v", users, rep)
	}
}

// assertReapAndDiffClean checks that the journal and the disk agree
// (replay diff) and that the reaper would delete nothing.
func assertReapAndDiffClean(t *testing.T, root string) {
	t.Helper()
	if r := nexus(t, root, "replay", "diff"); r.code != 0 {
		t.Fatalf("replay diff after recover: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	if rep, _ := reapRun(t, root); len(rep.Orphans) != 0 {
		t.Fatalf("reap after recover finds orphans: %+v", rep.Orphans)
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
			if strings.HasPrefix(point, "fork.os-disk") {
				copyRoot(t, root) // only a copy root has an OS disk to fork
			}
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
// every file it made. Under the overlay root the child boots on the cache
// entry and has no OS disk to copy; the os-disk step of a copy root is
// killed around too.
func TestCrashAtEveryRestoreStep(t *testing.T) {
	testutil.StartsSandboxes(t)
	t.Parallel()
	image := makeImage(t)
	steps := []string{"intents", "os-disk", "workspace-disk", "stage-restore", "supervisor-state", "record-dir", "commit", "retire-intents", "run-mark", "supervisor", "vmm"}
	commitAt := slices.Index(steps, "commit")
	for i, step := range steps {
		mode := "overlay"
		if step == "os-disk" {
			mode = "copy"
		}
		for _, phase := range []string{":before", ""} {
			point := "restore." + step + phase
			t.Run(mode+"/"+point, func(t *testing.T) {
				t.Parallel()
				root := shortRoot(t)
				if mode == "copy" {
					copyRoot(t, root)
				}
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
					want := []string{"disks/" + sb.ID + "-workspace.ext4"}
					if mode == "copy" {
						want = append(want, "disks/"+sb.ID+".raw")
					}
					for _, want := range want {
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
