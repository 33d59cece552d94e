package main

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/nexus-sandbox/nexus/config"
	"github.com/nexus-sandbox/nexus/host/ext4"
	"github.com/nexus-sandbox/nexus/host/ext4/ext4test"
	"github.com/nexus-sandbox/nexus/internal/testutil"
	"github.com/nexus-sandbox/nexus/projections"
)

const (
	markerText = "the marker file, written first\n"
	secondText = "a second saved file\n"
)

// overlayRoot is a state root whose config makes new overlays 64 MiB, so
// filling one with real ext4 blocks stays quick.
func overlayRoot(t *testing.T, mib int) string {
	t.Helper()
	root := shortRoot(t)
	writeConfig(t, root, mib)
	return root
}

func writeConfig(t testing.TB, root string, mib int) {
	t.Helper()
	cfg := "[vm]\noverlay_disk_mib = " + itoa(mib) + "\n"
	if err := os.WriteFile(filepath.Join(root, "config.toml"), []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
}

func itoa(n int) string { b, _ := json.Marshal(n); return string(b) }

func overlayOf(root, id string) string { return filepath.Join(root, "disks", id+"-workspace.ext4") }

// stoppedWithFiles creates a sandbox, stops it (the guest flush is
// acknowledged unless breakFlush), then, as the guest would have, writes
// the marker and the second file into its overlay and fills it until no
// usable block is left. It returns the sandbox and the filler's size.
func stoppedWithFiles(t *testing.T, root string, breakFlush, fill bool) (jsonSandbox, int64) {
	t.Helper()
	sb := createJSON(t, root, "--image", makeImage(t))
	if breakFlush {
		// The guest agent's socket is gone: the flush cannot be confirmed.
		os.Remove(filepath.Join(root, "run", "sb-"+sb.ID+".vsock"))
	}
	mustOK(t, proc(t, root, "stop", sb.ID), "stop")
	acks := strings.Count(nexus(t, root, "events", "--type", "flush.acknowledged", "--sandbox", sb.ID).stdout, "\n")
	if want := map[bool]int{false: 1, true: 0}[breakFlush]; acks != want {
		t.Fatalf("flush acknowledgements after stop: %d, want %d", acks, want)
	}
	img := overlayOf(root, sb.ID)
	ext4test.Write(t, img, "marker", []byte(markerText))
	ext4test.Write(t, img, "second", []byte(secondText))
	var size int64
	if fill {
		size = ext4test.Fill(t, img, "fill")
		c, err := ext4.CheckImage(context.Background(), img)
		if err != nil || c.UsableBytes() > 64*c.BlockSize {
			t.Fatalf("overlay not full after filling: %+v %v", c, err)
		}
	}
	return sb, size
}

func assertFilesIntact(t *testing.T, img string, fillSize int64) {
	t.Helper()
	ctx := context.Background()
	for name, want := range map[string]string{"/marker": markerText, "/second": secondText} {
		got, err := ext4.ReadFile(ctx, img, name)
		if err != nil || string(got) != want {
			t.Fatalf("%s in %s: %q, %v; want %q", name, img, got, err, want)
		}
	}
	if fillSize > 0 {
		if got, err := ext4.FileSize(ctx, img, "/fill"); err != nil || got != fillSize {
			t.Fatalf("filler is %d bytes (%v), want %d", got, err, fillSize)
		}
	}
	if c, err := ext4.CheckImage(ctx, img); err != nil || !c.Clean {
		t.Fatalf("overlay after recovery is not clean: %+v %v", c, err)
	}
}

func inspect(t *testing.T, root, id string) jsonSandbox {
	t.Helper()
	return inspectJSON(t, root, id)
}

func fileSize(t *testing.T, path string) int64 {
	t.Helper()
	info, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	return info.Size()
}

// assertRefused checks a refused start: exit 1 naming the cause, the image
// byte-for-byte as before, Error with Ready=False and the reason, shown by
// inspect (human and JSON) and by events.
func assertRefused(t *testing.T, root, id, sum, reason, mention string) {
	t.Helper()
	wantFailure(t, proc(t, root, "start", id), 1, mention)
	if got := ext4test.SHA256(t, overlayOf(root, id)); got != sum {
		t.Fatal("a refused start changed the overlay")
	}
	sb := inspect(t, root, id)
	if sb.State != projections.StateError || len(sb.Conditions) != 1 || sb.Conditions[0].Type != "Ready" ||
		sb.Conditions[0].Status != "False" || sb.Conditions[0].Reason != reason {
		t.Fatalf("after refusal: state %s conditions %+v", sb.State, sb.Conditions)
	}
	if human := mustOK(t, nexus(t, root, "inspect", id), "inspect").stdout; !strings.Contains(human, "Ready=False reason="+reason) {
		t.Fatalf("inspect does not show the condition:\n%s", human)
	}
	if ev := nexus(t, root, "events", "--type", "sandbox.failed", "--sandbox", id).stdout; !strings.Contains(ev, reason) {
		t.Fatalf("events do not show the failure: %q", ev)
	}
	if entries, _ := filepath.Glob(filepath.Join(root, "disks", "*staging*")); len(entries) != 0 {
		t.Fatalf("refusal left the private copy: %v", entries)
	}
	assertClean(t, root)
	if left := liveProcesses(t, root); len(left) > 0 {
		t.Fatalf("a refused start left processes: %v", left)
	}
}

// A full overlay whose last run was acknowledged is
// recovered before boot: files intact, filler the same size, image grown,
// warning emitted; a later start keeps the larger overlay.
func TestFullOverlayIsRecoveredOnStart(t *testing.T) {
	testutil.StartsSandboxes(t)
	t.Parallel()
	root := overlayRoot(t, 64)
	sb, fillSize := stoppedWithFiles(t, root, false, true)
	img := overlayOf(root, sb.ID)
	before := fileSize(t, img)
	started := mustOK(t, proc(t, root, "start", sb.ID, "--json"), "start")
	if !strings.Contains(started.stdout, `"state": "running"`) {
		t.Fatalf("start: %s", started.stdout)
	}
	grown := fileSize(t, img)
	if grown < before+64<<20 {
		t.Fatalf("overlay %d -> %d bytes: want growth of at least 64 MiB", before, grown)
	}
	assertFilesIntact(t, img, fillSize)
	warn := nexus(t, root, "events", "--type", "warning.raised", "--sandbox", sb.ID).stdout
	if !strings.Contains(warn, `"reason":"OverlayDiskFull"`) || !strings.Contains(warn, "grew by") || !strings.Contains(warn, "overlay_disk_mib") {
		t.Fatalf("warning event: %q", warn)
	}
	if rec := nexus(t, root, "events", "--type", "overlay.recovered", "--json").stdout; strings.Count(rec, "\n") != 1 {
		t.Fatalf("want one overlay.recovered event: %q", rec)
	}
	assertClean(t, root)
	// Stopped and started again: the larger overlay is kept, not redone.
	mustOK(t, proc(t, root, "stop", sb.ID), "stop")
	mustOK(t, proc(t, root, "start", sb.ID), "second start")
	if got := fileSize(t, img); got != grown {
		t.Fatalf("second start changed the overlay size %d -> %d", grown, got)
	}
	if rec := nexus(t, root, "events", "--type", "overlay.recovered").stdout; strings.Count(rec, "\n") != 1 {
		t.Fatalf("a roomy overlay was recovered again: %q", rec)
	}
	mustOK(t, proc(t, root, "rm", "-f", "--with-snapshots", sb.ID), "rm")
	assertNothingLeft(t, root)
}

// The same without a flush acknowledgement: refused, and the
// image is unchanged (SHA-256).
func TestUnacknowledgedOverlayIsRefused(t *testing.T) {
	testutil.StartsSandboxes(t)
	t.Parallel()
	root := overlayRoot(t, 64)
	sb, _ := stoppedWithFiles(t, root, true, true)
	sum := ext4test.SHA256(t, overlayOf(root, sb.ID))
	assertRefused(t, root, sb.ID, sum, "OverlayDiskFull", "no flush acknowledgement")
	// A dirty journal on top changes nothing: still refused, untouched.
	ext4test.DirtyJournal(t, overlayOf(root, sb.ID), 60000, make([]byte, 1024))
	assertRefused(t, root, sb.ID, ext4test.SHA256(t, overlayOf(root, sb.ID)), "OverlayDiskFull", "OverlayDiskFull")
}

// An unattached inode needs an interactive fsck (connect to
// lost+found): refused, unchanged, whether the overlay is full or not.
func TestOverlayNeedingInteractiveRepairIsRefused(t *testing.T) {
	testutil.StartsSandboxes(t)
	t.Parallel()
	for _, full := range []bool{true, false} {
		t.Run(map[bool]string{true: "full", false: "roomy"}[full], func(t *testing.T) {
			t.Parallel()
			root := overlayRoot(t, 64)
			sb, _ := stoppedWithFiles(t, root, false, full)
			ext4test.Unattach(t, overlayOf(root, sb.ID))
			sum := ext4test.SHA256(t, overlayOf(root, sb.ID))
			assertRefused(t, root, sb.ID, sum, "OverlayDiskFull", "interactive")
		})
	}
}

// The superblock magic is damaged: refused as not ext4,
// unchanged, including by the read-only check itself.
func TestOverlayWithBadMagicIsRefused(t *testing.T) {
	testutil.StartsSandboxes(t)
	t.Parallel()
	root := overlayRoot(t, 64)
	sb, _ := stoppedWithFiles(t, root, false, false)
	img := overlayOf(root, sb.ID)
	ext4test.CorruptMagic(t, img)
	sum := ext4test.SHA256(t, img)
	if _, err := ext4.CheckImage(context.Background(), img); err == nil {
		t.Fatal("read-only check accepted a bad magic")
	}
	if ext4test.SHA256(t, img) != sum {
		t.Fatal("the read-only check changed the image")
	}
	assertRefused(t, root, sb.ID, sum, "ProvisioningFailed", "not ext4")
}

// A saved 64 MiB overlay restarted after the default was
// raised to 128 MiB is preserved and readable; only new sandboxes get 128.
func TestSmallerSavedOverlayIsPreservedAfterRaisingDefault(t *testing.T) {
	testutil.StartsSandboxes(t)
	t.Parallel()
	root := overlayRoot(t, 64)
	sb, _ := stoppedWithFiles(t, root, false, false)
	img := overlayOf(root, sb.ID)
	sum := ext4test.SHA256(t, img)
	writeConfig(t, root, 128)
	mustOK(t, proc(t, root, "start", sb.ID), "start")
	if got := fileSize(t, img); got != 64<<20 {
		t.Fatalf("saved overlay is %d bytes, want 64 MiB kept", got)
	}
	if ext4test.SHA256(t, img) != sum {
		t.Fatal("a roomy, acknowledged overlay was rewritten on start")
	}
	assertFilesIntact(t, img, 0)
	fresh := createJSON(t, root, "--image", makeImage(t))
	if got := fileSize(t, overlayOf(root, fresh.ID)); got != 128<<20 {
		t.Fatalf("new sandbox overlay %d bytes, want 128 MiB", got)
	}
}

// The overlay-published event is lost (the process dies
// after the rename and directory fsync, before the event): the next start
// reads the published image, with every saved file.
func TestPublishedOverlaySurvivesLostEvent(t *testing.T) {
	testutil.StartsSandboxes(t)
	t.Parallel()
	root := overlayRoot(t, 64)
	sb, fillSize := stoppedWithFiles(t, root, false, true)
	img := overlayOf(root, sb.ID)
	before := fileSize(t, img)
	crashAt(t, root, "start.overlay-publish:before", "start", sb.ID)
	if rec := nexus(t, root, "events", "--type", "overlay.recovered").stdout; rec != "" {
		t.Fatalf("the event was written before the crash: %q", rec)
	}
	if fileSize(t, img) <= before {
		t.Fatal("the crash point is after the rename: the published overlay must be in place")
	}
	mustOK(t, proc(t, root, "start", sb.ID), "start after the lost event")
	assertFilesIntact(t, img, fillSize)
	assertClean(t, root)
	recoverClean(t, root)
}

// TestCrashAtEveryOverlayStep: SIGKILL before and after each step's events,
// then start again: recovered with every saved file intact (the overlay is
// full and acknowledged, so recovery is always possible), and nothing left
// untracked.
func TestCrashAtEveryOverlayStep(t *testing.T) {
	testutil.StartsSandboxes(t)
	t.Parallel()
	for _, step := range []string{"overlay-check", "overlay-copy", "overlay-repair", "overlay-grow", "overlay-publish", "run-mark"} {
		for _, phase := range []string{":before", ""} {
			point := "start." + step + phase
			t.Run(point, func(t *testing.T) {
				t.Parallel()
				root := overlayRoot(t, 64)
				sb, fillSize := stoppedWithFiles(t, root, false, true)
				img := overlayOf(root, sb.ID)
				sum := ext4test.SHA256(t, img)
				crashAt(t, root, point, "start", sb.ID)
				if step != "overlay-publish" && step != "run-mark" && ext4test.SHA256(t, img) != sum {
					t.Fatalf("crash at %s changed the original overlay", point)
				}
				r := proc(t, root, "start", sb.ID)
				// After run-mark the run is unacknowledged, but the overlay
				// was published roomy and clean: it boots untouched.
				mustOK(t, r, "start after "+point)
				assertFilesIntact(t, img, fillSize)
				if fileSize(t, img) < 128<<20 {
					t.Fatalf("overlay not grown after %s: %d", point, fileSize(t, img))
				}
				assertClean(t, root)
				recoverClean(t, root)
			})
		}
	}
}

// A full overlay whose journal needs recovery, acknowledged: the journal
// is replayed on the copy, never on the original, and the files survive.
func TestAcknowledgedDirtyFullOverlayIsReplayedOnACopy(t *testing.T) {
	testutil.StartsSandboxes(t)
	t.Parallel()
	root := overlayRoot(t, 64)
	sb, fillSize := stoppedWithFiles(t, root, false, true)
	img := overlayOf(root, sb.ID)
	c, _ := ext4.CheckImage(context.Background(), img)
	ext4test.DirtyJournal(t, img, c.Blocks-2, make([]byte, c.BlockSize))
	mustOK(t, proc(t, root, "start", sb.ID), "start")
	assertFilesIntact(t, img, fillSize)
	if rec := nexus(t, root, "events", "--type", "overlay.recovered").stdout; !strings.Contains(rec, `"replayed":true`) {
		t.Fatalf("recovery does not say it replayed the journal: %q", rec)
	}
}

// A published overlay that went missing is refused, never recreated empty.
func TestMissingOverlayIsNeverRecreated(t *testing.T) {
	testutil.StartsSandboxes(t)
	t.Parallel()
	root := overlayRoot(t, 64)
	sb, _ := stoppedWithFiles(t, root, false, false)
	img := overlayOf(root, sb.ID)
	os.Remove(img)
	wantFailure(t, proc(t, root, "start", sb.ID), 1, "missing")
	if _, err := os.Lstat(img); !os.IsNotExist(err) {
		t.Fatal("start recreated the missing overlay")
	}
	if s := inspect(t, root, sb.ID); s.State != projections.StateError || s.Conditions[0].Reason != "OverlayDiskFull" {
		t.Fatalf("after refusal: %+v", s)
	}
}

// Usage is reported before the overlay needs recovery, at the configured
// fill ratio.
func TestOverlayUsageWarningAtFillRatio(t *testing.T) {
	testutil.StartsSandboxes(t)
	t.Parallel()
	root := shortRoot(t)
	os.WriteFile(filepath.Join(root, "config.toml"), []byte("[vm]\noverlay_disk_mib = 64\noverlay_warn_fill_ratio = 0.5\n"), 0o600)
	sb, _ := stoppedWithFiles(t, root, false, false)
	ext4test.Write(t, overlayOf(root, sb.ID), "half", []byte(strings.Repeat("h", 40<<20)))
	mustOK(t, proc(t, root, "start", sb.ID), "start")
	warn := nexus(t, root, "events", "--type", "warning.raised", "--sandbox", sb.ID).stdout
	if !strings.Contains(warn, "OverlayNearlyFull") || !strings.Contains(warn, "threshold 50%") {
		t.Fatalf("usage warning: %q", warn)
	}
}

// A spawn that fails before any VM exists restores the previous run marker
// and acknowledgement durably: the overlay stays startable, unchanged.
func TestSpawnFailureRestoresRunMarker(t *testing.T) {
	testutil.StartsSandboxes(t)
	t.Parallel()
	root := overlayRoot(t, 64)
	bin := t.TempDir()
	fake := filepath.Join(bin, "cloud-hypervisor")
	good := []byte("#!/bin/sh\nexec " + nexusBin + " vmm-process \"$@\"\n")
	testutil.WriteExecutable(t, fake, good)
	kernel := filepath.Join(bin, "vmlinux")
	os.WriteFile(kernel, []byte("not really a kernel"), 0o600)
	env := []string{"NEXUS_CH_BINARY=" + fake, "NEXUS_KERNEL_PATH=" + kernel}
	ch := func(args ...string) result {
		return nexusEnv(t, root, env, append([]string{"--driver", "cloud-hypervisor"}, args...)...)
	}
	r := mustOK(t, ch("create", "--image", makeImage(t), "--json"), "create")
	var sb jsonSandbox
	json.Unmarshal([]byte(r.stdout), &sb)
	mustOK(t, ch("stop", sb.ID), "stop")
	acked := inspect(t, root, sb.ID)
	if acked.LastRun == "" || acked.FlushedRun != acked.LastRun {
		t.Fatalf("after stop: run %q flushed %q", acked.LastRun, acked.FlushedRun)
	}
	sum := ext4test.SHA256(t, overlayOf(root, sb.ID))
	// The binary is there and executable, but exec fails: no VM can exist.
	testutil.WriteExecutable(t, fake, []byte("#!/nonexistent/interpreter\n"))
	if r := ch("start", sb.ID); r.code != 1 || !strings.Contains(r.stderr, "spawn VMM") {
		t.Fatalf("start with a broken VMM binary: %+v", r)
	}
	after := inspect(t, root, sb.ID)
	if after.LastRun != acked.LastRun || after.FlushedRun != acked.FlushedRun {
		t.Fatalf("run marker not restored: was %q/%q, now %q/%q", acked.LastRun, acked.FlushedRun, after.LastRun, after.FlushedRun)
	}
	if ev := nexus(t, root, "events", "--type", "flush.restored", "--sandbox", sb.ID).stdout; strings.Count(ev, "\n") != 1 {
		t.Fatalf("want one journaled flush.restored: %q", ev)
	}
	if ext4test.SHA256(t, overlayOf(root, sb.ID)) != sum {
		t.Fatal("a failed spawn changed the overlay")
	}
	testutil.WriteExecutable(t, fake, good)
	mustOK(t, ch("start", sb.ID), "start once the VMM binary works again")
	mustOK(t, ch("rm", "-f", "--with-snapshots", sb.ID), "rm")
	assertNothingLeft(t, root)
}

func TestMissingToolIsLegibleAtStart(t *testing.T) {
	testutil.StartsSandboxes(t)
	t.Parallel()
	root := overlayRoot(t, 64)
	sb, _ := stoppedWithFiles(t, root, false, false)
	dir := t.TempDir()
	for _, tool := range []string{"e2fsck", "mkfs.ext4", "debugfs", "dumpe2fs"} {
		p, _ := ext4.Lookup(tool)
		os.Symlink(p, filepath.Join(dir, tool))
	}
	r := nexusEnv(t, root, []string{ext4.PathEnv + "=" + dir}, "--driver", "process", "start", sb.ID)
	wantFailure(t, r, 1, "resize2fs not found")
	if s := inspect(t, root, sb.ID); s.State != projections.StateStopped {
		t.Fatalf("a preflight refusal changed the state: %s", s.State)
	}
}

func TestBadConfigIsRefused(t *testing.T) {
	t.Parallel()
	root := shortRoot(t)
	os.WriteFile(filepath.Join(root, "config.toml"), []byte("[vm]\noverlay_disk_mb = 64\n"), 0o600)
	wantFailure(t, proc(t, root, "create", "--image", makeImage(t)), 1, "unknown key vm.overlay_disk_mb")
	os.WriteFile(filepath.Join(root, "config.toml"), []byte("[vm]\noverlay_warn_fill_ratio = 2\n"), 0o600)
	wantFailure(t, proc(t, root, "create", "--image", makeImage(t)), 1, "overlay_warn_fill_ratio")
	wantFailure(t, proc(t, root, "config", "show"), 1, "overlay_warn_fill_ratio")
	os.WriteFile(filepath.Join(root, "config.toml"), []byte("[vm]\ninitramfs = \"initrd.gz\"\n"), 0o600)
	wantFailure(t, proc(t, root, "create", "--image", makeImage(t)), 1, "want an absolute path")
}

// A config file nexus cannot use refuses only the commands that read its
// settings (create, start, and fork, whose children of a stopped parent
// boot cold with the boot assets); stop, snapshot, rm and recover go on,
// since the file only shapes new overlays, start's check and cold boots.
func TestBadConfigBlocksOnlyItsReaders(t *testing.T) {
	testutil.StartsSandboxes(t)
	t.Parallel()
	root := shortRoot(t)
	sb := createJSON(t, root, "--image", makeImage(t))
	os.WriteFile(filepath.Join(root, "config.toml"), []byte("[vm]\noverlay_disk_mb = 64\n"), 0o600)
	stopDaemons(root) // the next command starts a daemon under the broken file
	mustOK(t, proc(t, root, "stop", sb.ID), "stop under a broken config")
	mustOK(t, nexus(t, root, "daemon", "status"), "a daemon started under a broken config")
	wantFailure(t, proc(t, root, "start", sb.ID), 1, "unknown key vm.overlay_disk_mb")
	wantFailure(t, proc(t, root, "fork", sb.ID), 1, "unknown key vm.overlay_disk_mb")
	mustOK(t, proc(t, root, "snapshot", sb.ID), "snapshot under a broken config")
	mustOK(t, proc(t, root, "recover"), "recover under a broken config")
	mustOK(t, proc(t, root, "rm", "--with-snapshots", sb.ID), "rm under a broken config")
	if n := len(sandboxes(t, root)); n != 0 {
		t.Fatalf("rm under a broken config left %d sandboxes", n)
	}
}

// config show names each setting's value and source: the file for what it
// sets, the environment, the flag, and defaults for the rest.
func TestConfigShowNamesSources(t *testing.T) {
	t.Parallel()
	root := shortRoot(t)
	os.WriteFile(filepath.Join(root, "config.toml"), []byte("[vm]\noverlay_disk_mib = 64\ninitramfs = \"/x.cpio\"\ncmdline = \"console=ttyS0 quiet\"\n"), 0o600)
	r := mustOK(t, nexusEnv(t, root, []string{"NEXUS_LOG_LEVEL=debug", "NEXUS_INITRAMFS_PATH=/boot/initrd.nexus"}, "--driver", "process", "config", "show", "--json"), "config show")
	var list []config.Setting
	if err := json.Unmarshal([]byte(r.stdout), &list); err != nil {
		t.Fatalf("config show --json: %v\n%s", err, r.stdout)
	}
	got := map[string]config.Setting{}
	for _, s := range list {
		got[s.Name] = s
	}
	want := map[string]config.Setting{
		"vm.overlay_disk_mib":        {Name: "vm.overlay_disk_mib", Value: "64", Source: "file " + filepath.Join(root, "config.toml")},
		"vm.overlay_warn_fill_ratio": {Name: "vm.overlay_warn_fill_ratio", Value: "0.9", Source: "default"},
		"vm.initramfs":               {Name: "vm.initramfs", Value: "/boot/initrd.nexus", Source: "env NEXUS_INITRAMFS_PATH"},
		"vm.cmdline":                 {Name: "vm.cmdline", Value: "console=ttyS0 quiet", Source: "file " + filepath.Join(root, "config.toml")},
		"driver":                     {Name: "driver", Value: "process", Source: "flag --driver"},
		"log_level":                  {Name: "log_level", Value: "debug", Source: "env NEXUS_LOG_LEVEL"},
	}
	for name, w := range want {
		if got[name] != w {
			t.Errorf("%s: got %+v, want %+v", name, got[name], w)
		}
	}
}

// The same loss without a crash: writing the overlay-published event fails
// after the rename and directory fsync. The start fails, and the next start
// reads the published image with every saved file.
func TestPublishEventWriteFailureKeepsPublishedImage(t *testing.T) {
	testutil.StartsSandboxes(t)
	t.Parallel()
	root := overlayRoot(t, 64)
	sb, fillSize := stoppedWithFiles(t, root, false, true)
	img := overlayOf(root, sb.ID)
	before := fileSize(t, img)
	r := nexusEnv(t, root, []string{"NEXUS_FAIL_APPEND=overlay.recovered"}, "--driver", "process", "start", sb.ID)
	wantFailure(t, r, 1, "injected failure")
	if fileSize(t, img) <= before {
		t.Fatal("the published (grown) overlay is not in place after the failed event")
	}
	assertFilesIntact(t, img, fillSize)
	mustOK(t, proc(t, root, "start", sb.ID), "start after the failed event")
	assertFilesIntact(t, img, fillSize)
	assertClean(t, root)
	recoverClean(t, root)
}

// Killed while holding a private copy, then `nexus recover` (not start):
// the copy is dropped and released in the journal, the original is
// byte-for-byte the same, and a start then recovers it.
func TestRecoverDropsAnInterruptedCopy(t *testing.T) {
	testutil.StartsSandboxes(t)
	t.Parallel()
	for _, point := range []string{"start.overlay-copy", "start.overlay-grow"} {
		t.Run(point, func(t *testing.T) {
			t.Parallel()
			root := overlayRoot(t, 64)
			sb, fillSize := stoppedWithFiles(t, root, false, true)
			img := overlayOf(root, sb.ID)
			sum := ext4test.SHA256(t, img)
			crashAt(t, root, point, "start", sb.ID)
			recoverClean(t, root)
			if _, err := os.Lstat(filepath.Join(root, "disks", sb.ID+".overlay-staging.ext4")); !os.IsNotExist(err) {
				t.Fatalf("recover left the private copy: %v", err)
			}
			if ext4test.SHA256(t, img) != sum {
				t.Fatal("recover changed the original overlay")
			}
			mustOK(t, proc(t, root, "start", sb.ID), "start after recover")
			assertFilesIntact(t, img, fillSize)
		})
	}
}
