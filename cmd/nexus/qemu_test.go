package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nexus-sandbox/nexus/agentproto"
	"github.com/nexus-sandbox/nexus/host/vmm"
	"github.com/nexus-sandbox/nexus/internal/testutil"
)

// guestAssets holds what the real-guest tests share across the test
// binary: each initramfs and guest program is built once (software
// emulation leaves little CPU for rebuilding the same archive per test).
var guestAssets struct {
	sync.Mutex
	dir   string
	built map[string]string
	err   map[string]error
}

// guestAsset returns the file build made for key, building it on the
// first call into the shared directory.
func guestAsset(t testing.TB, key string, build func(dir string) (string, error)) string {
	t.Helper()
	guestAssets.Lock()
	defer guestAssets.Unlock()
	if p, ok := guestAssets.built[key]; ok {
		return p
	}
	if err, ok := guestAssets.err[key]; ok {
		t.Fatalf("%s: %v (built once for every test)", key, err)
	}
	if guestAssets.dir == "" {
		dir, err := os.MkdirTemp("", "nexus-guest-assets-")
		if err != nil {
			t.Fatal(err)
		}
		guestAssets.dir, guestAssets.built, guestAssets.err = dir, map[string]string{}, map[string]error{}
	}
	dir := filepath.Join(guestAssets.dir, key)
	os.Mkdir(dir, 0o700)
	p, err := build(dir)
	if err != nil {
		guestAssets.err[key] = err
		t.Fatalf("%s: %v", key, err)
	}
	guestAssets.built[key] = p
	return p
}

// removeGuestAssets runs once the tests are over (TestMain).
func removeGuestAssets() {
	if guestAssets.dir != "" {
		os.RemoveAll(guestAssets.dir)
	}
}

// goBuildStatic builds a package of this repository (a path relative to
// its root) as a static binary, as a guest needs it.
func goBuildStatic(pkg, out string) error {
	_, file, _, _ := runtime.Caller(0)
	build := exec.Command("go", "build", "-o", out, pkg)
	build.Dir = filepath.Join(filepath.Dir(file), "..", "..")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if b, err := build.CombinedOutput(); err != nil {
		return fmt.Errorf("build %s: %v\n%s", pkg, err, b)
	}
	return nil
}

// initramfsWith builds an initramfs for the guest kernel with `nexus
// guest initramfs`, as a user would, with the static build of pkg as its
// /init: once per test binary.
func initramfsWith(t testing.TB, g testutil.Guest, pkg string) string {
	t.Helper()
	return guestAsset(t, "initramfs-"+filepath.Base(pkg), func(dir string) (string, error) {
		init := filepath.Join(dir, filepath.Base(pkg))
		if err := goBuildStatic(pkg, init); err != nil {
			return "", err
		}
		out := filepath.Join(dir, "initrd.gz")
		cmd := exec.Command(nexusBin, "--state-dir", filepath.Join(dir, "root"), "guest", "initramfs", "--kernel-release", g.Release, "-o", out, "--agent", init)
		cmd.Env = append(os.Environ(), "NEXUS_STATE_DIR=")
		b, err := cmd.CombinedOutput()
		if err != nil {
			return "", fmt.Errorf("guest initramfs: %v\n%s", err, b)
		}
		for _, m := range []string{"virtio_pci.ko", "virtio_blk.ko", "virtio_console.ko"} {
			if !strings.Contains(string(b), m) {
				return "", fmt.Errorf("initramfs lacks %s:\n%s", m, b)
			}
		}
		return out, nil
	})
}

// guestInitramfs is the initramfs with nexus-init as /init.
func guestInitramfs(t testing.TB, _ string, g testutil.Guest) string {
	t.Helper()
	return initramfsWith(t, g, "./cmd/nexus-init")
}

// agentInitramfs is the initramfs with nexus-agent as /init (PID 1).
func agentInitramfs(t testing.TB, g testutil.Guest) string {
	t.Helper()
	return initramfsWith(t, g, "./cmd/nexus-agent")
}

// guestFill is cmd/nexus/testdata/guestfill, static, for `nexus cp` into
// a guest whose initramfs has no shell.
func guestFill(t testing.TB) string {
	t.Helper()
	return guestAsset(t, "guestfill", func(dir string) (string, error) {
		out := filepath.Join(dir, "guestfill")
		return out, goBuildStatic("./cmd/nexus/testdata/guestfill", out)
	})
}

// removeRealGuests removes sandboxes (their snapshots too) and checks
// what every real-guest test promises at its end: nothing of them left
// anywhere under the state root, no process, and neither the reaper (dry
// run) nor replay diff finds anything.
func removeRealGuests(t *testing.T, root string, env []string, ids ...string) {
	t.Helper()
	mustOK(t, nexusEnv(t, root, env, append([]string{"rm", "-f", "--with-snapshots"}, ids...)...), "rm")
	if left := untracked(t, root); len(left) > 0 {
		t.Errorf("rm left untracked files: %v", left)
	}
	for _, id := range ids {
		filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
			if err == nil && strings.Contains(d.Name(), id) {
				t.Errorf("rm left %s", p)
			}
			return nil
		})
	}
	if left := testutil.ProcessesUnder(root); len(left) > 0 {
		t.Errorf("rm left processes: %+v", left)
	}
	if r := nexusEnv(t, root, env, "reap"); r.code != 0 || !strings.Contains(r.stdout, " 0 orphan(s)") {
		t.Errorf("reap (dry run) after rm: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	if r := nexusEnv(t, root, env, "replay", "diff"); r.code != 0 {
		t.Errorf("replay diff after rm: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
}

// pingVsock dials the guest's agent through the sandbox's vsock socket
// as nexus does (CH's hybrid-vsock handshake, then hello) and pings it.
// Dialling is retried until the guest's init serves the port (a guest
// still booting is no listener); the ping itself is not.
func pingVsock(t *testing.T, root, id string) {
	t.Helper()
	sock := filepath.Join(root, "run", "sb-"+id+".vsock")
	var a *agentproto.Client
	testutil.WaitUntil(t, 60*time.Second, id+": the guest answering hello through the relay", func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), testutil.Scale(10*time.Second))
		defer cancel()
		var err error
		a, err = vmm.DialAgent(ctx, sock)
		return err == nil
	})
	defer a.Close()
	ctx, cancel := context.WithTimeout(context.Background(), testutil.Scale(30*time.Second))
	defer cancel()
	if err := a.Ping(ctx); err != nil {
		t.Fatalf("%s: ping through the relay: %v", id, err)
	}
}

// TestQEMUBootsARealGuest: a sandbox on the qemu driver boots a real
// Linux kernel with an initramfs nexus built from the host's modules: the
// guest finds its disks by serial, mounts the workspace and says so on
// the console, which is kept in logs/<id>.console.log with the command
// line the config file gave; stop leaves no process; rm leaves nothing.
func TestQEMUBootsARealGuest(t *testing.T) {
	testutil.StartsSandboxes(t)
	g := testutil.RealGuest(t)
	start := time.Now()
	root := shortRoot(t)
	initrd := guestInitramfs(t, root, g)
	os.WriteFile(filepath.Join(root, "config.toml"), []byte("[vm]\ncmdline = \"console=ttyS0 panic=-1 nexus.test=1\"\n"), 0o600)
	// Software emulation: a nested /dev/kvm (as on the CI microVM) can
	// open and still fail to run a guest.
	env := []string{"NEXUS_KERNEL_PATH=" + g.Kernel, "NEXUS_INITRAMFS_PATH=" + initrd, "NEXUS_QEMU_ACCEL=tcg"}
	qemu := func(args ...string) result {
		t.Helper()
		return nexusEnv(t, root, env, append([]string{"--driver", "qemu"}, args...)...)
	}
	r := mustOK(t, qemu("create", "--image", makeImage(t), "--handle", "real/one"), "create")
	id := strings.Fields(r.stdout)[0]
	console := filepath.Join(root, "logs", id+".console.log")
	ready := time.Now()
	testutil.WaitUntil(t, 60*time.Second, "the guest ready on its console", func() bool {
		b, _ := os.ReadFile(console)
		return strings.Contains(string(b), "nexus-init: ready") || strings.Contains(string(b), "nexus-init: failed") || strings.Contains(string(b), "Kernel panic")
	})
	b, _ := os.ReadFile(console)
	log := string(b)
	if !strings.Contains(log, "nexus-init: ready") {
		t.Fatalf("guest did not come up:\n%s", log)
	}
	t.Logf("guest ready %.1fs after create (test %.1fs in)", time.Since(ready).Seconds(), time.Since(start).Seconds())
	if !strings.Contains(log, "nexus.test=1") {
		t.Error("the console does not show the command line from [vm] cmdline")
	}
	if !regexp.MustCompile(`nexus-init: disks .*nexus-os=vd[a-z]`).MatchString(log) || !strings.Contains(log, "nexus-workspace=vd") {
		t.Errorf("the guest did not find both disks by serial:\n%s", log)
	}
	// The vsock socket relays to the guest's virtio-serial port once the
	// guest opened it, after CH's CONNECT handshake.
	testutil.WaitUntil(t, 30*time.Second, "the guest's agent port open", func() bool {
		b, _ := os.ReadFile(console)
		return strings.Contains(string(b), "nexus-init: agent port")
	})
	pingVsock(t, root, id)
	vmmLog, _ := os.ReadFile(filepath.Join(root, "logs", id+".vmm.log"))
	private := regexp.MustCompile(`unix:(\S+)/qmp\.sock`).FindStringSubmatch(string(vmmLog))
	if private == nil {
		t.Fatalf("vmm log names no QMP socket:\n%s", vmmLog)
	}

	// nexus-init is no agent: it answers flush "unsupported", so stop
	// journals no flush acknowledgement.
	mustOK(t, qemu("stop", id), "stop")
	if ev := mustOK(t, nexus(t, root, "events", "--all", "--sandbox", id, "--json"), "events").stdout; strings.Contains(ev, "flush.acknowledged") {
		t.Error("a flush was acknowledged by a guest without an agent")
	}
	if left := testutil.ProcessesUnder(root); len(left) > 0 {
		t.Fatalf("stop left processes: %+v", left)
	}
	if _, err := os.Stat(private[1]); !os.IsNotExist(err) {
		t.Errorf("the adapter's private directory %s is still there: %v", private[1], err)
	}
	removeRealGuests(t, root, env, id)
	t.Logf("whole test %.1fs", time.Since(start).Seconds())
}

var alive = regexp.MustCompile(`nexus-init: alive (\d+)`)

// aliveCounts are nexus-init's in-memory counts on a sandbox's console.
func aliveCounts(root, sandbox string) []int {
	b, _ := os.ReadFile(filepath.Join(root, "logs", sandbox+".console.log"))
	var out []int
	for _, m := range alive.FindAllStringSubmatch(string(b), -1) {
		n := 0
		for _, c := range m[1] {
			n = n*10 + int(c-'0')
		}
		out = append(out, n)
	}
	return out
}

// TestQEMUSnapshotRestoreContinuesTheGuest: a snapshot of a running qemu
// sandbox holds the guest's memory, and its restore continues it: the
// child's console goes on with nexus-init's in-memory count past where the
// parent was at the snapshot, and shows no boot (no kernel banner, no
// "ready"), where a cold boot would start again at 1.
func TestQEMUSnapshotRestoreContinuesTheGuest(t *testing.T) {
	testutil.StartsSandboxes(t)
	g := testutil.RealGuest(t)
	root := shortRoot(t)
	initrd := guestInitramfs(t, root, g)
	env := []string{"NEXUS_KERNEL_PATH=" + g.Kernel, "NEXUS_INITRAMFS_PATH=" + initrd, "NEXUS_QEMU_ACCEL=tcg"}
	qemu := func(args ...string) result {
		t.Helper()
		return nexusEnv(t, root, env, append([]string{"--driver", "qemu"}, args...)...)
	}
	id := strings.Fields(mustOK(t, qemu("create", "--image", makeImage(t)), "create").stdout)[0]
	counts := func(sandbox string) []int { return aliveCounts(root, sandbox) }
	testutil.WaitUntil(t, 60*time.Second, "the guest counting on its console", func() bool { return len(counts(id)) >= 3 })
	// nexus-init is no agent: nothing freezes its filesystems, so the
	// snapshot is taken crash-consistent, as it must be asked to be.
	snap := strings.TrimSpace(mustOK(t, qemu("snapshot", "--crash-consistent", id), "snapshot").stdout)
	before := counts(id)
	child := strings.Fields(mustOK(t, qemu("restore", snap), "restore").stdout)[0]
	testutil.WaitUntil(t, 60*time.Second, "the restored guest counting", func() bool { return len(counts(child)) >= 2 })
	got := counts(child)
	b, _ := os.ReadFile(filepath.Join(root, "logs", child+".console.log"))
	if strings.Contains(string(b), "Linux version") || strings.Contains(string(b), "nexus-init: ready") {
		t.Fatalf("the restored guest booted instead of continuing:\n%s", b)
	}
	// The snapshot was taken after the parent's first three counts, so
	// the child's first count continues from at least there.
	if got[0] < 3 || got[1] != got[0]+1 {
		t.Fatalf("child counts %v, parent's at the snapshot %v: not a continuation of its memory", got, before)
	}
	t.Logf("parent counted to %d by the snapshot; the child went on at %d", before[len(before)-1], got[0])
	// The restored guest's agent port was open in its memory: the child's
	// vsock socket relays to it at once.
	pingVsock(t, root, child)
	// The parent was paused for the snapshot and runs on after it.
	testutil.WaitUntil(t, 30*time.Second, "the parent counting after the snapshot", func() bool {
		c := counts(id)
		return len(c) > 0 && c[len(c)-1] > before[len(before)-1]
	})
	removeRealGuests(t, root, env, id, child)
}

// TestQEMUGuestThatCannotBootSaysWhy: a guest whose kernel panics (here an
// rdinit that does not exist, so it falls back to a root it cannot mount)
// ends its VMM (-no-reboot, panic=-1), the sandbox is seen exited, and its
// console log, kept and shown by `nexus logs`, says why. rm leaves nothing.
func TestQEMUGuestThatCannotBootSaysWhy(t *testing.T) {
	testutil.StartsSandboxes(t)
	g := testutil.RealGuest(t)
	root := shortRoot(t)
	initrd := guestInitramfs(t, root, g)
	env := []string{"NEXUS_KERNEL_PATH=" + g.Kernel, "NEXUS_INITRAMFS_PATH=" + initrd, "NEXUS_QEMU_ACCEL=tcg",
		"NEXUS_KERNEL_CMDLINE=console=ttyS0 panic=-1 rdinit=/no-such-init"}
	qemu := func(args ...string) result {
		t.Helper()
		return nexusEnv(t, root, env, append([]string{"--driver", "qemu"}, args...)...)
	}
	// create waits for Ready: a guest whose VMM ends first fails it,
	// naming the console log, and the sandbox is kept.
	r := qemu("create", "--image", makeImage(t))
	if r.code != 1 || !strings.Contains(r.stderr, "exited before the guest was Ready") || !strings.Contains(r.stderr, "console.log") {
		t.Fatalf("create of a guest that cannot boot: exit %d, stderr %q: want 1, its VMM exited, the console log named", r.code, r.stderr)
	}
	id := strings.Fields(r.stdout)[0]
	testutil.WaitUntil(t, 60*time.Second, "the sandbox seen exited", func() bool {
		for _, sb := range sandboxes(t, root) {
			if sb.ID == id {
				return sb.State == "exited"
			}
		}
		return false
	})
	out := mustOK(t, qemu("logs", id, "--log", "console"), "logs").stdout
	if !strings.Contains(out, "Kernel panic") || !strings.Contains(out, "Unable to mount root fs") {
		t.Fatalf("the console log does not say why the guest died:\n%s", out)
	}
	if vmm := mustOK(t, qemu("logs", id, "--log", "vmm"), "logs").stdout; !strings.Contains(vmm, "on its own") {
		t.Errorf("the VMM log does not say QEMU ended on its own:\n%s", vmm)
	}
	removeRealGuests(t, root, env, id)
}

// TestQEMUStopStartCyclesKeepFiles: with the guest agent as the
// initramfs's /init, every stop of a qemu sandbox is acknowledged by the
// real guest (flush: freeze through the adapter's vsock relay), and over
// three stop/start cycles every file the guest wrote, fsynced or not,
// comes back through cp after each start; rm leaves nothing. The same
// holds on a volume attached at /data, which the guest mounts there
// because nexus puts nexus.mount on its kernel command line.
func TestQEMUStopStartCyclesKeepFiles(t *testing.T) {
	testutil.StartsSandboxes(t)
	q := newRealGuest(t, 32)
	q.ok("volume create", "volume", "create", "data", "--size", "16M")
	id := strings.Fields(q.ok("create", "create", "--image", makeImage(t), "--volume", "data:/data"))[0]
	acks := func() int {
		return strings.Count(q.ok("events", "events", "--sandbox", id, "--type", "flush.acknowledged"), "flush.acknowledged")
	}
	text := func(round int) string { return fmt.Sprintf("round %d: written by the guest, never fsynced\n", round) }
	for round := 1; round <= 3; round++ {
		q.ready(id)
		for earlier := 1; earlier < round; earlier++ {
			for _, dir := range []string{"/workspace", "/data"} {
				if got := string(q.cat(id, fmt.Sprintf("%s/round-%d", dir, earlier))); got != text(earlier) {
					t.Fatalf("after start %d the file of round %d in %s holds %q", round-1, earlier, dir, got)
				}
			}
		}
		q.exec(id, "write", fmt.Sprintf("/workspace/round-%d", round), text(round), "nosync")
		q.exec(id, "write", fmt.Sprintf("/data/round-%d", round), text(round), "nosync")
		if r := q.run("stop", id); r.code != 0 || strings.Contains(r.stderr, "warning") {
			t.Fatalf("round %d: stop: exit %d %s (want the agent's flush acknowledged)", round, r.code, r.stderr)
		}
		if n := acks(); n != round {
			t.Fatalf("round %d: %d flush acknowledgements after stop", round, n)
		}
		q.ok("start", "start", id)
	}
	q.finish(id)
}

// TestQEMUForkOfARunningGuest: fork of a running qemu sandbox whose guest
// cannot freeze is refused, and with --crash-consistent pauses it (QMP
// stop), copies its disks and boots each child from its copies (a
// fork boots cold; restore is what continues memory): each child comes up
// on its own console with its copies found by serial and answers on its
// own vsock relay, the parent resumes and runs on, and rm leaves nothing.
func TestQEMUForkOfARunningGuest(t *testing.T) {
	testutil.StartsSandboxes(t)
	g := testutil.RealGuest(t)
	root := shortRoot(t)
	initrd := guestInitramfs(t, root, g)
	env := []string{"NEXUS_KERNEL_PATH=" + g.Kernel, "NEXUS_INITRAMFS_PATH=" + initrd, "NEXUS_QEMU_ACCEL=tcg"}
	qemu := func(args ...string) result {
		t.Helper()
		return nexusEnv(t, root, env, append([]string{"--driver", "qemu"}, args...)...)
	}
	parent := strings.Fields(mustOK(t, qemu("create", "--image", makeImage(t)), "create").stdout)[0]
	testutil.WaitUntil(t, 60*time.Second, "the parent counting", func() bool { return len(aliveCounts(root, parent)) >= 3 })
	// This guest's /init is nexus-init, which answers ping but holds no
	// freeze: fork refuses it, and copies crash-consistently when told to.
	wantFailure(t, qemu("fork", parent, "--count", "2", "--freeze-timeout", "2s"), 1, "--crash-consistent")
	var children []string
	for _, line := range strings.Split(strings.TrimSpace(mustOK(t, qemu("fork", parent, "--count", "2", "--crash-consistent", "--freeze-timeout", "2s"), "fork").stdout), "\n") {
		children = append(children, strings.Fields(line)[0])
	}
	if len(children) != 2 {
		t.Fatalf("fork made %v", children)
	}
	for _, child := range children {
		console := filepath.Join(root, "logs", child+".console.log")
		testutil.WaitUntil(t, 60*time.Second, "a child ready", func() bool {
			b, _ := os.ReadFile(console)
			return strings.Contains(string(b), "nexus-init: ready") || strings.Contains(string(b), "nexus-init: failed")
		})
		b, _ := os.ReadFile(console)
		if !strings.Contains(string(b), "nexus-init: ready") || !strings.Contains(string(b), "nexus-workspace=vd") {
			t.Fatalf("child %s did not come up on its disk copies:\n%s", child, b)
		}
		pingVsock(t, root, child)
	}
	before := aliveCounts(root, parent)
	testutil.WaitUntil(t, 30*time.Second, "the parent counting after the fork", func() bool {
		c := aliveCounts(root, parent)
		return len(c) > len(before)
	})
	removeRealGuests(t, root, env, parent, children[0], children[1])
}
