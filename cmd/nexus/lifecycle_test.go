package main

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"

	"github.com/nexus-sandbox/nexus/host/vmm"
	"github.com/nexus-sandbox/nexus/internal/testutil"
	"github.com/nexus-sandbox/nexus/projections"
)

// makeImage writes a sparse 64 MiB "OS image" with a few MiB of data.
func makeImage(t testing.TB) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "base.raw")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	buf := make([]byte, 1<<20)
	rand.Read(buf)
	for _, off := range []int64{0, 17 << 20, 40 << 20} {
		if _, err := f.WriteAt(buf, off); err != nil {
			t.Fatal(err)
		}
	}
	if err := f.Truncate(64 << 20); err != nil {
		t.Fatal(err)
	}
	return path
}

func proc(t testing.TB, root string, args ...string) result {
	t.Helper()
	return nexus(t, root, append([]string{"--driver", "process"}, args...)...)
}

func mustOK(t testing.TB, r result, what string) result {
	t.Helper()
	if r.code != 0 {
		t.Fatalf("%s: exit %d: %s", what, r.code, r.stderr)
	}
	return r
}

func sandboxes(t testing.TB, root string) []jsonSandbox {
	t.Helper()
	r := mustOK(t, nexus(t, root, "ls", "--json"), "ls")
	var list []jsonSandbox
	if err := json.Unmarshal([]byte(r.stdout), &list); err != nil {
		t.Fatalf("ls --json: %v\n%s", err, r.stdout)
	}
	return list
}

func createJSON(t testing.TB, root string, args ...string) jsonSandbox {
	t.Helper()
	r := mustOK(t, proc(t, root, append([]string{"create", "--json"}, args...)...), "create")
	var sb jsonSandbox
	if err := json.Unmarshal([]byte(r.stdout), &sb); err != nil {
		t.Fatalf("create --json: %v\n%s", err, r.stdout)
	}
	return sb
}

// untracked lists every file or directory under root that no sandbox owns
// (by the journal), ignoring nexus's own bookkeeping and the per-kind
// parent directories.
func untracked(t *testing.T, root string) []string {
	t.Helper()
	owned := map[string]bool{}
	for _, sb := range sandboxes(t, root) {
		for _, r := range sb.Resources {
			owned[r.Path] = true
		}
	}
	containers := map[string]bool{"disks": true, "run": true, "supervisors": true, "sandboxes": true, "snapshots": true, "builder-supervisors": true, "logs": true, "volumes": true, "runs": true}
	var out []string
	filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return nil
		}
		rel, _ := filepath.Rel(root, p)
		top := strings.SplitN(rel, string(filepath.Separator), 2)[0]
		switch {
		case rel == ".", containers[rel]:
			return nil
		// images/ is the shared image cache: owned by no sandbox, tracked by
		// the image cache projection (imagecache_test.go checks it).
		case top == "journal", top == "projections", top == "logs", top == "leases", top == "volumes", top == "images", rel == "nexus.sock", rel == "daemon.lock", rel == "config.toml":
			return filepath.SkipDir
		}
		for dir := rel; dir != "." && dir != "/"; dir = filepath.Dir(dir) {
			if owned[dir] {
				if d.IsDir() {
					return filepath.SkipDir
				}
				return nil
			}
		}
		out = append(out, rel)
		if d.IsDir() {
			return filepath.SkipDir
		}
		return nil
	})
	sort.Strings(out)
	return out
}

// liveProcesses lists the processes under root that are not zombies.
func liveProcesses(t *testing.T, root string) []string {
	t.Helper()
	var out []string
	for _, p := range testutil.ProcessesUnder(root) {
		if !p.Zombie {
			out = append(out, strconv.Itoa(p.Pid)+":"+p.Cmdline)
		}
	}
	return out
}

func assertClean(t *testing.T, root string) {
	t.Helper()
	if left := untracked(t, root); len(left) > 0 {
		t.Fatalf("untracked by the journal: %v", left)
	}
}

func TestLifecycleEndToEnd(t *testing.T) {
	testutil.StartsSandboxes(t)
	t.Parallel()
	root := shortRoot(t)
	image := makeImage(t)
	ws := t.TempDir()
	os.WriteFile(filepath.Join(ws, "hello.txt"), []byte("hello"), 0o644)
	shadowSrc := t.TempDir()
	os.WriteFile(filepath.Join(shadowSrc, "cfg"), []byte("x"), 0o644)

	sb := createJSON(t, root, "--image", image, "--handle", "dev/one", "--workspace", ws, "--shadow", "cfg="+shadowSrc)
	if sb.State != projections.StateRunning || sb.VMM == nil || sb.Supervisor == nil {
		t.Fatalf("created sandbox: %+v", sb)
	}
	// An overlay root: the guest boots on the image cache entry, and its
	// writes land on the workspace disk; the sandbox has no OS disk of its own.
	if _, err := os.Lstat(filepath.Join(root, "disks", sb.ID+".raw")); !os.IsNotExist(err) {
		t.Errorf("an overlay-root sandbox has an OS disk of its own (%v)", err)
	}
	for _, p := range []string{"disks/" + sb.ID + "-workspace.ext4", "disks/dev_one.shadow.cfg.ext4", "run/sb-" + sb.ID + ".sock", "run/sb-" + sb.ID + ".vsock", "run/sb-" + sb.ID + ".iid", "sandboxes/" + sb.ID + "/record.json"} {
		if _, err := os.Lstat(filepath.Join(root, p)); err != nil {
			t.Errorf("missing %s: %v", p, err)
		}
	}
	for _, p := range []string{"disks/" + sb.ID + ".create-intent.json", "disks/dev_one.shadow-intent.json"} {
		if _, err := os.Lstat(filepath.Join(root, p)); !os.IsNotExist(err) {
			t.Errorf("intent %s not retired after commit", p)
		}
	}
	supDir := filepath.Join(root, "supervisors", sb.ID)
	if info, err := os.Stat(supDir); err != nil || info.Mode().Perm() != 0o700 {
		t.Fatalf("supervisor state dir: %v %v", info, err)
	}
	if info, err := os.Stat(filepath.Join(supDir, "mitm-ca.pem")); err != nil || info.Mode().Perm() != 0o600 {
		t.Fatalf("mitm-ca.pem: %v %v", info, err)
	}
	if out, err := exec.Command("e2fsck", "-fn", filepath.Join(root, "disks", sb.ID+"-workspace.ext4")).CombinedOutput(); err != nil {
		t.Fatalf("workspace disk is not a clean ext4 image: %v\n%s", err, out)
	}
	assertClean(t, root)
	wantFailure(t, proc(t, root, "create", "--image", image, "--handle", "dev/one"), 1, "already in use")

	stopped := mustOK(t, proc(t, root, "stop", sb.ID), "stop")
	if !strings.Contains(stopped.stdout, "stopped") {
		t.Fatalf("stop printed %q", stopped.stdout)
	}
	if _, err := os.Lstat(filepath.Join(root, "run", "sb-"+sb.ID+".sock")); !os.IsNotExist(err) {
		t.Fatal("API socket left after stop (RL-11)")
	}
	if r := nexus(t, root, "events", "--type", "flush.acknowledged", "--sandbox", sb.ID); strings.Count(r.stdout, "\n") != 1 {
		t.Fatalf("want one flush acknowledgement after a clean stop, got %q", r.stdout)
	}
	mustOK(t, proc(t, root, "start", "dev/one"), "start")

	snap := strings.TrimSpace(mustOK(t, proc(t, root, "snapshot", sb.ID), "snapshot").stdout)
	if _, err := os.Stat(filepath.Join(root, "snapshots", sb.ID, snap, "manifest.json")); err != nil {
		t.Fatalf("snapshot dir (RL-15): %v", err)
	}
	restored := mustOK(t, proc(t, root, "restore", snap, "--json"), "restore")
	var rsb jsonSandbox
	json.Unmarshal([]byte(restored.stdout), &rsb)
	if rsb.State != projections.StateRunning || rsb.Parent != sb.ID {
		t.Fatalf("restored sandbox: %+v", rsb)
	}

	forked := mustOK(t, proc(t, root, "fork", sb.ID, "--count", "2", "--json"), "fork")
	var children []jsonSandbox
	json.Unmarshal([]byte(forked.stdout), &children)
	if len(children) != 2 {
		t.Fatalf("fork made %d children", len(children))
	}
	for _, c := range children {
		for _, p := range []string{"disks/" + c.ID + "-workspace.ext4", "disks/" + c.ID + "-dev_one.shadow.cfg.ext4"} {
			if !owns(c, p) {
				t.Errorf("child %s does not own %s (RL-14): %+v", c.ID, p, c.Resources)
			}
		}
	}
	assertClean(t, root)

	for _, s := range sandboxes(t, root) {
		mustOK(t, proc(t, root, "rm", "-f", "--with-snapshots", s.ID), "rm "+s.ID)
	}
	if list := sandboxes(t, root); len(list) != 0 {
		t.Fatalf("after rm: %d sandboxes", len(list))
	}
	assertClean(t, root)
	if left := liveProcesses(t, root); len(left) > 0 {
		t.Fatalf("processes outlived rm: %v", left)
	}
}

// TestDeepStateRootBeyondSunPath runs a sandbox's whole life under a state
// root so deep that its socket paths exceed sockaddr_un's 108 bytes: every
// socket is then bound and dialled through its directory's descriptor.
func TestDeepStateRootBeyondSunPath(t *testing.T) {
	testutil.StartsSandboxes(t)
	t.Parallel()
	root := filepath.Join(shortRoot(t), strings.Repeat("deep", 20))
	if n := len(filepath.Join(root, "supervisors", "01JABCDEFGHJKMNPQRSTVWXYZ0", "supervisor.sock")); n < 140 {
		t.Fatalf("root not deep enough: %d", n)
	}
	sb := createJSON(t, root, "--image", makeImage(t))
	if sb.State != projections.StateRunning {
		t.Fatalf("created sandbox: %+v", sb)
	}
	for _, sock := range []string{"sb-" + sb.ID + ".sock", "sb-" + sb.ID + ".vsock", "sb-" + sb.ID + ".iid"} {
		if fi, err := os.Lstat(filepath.Join(root, "run", sock)); err != nil || fi.Mode().Type() != fs.ModeSocket {
			t.Fatalf("run/%s: %v %v", sock, fi, err)
		}
	}
	mustOK(t, proc(t, root, "stop", sb.ID), "stop")
	if r := nexus(t, root, "events", "--type", "flush.acknowledged", "--sandbox", sb.ID); strings.Count(r.stdout, "\n") != 1 {
		t.Fatalf("the guest flush over the deep vsock path was not acknowledged: %q", r.stdout)
	}
	mustOK(t, proc(t, root, "start", sb.ID), "start")
	mustOK(t, proc(t, root, "rm", "-f", "--with-snapshots", sb.ID), "rm")
	assertClean(t, root)
	if left := liveProcesses(t, root); len(left) > 0 {
		t.Fatalf("processes outlived rm: %v", left)
	}
}

func TestVolumesAreNeverSharedOrDeletedByRm(t *testing.T) {
	testutil.StartsSandboxes(t)
	t.Parallel()
	root := shortRoot(t)
	image := makeImage(t)
	mustOK(t, proc(t, root, "volume", "create", "data", "--size", "16M"), "volume create")
	sum := func() string { return volumeSum(t, root, "data") }
	before := sum()
	sb := createJSON(t, root, "--image", image, "--volume", "data:/data")
	wantFailure(t, proc(t, root, "create", "--image", image, "--volume", "data:/other"), 1, "never shared")
	wantFailure(t, proc(t, root, "volume", "rm", "--yes", "data"), 1, "attached")
	wantFailure(t, proc(t, root, "fork", sb.ID), 1, "named volume")
	mustOK(t, proc(t, root, "rm", "-f", "--with-snapshots", sb.ID), "rm")
	if _, err := os.Stat(filepath.Join(root, "volumes", "data", "disk.ext4")); err != nil {
		t.Fatalf("rm touched the volume: %v", err)
	}
	if sum() != before {
		t.Fatal("the volume's bytes changed across create, refusals and rm")
	}
	if r := mustOK(t, proc(t, root, "volume", "ls", "--json"), "volume ls"); !strings.Contains(r.stdout, `"name": "data"`) || !strings.Contains(r.stdout, `"attached_to": []`) {
		t.Fatalf("after rm the volume must be listed and detached (TBD-PD-22): %s", r.stdout)
	}
	mustOK(t, proc(t, root, "volume", "rm", "--yes", "data"), "volume rm")
	if _, err := os.Stat(filepath.Join(root, "volumes", "data")); !os.IsNotExist(err) {
		t.Fatal("volume rm left its directory")
	}
}

func TestBadInputLeavesNothing(t *testing.T) {
	testutil.StartsSandboxes(t)
	t.Parallel()
	root := shortRoot(t)
	image := makeImage(t)
	dir := t.TempDir()
	cases := []struct {
		name string
		args []string
		code int
		says string
	}{
		{"missing image", []string{"create", "--image", filepath.Join(dir, "nope")}, 1, "no such file"},
		{"image is a directory", []string{"create", "--image", dir}, 1, "not a regular file"},
		{"no image", []string{"create"}, 2, "--image"},
		{"missing workspace", []string{"create", "--image", image, "--workspace", filepath.Join(dir, "nope")}, 1, "--workspace"},
		{"shadow without handle", []string{"create", "--image", image, "--shadow", "a=" + dir}, 1, "--handle"},
		{"bad shadow flag", []string{"create", "--image", image, "--shadow", "nosep"}, 2, "NAME=SRC"},
		{"unknown volume", []string{"create", "--image", image, "--volume", "ghost:/g"}, 1, "no volume"},
		{"unknown sandbox", []string{"rm", "-f", "--with-snapshots", "01JDQ4Z6X1M9A3Y0C5TB2R8NKW"}, 1, "no sandbox"},
		{"unknown snapshot", []string{"restore", "01JDQ4Z6X1M9A3Y0C5TB2R8NKW"}, 1, "no snapshot"},
		{"fork count", []string{"fork", "x", "--count", "0"}, 2, "--count"},
		{"fork unknown", []string{"fork", "x", "--count", "1"}, 1, "no sandbox"},
		{"bad size", []string{"volume", "create", "v", "--size", "lots"}, 2, "--size"},
		{"volume rm unknown", []string{"volume", "rm", "--yes", "ghost"}, 1, "no volume"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			wantFailure(t, proc(t, root, c.args...), c.code, c.says)
		})
	}
	// The cloud-hypervisor driver needs a kernel; it says so before writing.
	wantFailure(t, nexus(t, root, "--driver", "cloud-hypervisor", "create", "--image", image), 1, "NEXUS_KERNEL_PATH")
	assertClean(t, root)
	if entries, _ := os.ReadDir(filepath.Join(root, "disks")); len(entries) != 0 {
		t.Fatalf("refused creates left %d entries in disks/", len(entries))
	}
}

func TestSymlinkedStateDirIsRefused(t *testing.T) {
	t.Parallel()
	root := shortRoot(t)
	outside := t.TempDir()
	os.Symlink(outside, filepath.Join(root, "disks"))
	wantFailure(t, proc(t, root, "create", "--image", makeImage(t)), 1, "symbolic link")
	if entries, _ := os.ReadDir(outside); len(entries) != 0 {
		t.Fatalf("create wrote through the symlink: %v", entries)
	}
}

func TestENOSPCCompensates(t *testing.T) {
	testutil.StartsSandboxes(t)
	t.Parallel()
	root := filepath.Join(t.TempDir(), "small")
	os.Mkdir(root, 0o700)
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size=24m,mode=0700", "tmpfs", root).CombinedOutput(); err != nil {
		t.Fatalf("mount tmpfs for the ENOSPC case: %v %s", err, out)
	}
	t.Cleanup(func() { exec.Command("umount", "-l", root).Run() })
	big := filepath.Join(t.TempDir(), "big.raw")
	f, _ := os.Create(big)
	buf := make([]byte, 1<<20)
	for i := 0; i < 40; i++ {
		rand.Read(buf)
		f.Write(buf)
	}
	f.Close()
	r := proc(t, root, "create", "--image", big, "--force")
	wantFailure(t, r, 1, "no space left")
	assertClean(t, root)
	if entries, _ := os.ReadDir(filepath.Join(root, "disks")); len(entries) != 0 {
		t.Fatalf("failed create left %v in disks/", entries)
	}
	if r := nexus(t, root, "events", "--type", "saga.compensated"); strings.Count(r.stdout, "\n") != 1 {
		t.Fatalf("want the create saga compensated in the journal, got %q", r.stdout)
	}
}

// TestCloudHypervisorDriverAgainstFakeVMM drives the cloud-hypervisor
// driver end to end against a stand-in binary that serves the same REST API
// on the real socket (Cloud Hypervisor itself cannot run here). The driver
// must pass the kernel in vm.create's payload, as Cloud Hypervisor needs.
func TestCloudHypervisorDriverAgainstFakeVMM(t *testing.T) {
	testutil.StartsSandboxes(t)
	t.Parallel()
	root := shortRoot(t)
	bin := t.TempDir()
	fake := filepath.Join(bin, "cloud-hypervisor")
	testutil.WriteExecutable(t, fake, []byte("#!/bin/sh\nexec "+nexusBin+" vmm-process \"$@\"\n"))
	kernel := filepath.Join(bin, "vmlinux")
	os.WriteFile(kernel, []byte("not really a kernel"), 0o600)
	env := []string{"NEXUS_CH_BINARY=" + fake, "NEXUS_KERNEL_PATH=" + kernel}
	r := nexusEnv(t, root, env, "--driver", "cloud-hypervisor", "create", "--image", makeImage(t), "--json")
	mustOK(t, r, "create (cloud-hypervisor driver)")
	var sb jsonSandbox
	json.Unmarshal([]byte(r.stdout), &sb)
	if sb.Driver != "cloud-hypervisor" || sb.State != projections.StateRunning {
		t.Fatalf("sandbox %+v", sb)
	}
	info, err := vmm.NewClient(filepath.Join(root, "run", "sb-"+sb.ID+".sock")).Info(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if info.Config.Payload.Kernel != kernel {
		t.Fatalf("vm.create carried payload %+v, want kernel %s", info.Config.Payload, kernel)
	}
	mustOK(t, nexusEnv(t, root, env, "--driver", "cloud-hypervisor", "rm", "-f", "--with-snapshots", sb.ID), "rm")
	assertNothingLeft(t, root)
}

// shortRoot: a state root whose processes and daemons never outlive the
// test (testutil.ShortRoot).
var shortRoot = testutil.ShortRoot
