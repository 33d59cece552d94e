package liveness

import (
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/nexus-sandbox/nexus/host/intent"
	"github.com/nexus-sandbox/nexus/reaper"
)

const id = "01HZZZZZZZZZZZZZZZZZZZZZZB"

// startNamed runs a real process whose command line carries args. It is a
// shell blocked in the `read` builtin, so it never forks: a forked child
// carries its parent's command line until it execs, and would be a second
// process naming the same ULID for a moment.
func startNamed(t *testing.T, args ...string) *exec.Cmd {
	t.Helper()
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("sh", append([]string{"-c", "read -r _", "sh"}, args...)...)
	cmd.Stdin = r
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	r.Close()
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait(); w.Close() })
	return cmd
}

func TestProcScanFindsTheULID(t *testing.T) {
	cmd := startNamed(t, "--api-socket", "/x/run/sb-"+id+".sock")
	p := ScanProcs("/proc")
	pr := p.Process(id, nil)
	if pr.State != reaper.Alive || !strings.Contains(pr.Detail, strconv.Itoa(cmd.Process.Pid)) {
		t.Fatalf("process naming %s not found: %+v", id, pr)
	}
	// The identified orphan's own pid is no evidence.
	if pr := p.Process(id, []int{cmd.Process.Pid}); pr.State == reaper.Alive {
		t.Fatalf("ignored pid still counted: %+v", pr)
	}
	if p.Reads == 0 {
		t.Fatal("no cmdline read")
	}
}

// A command line longer than 512 KiB is ambiguous for every ULID not
// found before the cutoff.
func TestProcScanTruncatedCmdlineIsAmbiguous(t *testing.T) {
	chunk := strings.Repeat("a", 120<<10)
	startNamed(t, chunk, chunk, chunk, chunk, chunk)
	p := ScanProcs("/proc")
	pr := p.Process("01HZZZZZZZZZZZZZZZZZZZZZZQ", nil)
	if pr.State != reaper.Unsure || !strings.Contains(strings.Join(p.Incomplete, ";"), "longer than") {
		t.Fatalf("truncated cmdline: %+v %v", pr, p.Incomplete)
	}
}

// fakeProc builds a /proc-shaped tree of real files: pid dirs with
// cmdline files, and optionally one whose cmdline is missing (ENOENT).
func fakeProc(t *testing.T, n int, missing bool) string {
	t.Helper()
	dir := t.TempDir()
	for i := 1; i <= n; i++ {
		pd := filepath.Join(dir, strconv.Itoa(1000+i))
		os.Mkdir(pd, 0o700)
		os.WriteFile(filepath.Join(pd, "cmdline"), []byte("nexus\x00vmm-process\x00--api-socket\x00/r/run/sb-"+fakeULID(1000+i)+".sock\x00"), 0o600)
	}
	os.Mkdir(filepath.Join(dir, "self"), 0o700)
	if missing {
		os.Mkdir(filepath.Join(dir, "999999"), 0o700)
	}
	return dir
}

// One read per process, however many ULIDs are asked about afterwards.
func TestProcScanReadsOncePerProcess(t *testing.T) {
	p := ScanProcs(fakeProc(t, 37, false))
	for i := 0; i < 1000; i++ {
		p.Process(fakeULID(1000+i%50), nil)
	}
	if p.Reads != 37 || len(p.Incomplete) != 0 {
		t.Fatalf("reads %d (want 37), incomplete %v", p.Reads, p.Incomplete)
	}
	if pr := p.Process(fakeULID(1001), nil); pr.State != reaper.Alive {
		t.Fatalf("ULID in fake cmdline not found: %+v", pr)
	}
}

func TestProcScanVanishedCmdlineIsAmbiguous(t *testing.T) {
	p := ScanProcs(fakeProc(t, 3, true))
	pr := p.Process(id, nil)
	if pr.State != reaper.Unsure || !strings.Contains(pr.Detail, "999999") {
		t.Fatalf("ENOENT on a cmdline: %+v", pr)
	}
	if pr := ScanProcs(filepath.Join(t.TempDir(), "none")).Process(id, nil); pr.State != reaper.Unsure {
		t.Fatalf("unreadable /proc: %+v", pr)
	}
}

func TestProbeSocket(t *testing.T) {
	dir := t.TempDir()
	live := filepath.Join(dir, "live.sock")
	l, err := net.Listen("unix", live)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if p := ProbeSocket(live, time.Second); p.State != reaper.Alive {
		t.Fatalf("listening socket: %+v", p)
	}
	// A stale socket file whose listener is gone: refused, so dead.
	stale := filepath.Join(dir, "stale.sock")
	sl, _ := net.Listen("unix", stale)
	sl.(*net.UnixListener).SetUnlinkOnClose(false)
	sl.Close()
	if _, err := os.Lstat(stale); err != nil {
		t.Fatal("stale socket file missing")
	}
	if p := ProbeSocket(stale, time.Second); p.State != reaper.Dead {
		t.Fatalf("stale socket: %+v", p)
	}
	if p := ProbeSocket(filepath.Join(dir, "none.sock"), time.Second); p.State != reaper.Dead {
		t.Fatalf("absent socket: %+v", p)
	}
	// An unexpected dial error is ambiguous, never dead.
	long := filepath.Join(dir, strings.Repeat("x", 120))
	if p := ProbeSocket(long, time.Second); p.State != reaper.Unsure {
		t.Fatalf("unexpected dial error: %+v", p)
	}
}

func TestProbeIntent(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, id+".create-intent.json")
	h, err := intent.Publish(path, intent.Intent{Kind: "create", Sandbox: id, Covers: []string{"disks/" + id + ".raw"}})
	if err != nil {
		t.Fatal(err)
	}
	if l := ProbeIntent(path); l.State != reaper.LeaseHeld || len(l.Covers) != 1 {
		t.Fatalf("held intent: %+v", l)
	}
	h.Release()
	if l := ProbeIntent(path); l.State != reaper.LeaseFree {
		t.Fatalf("released intent: %+v", l)
	}
	if l := ProbeIntent(filepath.Join(dir, "gone.json")); l.State != reaper.LeaseGone {
		t.Fatalf("absent intent: %+v", l)
	}
	// A FIFO or a link under an intent's name is unreadable, and probing it
	// neither hangs nor follows the link.
	fifo := filepath.Join(dir, "fifo.create-intent.json")
	if err := unix.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	if l := ProbeIntent(fifo); l.State != reaper.LeaseUnreadable || !strings.Contains(l.Err, "regular") {
		t.Fatalf("fifo intent: %+v", l)
	}
	link := filepath.Join(dir, "link.create-intent.json")
	os.Symlink(path, link)
	if l := ProbeIntent(link); l.State != reaper.LeaseUnreadable {
		t.Fatalf("symlinked intent: %+v", l)
	}
	// A marker that cannot be opened is unreadable, not free: doubt keeps.
	if l := ProbeIntent(filepath.Join(path, "below-a-file")); l.State != reaper.LeaseUnreadable || l.Err == "" {
		t.Fatalf("unopenable intent: %+v", l)
	}
}

// fakeULID is a 26-character ULID ending in n's four digits.
func fakeULID(n int) string { return "01HZZZZZZZZZZZZZZZZZZZ" + strconv.Itoa(n) }

// The gate's fresh listing: a socket or intent absent from it is dead or
// gone without a probe; one present is probed for real.
func TestGateUsesAFreshListing(t *testing.T) {
	root := t.TempDir()
	os.MkdirAll(filepath.Join(root, "run"), 0o700)
	os.MkdirAll(filepath.Join(root, "disks"), 0o700)
	g := &Gate{Root: root, Procs: &Procs{byULID: map[string][]int{}}}
	l, err := net.Listen("unix", filepath.Join(root, "run", "sb-"+id+".sock"))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if p := g.Socket(id); p.State != reaper.Alive {
		t.Fatalf("listening API socket: %+v", p)
	}
	if p := g.Socket("01HZZZZZZZZZZZZZZZZZZZZZZQ"); p.State != reaper.Dead {
		t.Fatalf("absent API socket: %+v", p)
	}
	h, err := intent.Publish(filepath.Join(root, "disks", id+".create-intent.json"), intent.Intent{Kind: "create", Sandbox: id})
	if err != nil {
		t.Fatal(err)
	}
	defer h.Release()
	g2 := &Gate{Root: root, Procs: g.Procs}
	if l := g2.Intent("disks/" + id + ".create-intent.json"); l.State != reaper.LeaseHeld {
		t.Fatalf("late intent: %+v", l)
	}
	if l := g2.Intent("disks/none.create-intent.json"); l.State != reaper.LeaseGone {
		t.Fatalf("absent intent: %+v", l)
	}
}
