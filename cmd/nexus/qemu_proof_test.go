package main

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nexus-sandbox/nexus/host/ext4/ext4test"
	"github.com/nexus-sandbox/nexus/internal/testutil"
)

// realGuest is a sandbox root on the qemu driver with nexus-agent as the
// guest's PID 1 (the initramfs `nexus guest initramfs` builds).
type realGuest struct {
	t    *testing.T
	root string
	env  []string
}

// newRealGuest is a fresh state root whose new overlays are overlayMiB.
func newRealGuest(t *testing.T, overlayMiB int) *realGuest {
	t.Helper()
	g := testutil.RealGuest(t) // logs the kernel and QEMU it runs
	root := shortRoot(t)
	writeConfig(t, root, overlayMiB)
	// Software emulation: a nested /dev/kvm (as on the CI microVM) can
	// open and still fail to run a guest.
	return &realGuest{t: t, root: root, env: []string{"NEXUS_KERNEL_PATH=" + g.Kernel,
		"NEXUS_INITRAMFS_PATH=" + agentInitramfs(t, g), "NEXUS_QEMU_ACCEL=tcg"}}
}

func (q *realGuest) run(args ...string) result {
	q.t.Helper()
	return nexusEnv(q.t, q.root, q.env, append([]string{"--driver", "qemu"}, args...)...)
}

func (q *realGuest) ok(what string, args ...string) string {
	q.t.Helper()
	return mustOK(q.t, q.run(args...), what).stdout
}

// ready waits for the guest's agent by copying guestfill in (the
// initramfs's root is the guest's RAM: a boot loses it): the first cp that
// succeeds is the agent answering. A guest that never answers fails the
// test with what the last cp said and how the guest's console ends, the
// evidence of a slow boot as against a dead one.
func (q *realGuest) ready(id string) {
	q.t.Helper()
	gf := guestFill(q.t)
	began := time.Now()
	limit := testutil.Scale(120 * time.Second)
	for {
		r := q.run("cp", gf, id+":/guestfill")
		if r.code == 0 {
			break
		}
		if time.Since(began) > limit {
			tail := func(name string, n int) []byte {
				b, _ := os.ReadFile(filepath.Join(q.root, "logs", id+name))
				return b[max(0, len(b)-n):]
			}
			q.t.Fatalf("%s: the guest agent took no guestfill in %v; the last cp exited %d: %s\nconsole ends:\n%s\nVMM log ends:\n%s",
				id, limit, r.code, strings.TrimSpace(r.stderr), tail(".console.log", 4000), tail(".vmm.log", 2000))
		}
		time.Sleep(200 * time.Millisecond)
	}
	q.t.Logf("%s: agent answered %.1fs after we began waiting", id, time.Since(began).Seconds())
}

// exec runs guestfill in the guest and returns its stdout.
func (q *realGuest) exec(id string, args ...string) string {
	q.t.Helper()
	return q.ok("exec "+strings.Join(args, " "), append([]string{"exec", id, "--", "/guestfill"}, args...)...)
}

// cat copies a guest file out with cp and returns it.
func (q *realGuest) cat(id, path string) []byte {
	q.t.Helper()
	local := filepath.Join(q.t.TempDir(), "out")
	q.ok("cp "+path+" out", "cp", id+":"+path, local)
	b, err := os.ReadFile(local)
	if err != nil {
		q.t.Fatal(err)
	}
	return b
}

// follow starts `nexus events --follow` for a sandbox; lines arrive on
// the channel as the daemon publishes them.
func (q *realGuest) follow(id string) <-chan string {
	q.t.Helper()
	f := exec.Command(nexusBin, "--state-dir", q.root, "events", "--all", "--follow", "--sandbox", id)
	f.Env = append(os.Environ(), "NEXUS_STATE_DIR=")
	out, err := f.StdoutPipe()
	if err != nil {
		q.t.Fatal(err)
	}
	if err := f.Start(); err != nil {
		q.t.Fatal(err)
	}
	q.t.Cleanup(func() { f.Process.Kill(); f.Wait() })
	lines := make(chan string, 256)
	go func() {
		sc := bufio.NewScanner(out)
		sc.Buffer(nil, 1<<20)
		for sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
	}()
	return lines
}

// finish is removeRealGuests for this root.
func (q *realGuest) finish(ids ...string) {
	q.t.Helper()
	removeRealGuests(q.t, q.root, q.env, ids...)
}

const (
	proofMarker = "marker: written by the guest and fsynced\n"
	proofSecond = "second: written by the guest, never fsynced\n"
)

// TestQEMUOverlayFullProof is the overlay-full proof on a real guest
// (seeds/overlay-disk-full-recovery.txt, automated): a sandbox with a
// 16 MiB overlay; in the guest, a marker file is written and fsynced, a
// second written and not, and a filler written until ext4 says ENOSPC;
// stop (the agent's flush acknowledged); start: the overlay has grown,
// OverlayDiskFull was journaled and heard by a live follower, both files
// come back intact through cp, the filler kept its size, and the guest
// can write again.
func TestQEMUOverlayFullProof(t *testing.T) {
	testutil.StartsSandboxes(t)
	began := time.Now()
	q := newRealGuest(t, 16)
	id := strings.Fields(q.ok("create", "create", "--image", makeImage(t)))[0]
	q.ready(id)
	q.exec(id, "write", "/workspace/marker", proofMarker, "sync")
	q.exec(id, "write", "/workspace/second", proofSecond, "nosync")
	fill, err := strconv.ParseInt(strings.TrimSpace(q.exec(id, "fill", "/workspace/fill")), 10, 64)
	if err != nil || fill < 4<<20 {
		t.Fatalf("the filler wrote %d bytes (%v): want the workspace filled", fill, err)
	}
	if free, _ := strconv.ParseInt(strings.TrimSpace(q.exec(id, "statfs", "/workspace")), 10, 64); free > 1<<20 {
		t.Fatalf("after ENOSPC the guest still sees %d bytes available", free)
	}
	t.Logf("the guest filled its workspace: filler %d bytes", fill)
	events := q.follow(id)

	if r := q.run("stop", id); r.code != 0 || strings.Contains(r.stderr, "warning") {
		t.Fatalf("stop: exit %d: %s (want the agent's flush acknowledged)", r.code, r.stderr)
	}
	if acks := q.ok("events", "events", "--sandbox", id, "--type", "flush.acknowledged"); strings.Count(acks, "flush.acknowledged") != 1 {
		t.Fatalf("flush acknowledgements after stop: %q", acks)
	}
	img := overlayOf(q.root, id)
	before := fileSize(t, img)
	q.ok("start", "start", id)
	grown := fileSize(t, img)
	if grown < before+64<<20 {
		t.Fatalf("overlay %d -> %d bytes: want growth of at least 64 MiB", before, grown)
	}
	heard := ""
	deadline := time.After(testutil.Scale(60 * time.Second))
	for !strings.Contains(heard, "OverlayDiskFull") {
		select {
		case line, ok := <-events:
			if !ok {
				t.Fatalf("the follower ended without OverlayDiskFull:\n%s", heard)
			}
			heard += line + "\n"
		case <-deadline:
			t.Fatalf("the follower heard no OverlayDiskFull in 60s:\n%s", heard)
		}
	}
	if warn := q.ok("events", "events", "--type", "warning.raised", "--sandbox", id); !strings.Contains(warn, "OverlayDiskFull") || !strings.Contains(warn, "grew by") {
		t.Fatalf("journaled warnings: %q", warn)
	}

	q.ready(id)
	if got := string(q.cat(id, "/workspace/marker")); got != proofMarker {
		t.Errorf("marker after start: %q", got)
	}
	if got := string(q.cat(id, "/workspace/second")); got != proofSecond {
		t.Errorf("unsynced second file after start: %q", got)
	}
	filler := q.cat(id, "/workspace/fill")
	if int64(len(filler)) != fill {
		t.Errorf("filler after start: %d bytes, want %d", len(filler), fill)
	}
	for i := 0; i < len(filler); i += 1 << 20 {
		if filler[i+1] != 7 || !bytes.Equal(filler[i:i+4], []byte{0, 7, 14, 21}) {
			t.Fatalf("filler corrupt at %d", i)
			break
		}
	}
	if free, _ := strconv.ParseInt(strings.TrimSpace(q.exec(id, "statfs", "/workspace")), 10, 64); free < 32<<20 {
		t.Errorf("after the grown start the guest sees %d bytes available", free)
	}
	q.exec(id, "write", "/workspace/after", "written after the recovery", "sync")
	q.finish(id)
	t.Logf("whole proof %.1fs", time.Since(began).Seconds())
}

// TestQEMUVMMKilledWhileTheGuestWrites: the VMM of a real guest is
// SIGKILLed (the adapter nexus tracks, whose QEMU dies with it; or QEMU
// itself, which ends its adapter) while the guest writes without
// syncing. After `recover`, start does what docs/overlay.md says of an
// unacknowledged run: refused, OverlayUnflushed, naming the run and the
// VMM's end and the way out, the overlay untouched; `start
// --accept-unflushed` replays it on a private copy and boots, and what
// the guest had synced is there.
func TestQEMUVMMKilledWhileTheGuestWrites(t *testing.T) {
	testutil.StartsSandboxes(t)
	for _, victim := range []string{"adapter", "qemu"} {
		t.Run(victim, func(t *testing.T) {
			q := newRealGuest(t, 32)
			id := strings.Fields(q.ok("create", "create", "--image", makeImage(t)))[0]
			q.ready(id)
			q.exec(id, "write", "/workspace/synced", proofMarker, "sync")

			churn := exec.Command(nexusBin, "--state-dir", q.root, "--driver", "qemu", "exec", id, "--", "/guestfill", "churn", "/workspace")
			churn.Env = append(append(os.Environ(), "NEXUS_STATE_DIR="), q.env...)
			out, err := churn.StdoutPipe()
			if err != nil {
				t.Fatal(err)
			}
			if err := churn.Start(); err != nil {
				t.Fatal(err)
			}
			churned := make(chan error, 1)
			go func() { churned <- churn.Wait() }()
			if line, err := bufio.NewReader(out).ReadString('\n'); err != nil || line != "churning\n" {
				t.Fatalf("churn in the guest: %q %v", line, err)
			}
			go io.Copy(io.Discard, out)
			time.Sleep(time.Second) // dirty pages and an open journal transaction

			vmm := inspect(t, q.root, id).VMM
			if vmm == nil {
				t.Fatal("no VMM recorded for a running sandbox")
			}
			pid := vmm.Pid
			if victim == "qemu" {
				pid = 0
				for _, p := range testutil.ProcessesUnder(q.root) {
					if strings.Contains(p.Cmdline, "qemu-system") {
						pid = p.Pid
					}
				}
				if pid == 0 {
					t.Fatalf("no qemu-system process under the root: %+v", testutil.ProcessesUnder(q.root))
				}
			}
			img := overlayOf(q.root, id)
			if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
				t.Fatal(err)
			}
			select {
			case err := <-churned:
				if err == nil {
					t.Fatal("exec of a command that never ends succeeded when its VMM was killed")
				}
			case <-time.After(testutil.Scale(60 * time.Second)):
				t.Fatal("exec still running 60s after its VMM was killed")
			}
			testutil.WaitUntil(t, 60*time.Second, "the sandbox seen exited", func() bool {
				return inspect(t, q.root, id).State == "exited"
			})
			q.ok("recover", "recover")
			if left := liveProcesses(t, q.root); len(left) > 0 {
				t.Fatalf("recover left processes of the killed VMM: %v", left)
			}
			sum := ext4test.SHA256(t, img)
			r := q.run("start", id)
			wantFailure(t, r, 1, "no flush acknowledgement for its last run")
			// The run, how its VMM ended, where its account is, the
			// state of the overlay, and the way out.
			for _, want := range []string{fmt.Sprintf("VMM pid %d exited", vmm.Pid), "without a stop", "--log vmm", "journal needs replay", "--accept-unflushed"} {
				if !strings.Contains(r.stderr, want) {
					t.Errorf("the refusal %q does not say %q", r.stderr, want)
				}
			}
			t.Logf("refused: %s", strings.TrimSpace(r.stderr))
			if got := ext4test.SHA256(t, img); got != sum {
				t.Fatal("a refused start changed the overlay")
			}
			if sb := inspect(t, q.root, id); sb.State != "error" || len(sb.Conditions) == 0 || sb.Conditions[0].Reason != "OverlayUnflushed" {
				t.Fatalf("after the refusal: state %s conditions %+v", sb.State, sb.Conditions)
			}

			q.ok("start --accept-unflushed", "start", "--accept-unflushed", id)
			if got := ext4test.SHA256(t, img); got == sum {
				t.Error("start --accept-unflushed booted the overlay without replaying its journal on a copy")
			}
			q.ready(id)
			if got := string(q.cat(id, "/workspace/synced")); got != proofMarker {
				t.Errorf("synced file after the crash and --accept-unflushed: %q", got)
			}
			q.exec(id, "write", "/workspace/after", "written after the crash", "sync")
			q.finish(id)
		})
	}
}

// TestQEMUForkAndSnapshotOfARunningAgentGuest: the guest agent freezes a
// running real guest for fork and snapshot. Every fork child sees a file
// the parent wrote and never fsynced (a copy taken without the freeze
// would hold it empty, as a power cut leaves it), and the parent goes on
// writing once thawed; a snapshot's restore continues the guest's memory:
// a file on the initramfs's root (RAM, gone on any boot) is there in the
// restored guest, which writes to its thawed workspace.
func TestQEMUForkAndSnapshotOfARunningAgentGuest(t *testing.T) {
	testutil.StartsSandboxes(t)
	q := newRealGuest(t, 32)
	parent := strings.Fields(q.ok("create", "create", "--image", makeImage(t)))[0]
	q.ready(parent)
	const unsynced = "written by the parent, never fsynced\n"
	q.exec(parent, "write", "/workspace/unsynced", unsynced, "nosync")
	var children []string
	for _, line := range strings.Split(strings.TrimSpace(q.ok("fork", "fork", parent, "--count", "2")), "\n") {
		children = append(children, strings.Fields(line)[0])
	}
	if len(children) != 2 {
		t.Fatalf("fork made %v", children)
	}
	for _, child := range children {
		q.ready(child) // a fork boots cold: guestfill is copied in again
		if got := string(q.cat(child, "/workspace/unsynced")); got != unsynced {
			t.Errorf("fork child %s holds %q of the parent's unsynced file", child, got)
		}
	}
	q.exec(parent, "write", "/workspace/after-fork", "the parent, thawed", "sync")

	const inRAM = "only in the guest's memory\n"
	q.exec(parent, "write", "/in-ram", inRAM, "nosync")
	snap := strings.TrimSpace(q.ok("snapshot", "snapshot", parent))
	restored := strings.Fields(q.ok("restore", "restore", snap))[0]
	testutil.WaitUntil(t, 60*time.Second, "the restored guest's agent answering", func() bool {
		return q.run("cp", restored+":/in-ram", filepath.Join(t.TempDir(), "x")).code == 0
	})
	if got := string(q.cat(restored, "/in-ram")); got != inRAM {
		t.Errorf("the restored guest's RAM file holds %q", got)
	}
	if got := string(q.cat(restored, "/workspace/unsynced")); got != unsynced {
		t.Errorf("the restored guest's workspace file holds %q", got)
	}
	q.exec(restored, "write", "/workspace/after-restore", "the restored guest, thawed", "sync")
	q.exec(parent, "write", "/workspace/after-snapshot", "the parent, thawed again", "sync")
	q.finish(append([]string{parent, restored}, children...)...)
}
