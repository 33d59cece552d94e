package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nexus-sandbox/nexus/control"
	"github.com/nexus-sandbox/nexus/control/wire"
	"github.com/nexus-sandbox/nexus/internal/testutil"
	"github.com/nexus-sandbox/nexus/projections"
)

// anotherBuild is a copy of the test's nexus, nexusd, nexus-fleet and
// nexus-shim, side by side, each with one byte appended: they run the same
// (ELF ignores what follows its segments) but are other files, other sizes
// and mtimes, as an upgraded installation is another build. It returns the
// CLI's path.
func anotherBuild(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	for _, name := range []string{"nexus", "nexusd", "nexus-fleet", "nexus-shim"} {
		copyPlusOne(t, filepath.Join(filepath.Dir(nexusBin), name), filepath.Join(dir, name))
	}
	return filepath.Join(dir, "nexus")
}

func copyPlusOne(t *testing.T, from, bin string) {
	t.Helper()
	src, err := os.Open(from)
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	dst, err := os.OpenFile(bin, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o755)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(dst, src); err != nil {
		t.Fatal(err)
	}
	if _, err := dst.Write([]byte{0}); err != nil {
		t.Fatal(err)
	}
	if err := dst.Close(); err != nil {
		t.Fatal(err)
	}
	// A child another test forked while the copy was open for writing
	// holds it until its exec: running the copy fails ETXTBSY until then.
	testutil.WaitUntil(t, time.Minute, "the copied "+filepath.Base(bin)+" runs", func() bool {
		err := exec.Command(bin, "version").Run()
		return !errors.Is(err, syscall.ETXTBSY)
	})
}

// commandWait bounds one command of a test (scaled): one that runs
// longer has hung, and fails the test with its stderr rather than holding
// the package until go test's own timeout. A daemon run in the foreground
// that should have refused to start is such a command.
const commandWait = 5 * time.Minute

// nexusBinEnv is nexusEnv with another nexus binary.
func nexusBinEnv(t testing.TB, bin, root string, env []string, args ...string) result {
	t.Helper()
	stopDaemonsAtEnd(t, root)
	cmd := exec.Command(bin, append([]string{"--state-dir", root}, args...)...)
	cmd.Env = append(append(os.Environ(), "NEXUS_STATE_DIR="), env...)
	p := testutil.Run(t, cmd, commandWait)
	return result{p.Cmd.ProcessState.ExitCode(), p.Stdout.String(), p.Stderr.String()}
}

// askDaemon asks root's daemon for its Status (retiring ones too).
func askDaemon(root string) (wire.Status, error) {
	c := control.NewClient(filepath.Join(root, wire.SocketName))
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	return c.Status(ctx)
}

// daemonOf is the nexusd installed beside the CLI bin: the daemon's
// executable.
func daemonOf(bin string) string { return filepath.Join(filepath.Dir(bin), "nexusd") }

func exeOf(pid int) string {
	exe, _ := os.Readlink(filepath.Join("/proc", strconv.Itoa(pid), "exe"))
	return exe
}

// TestAutoDaemonOfAnotherBuildIsReplaced: build A's command started a
// daemon on demand, and a create of build A is frozen mid saga through it
// (its append stream open, its sandbox not yet created), for longer than a
// daemon waits for a held journal. Two commands of build B then run at
// once: they retire A's daemon and start one daemon of build B between
// them, once A's is gone; the frozen create, resumed, finishes through A's
// retiring daemon (none of its appends lost), A's daemon exits, and both B
// commands succeed through the new daemon. Without the build check in
// control.ConnectWith, B's commands would use A's daemon (its pid
// unchanged, the test fails on it); without ensureDaemon waiting for A's
// daemon to go, the daemon B starts gives up on the held journal and B's
// commands open it in process (no daemon left, the test fails on it).
func TestAutoDaemonOfAnotherBuildIsReplaced(t *testing.T) {
	testutil.StartsSandboxes(t)
	t.Parallel()
	binA := anotherBuild(t)
	root := shortRoot(t)
	img := makeImage(t)
	mustOK(t, nexusBinEnv(t, binA, root, nil, "demo"), "demo of build A")
	old := daemonPids(root)
	if len(old) != 1 || exeOf(old[0]) != daemonOf(binA) {
		t.Fatalf("daemons after A's demo: %v (exe %s), want one of %s", old, exeOf(old[0]), daemonOf(binA))
	}
	// Asking is not replacing: `daemon status` of build B shows A's
	// daemon and what B's next command will do.
	st := mustOK(t, nexus(t, root, "daemon", "status"), "daemon status").stdout
	for _, want := range []string{" " + strconv.Itoa(old[0]) + "\n", "on demand", daemonOf(binA), "another build; its next command replaces the daemon"} {
		if !strings.Contains(st, want) {
			t.Fatalf("daemon status of build B lacks %q:\n%s", want, st)
		}
	}

	create := exec.Command(binA, "--state-dir", root, "--driver", "process", "create", "--json", "--image", img)
	create.Env = append(os.Environ(), "NEXUS_STATE_DIR=", "NEXUS_PAUSE_AT=create.workspace-disk:before")
	var created strings.Builder
	create.Stdout = &created
	stderr, err := create.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	testutil.StartChild(t, create)
	line, err := bufio.NewReader(stderr).ReadString('\n')
	if err != nil || !strings.Contains(line, "paused at") {
		t.Fatalf("A's create said %q, %v", line, err)
	}
	waitStopped(t, create.Process.Pid)
	go io.Copy(io.Discard, stderr)

	var wg sync.WaitGroup
	rs := make([]result, 2)
	for i := range rs {
		wg.Go(func() { rs[i] = nexusEnv(t, root, nil, "demo") })
	}
	waitUntil(t, "A's daemon retiring", func() bool {
		st, err := askDaemon(root)
		return err == nil && st.Pid == old[0] && st.Retiring
	})
	// The old command outlasts the new daemon's wait for a held journal
	// (lockWait): B's commands wait for A's daemon to finish with it
	// before they start one, instead of starting one that gives up.
	time.Sleep(lockWait + 2*time.Second)
	if !slices.Contains(daemonPids(root), old[0]) {
		t.Fatal("A's daemon exited while A's create was paused on it")
	}
	create.Process.Signal(syscall.SIGCONT)
	if err := create.Wait(); err != nil {
		t.Fatalf("A's create, resumed while its daemon retired: %v", err)
	}
	wg.Wait()
	for i, r := range rs {
		mustOK(t, r, "B's demo "+strconv.Itoa(i))
	}
	waitUntil(t, "A's daemon exited", func() bool { return !slices.Contains(daemonPids(root), old[0]) })
	now := daemonPids(root)
	if len(now) != 1 || exeOf(now[0]) != daemonOf(nexusBin) {
		t.Fatalf("daemons after B's demos: %v (exe %q), want one of build B (%s)", now, exeOf(now[0]), daemonOf(nexusBin))
	}
	st = mustOK(t, nexus(t, root, "daemon", "status"), "daemon status").stdout
	for _, want := range []string{" " + strconv.Itoa(now[0]) + "\n", daemonOf(nexusBin), "the same build"} {
		if !strings.Contains(st, want) {
			t.Fatalf("daemon status of the new daemon lacks %q:\n%s", want, st)
		}
	}
	// Every daemon started on demand served: none gave up on a journal
	// A's daemon still held (its error would be in the log).
	if log, err := os.ReadFile(filepath.Join(root, control.DaemonLog)); err != nil || strings.Contains(string(log), "nexus: ") {
		t.Fatalf("a daemon started on demand failed (%v):\n%s", err, log)
	}
	list := sandboxes(t, root)
	if len(list) != 1 || list[0].State != projections.StateRunning {
		t.Fatalf("after A's create finished through its retiring daemon: %+v", list)
	}
	if !strings.Contains(created.String(), list[0].ID) {
		t.Fatalf("A's create printed %q, want %s", created.String(), list[0].ID)
	}
	mustOK(t, proc(t, root, "rm", "-f", list[0].ID), "rm")
}

// TestHandDaemonOfAnotherBuildRefused: a daemon of build A started by hand
// is never used by build B's commands, nor replaced: the command fails in
// one line naming both builds and the way out, exit 1, with auto-start on
// or off, and the daemon serves on. Without the check, ls would succeed
// through it.
func TestHandDaemonOfAnotherBuildRefused(t *testing.T) {
	t.Parallel()
	binA := anotherBuild(t)
	root := shortRoot(t)
	d := testutil.StartDaemon(t, binA, root)
	for _, env := range [][]string{nil, {"NEXUS_NO_AUTO_DAEMON=1"}} {
		r := nexusBinEnv(t, nexusBin, root, env, "ls")
		wantFailure(t, r, 1, "runs another nexus build")
		for _, want := range []string{daemonOf(binA), daemonOf(nexusBin), "restart it", "kill " + strconv.Itoa(d.Cmd.Process.Pid)} {
			if !strings.Contains(r.stderr, want) {
				t.Fatalf("%v: refusal %q does not name %q", env, r.stderr, want)
			}
		}
	}
	if pids := daemonPids(root); len(pids) != 1 || pids[0] != d.Cmd.Process.Pid {
		t.Fatalf("daemons after the refusals: %v, want the hand-started %d alone", pids, d.Cmd.Process.Pid)
	}
	mustOK(t, nexusBinEnv(t, binA, root, nil, "ls"), "ls of build A")
	st := mustOK(t, nexus(t, root, "daemon", "status"), "daemon status").stdout
	for _, want := range []string{"by hand", daemonOf(binA), daemonOf(nexusBin), "another build; its commands refuse the daemon until it is restarted"} {
		if !strings.Contains(st, want) {
			t.Fatalf("daemon status of build B lacks %q:\n%s", want, st)
		}
	}
	wantFailure(t, nexus(t, shortRoot(t), "daemon", "status"), 1, "no daemon serves")
}

// TestSameBuildDaemonReused: a daemon of this build, started on demand or
// by hand, is used as it is (its pid unchanged across commands). Without
// the identity compared by file (a check that always found another build)
// every command would replace the on-demand daemon.
func TestSameBuildDaemonReused(t *testing.T) {
	t.Parallel()
	root := shortRoot(t)
	mustOK(t, nexus(t, root, "demo"), "demo")
	first := daemonPids(root)
	mustOK(t, nexus(t, root, "demo"), "demo")
	mustOK(t, nexus(t, root, "ls"), "ls")
	if now := daemonPids(root); len(first) != 1 || !slices.Equal(now, first) {
		t.Fatalf("daemons %v, then %v: want the same one", first, now)
	}

	hand := shortRoot(t)
	d := testutil.StartDaemon(t, nexusBin, hand)
	mustOK(t, nexus(t, hand, "demo"), "demo beside a hand-started daemon")
	if now := daemonPids(hand); len(now) != 1 || now[0] != d.Cmd.Process.Pid {
		t.Fatalf("daemons %v, want the hand-started %d", now, d.Cmd.Process.Pid)
	}
}

// TestOldFollowerStopsWhenItsDaemonIsReplaced: an `events --follow` of
// build A, left running when build B's command replaces A's daemon, does
// not take the root back (which would restart a daemon every time the
// other build ran a command, for as long as it follows): once its daemon
// is gone it stops, one line, exit 1, and B's daemon serves on. Without
// the check on a redial, the follower retires B's daemon and starts one of
// build A (the daemon's pid changes, the test fails on it).
func TestOldFollowerStopsWhenItsDaemonIsReplaced(t *testing.T) {
	t.Parallel()
	binA := anotherBuild(t)
	root := shortRoot(t)
	f, ferr := startOldFollower(t, binA, root)
	mustOK(t, nexus(t, root, "demo"), "demo of build B")
	now := daemonPids(root)
	if len(now) != 1 || exeOf(now[0]) != daemonOf(nexusBin) {
		t.Fatalf("daemons after B's demo: %v, want one of build B", now)
	}
	wantFollowerRefused(t, f, ferr, root, now)
	mustOK(t, nexus(t, root, "demo"), "demo of build B")
	if after := daemonPids(root); !slices.Equal(after, now) {
		t.Fatalf("daemons %v after the old follower stopped, want B's %v", after, now)
	}
}

// TestOldFollowerFindsTheNewDaemonAlreadyUp: the window the test above
// leaves to chance, held open. Build A's follower is stopped (SIGSTOP)
// while its daemon is killed and build B's starts; resumed, the follower
// finds its stream broken and a daemon already listening. Its dial then
// succeeds, so only a build check after the break keeps it from following
// B's daemon silently: it must stop with the one-line refusal.
func TestOldFollowerFindsTheNewDaemonAlreadyUp(t *testing.T) {
	t.Parallel()
	binA := anotherBuild(t)
	root := shortRoot(t)
	f, ferr := startOldFollower(t, binA, root)
	was := daemonPids(root)
	if len(was) != 1 || exeOf(was[0]) != daemonOf(binA) {
		t.Fatalf("daemons before: %v, want one of build A", was)
	}
	if err := f.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	// A stop takes effect when each of the follower's threads next enters
	// the kernel: killing the daemon before then lets the follower see the
	// break and take the daemon spawn lock, which it would then hold,
	// stopped, for the rest of the test.
	waitUntil(t, "every thread of the follower stopped", func() bool { return allThreadsStopped(f.Process.Pid) })
	syscall.Kill(was[0], syscall.SIGKILL)
	waitUntil(t, "build A's daemon gone", func() bool { return len(daemonPids(root)) == 0 })
	mustOK(t, nexus(t, root, "demo"), "demo of build B")
	now := daemonPids(root)
	if len(now) != 1 || exeOf(now[0]) != daemonOf(nexusBin) {
		t.Fatalf("daemons after B's demo: %v, want one of build B", now)
	}
	if err := f.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	wantFollowerRefused(t, f, ferr, root, now)
	if after := daemonPids(root); !slices.Equal(after, now) {
		t.Fatalf("daemons %v after the old follower stopped, want B's %v", after, now)
	}
}

// startOldFollower runs build A's demo on root, then an `events --follow`
// of build A, and returns once it printed its first sandbox.created.
func startOldFollower(t *testing.T, binA, root string) (*exec.Cmd, *bytes.Buffer) {
	t.Helper()
	mustOK(t, nexusBinEnv(t, binA, root, nil, "demo"), "demo of build A")
	ferr := new(bytes.Buffer)
	f, heard := followCreates(t, binA, root, ferr)
	hearCreate(t, heard, "build A's follower")
	return f, ferr
}

// wantFollowerRefused waits for the old follower f to stop with exit 1 and
// the one-line refusal, while build B's daemons (now) serve root.
func wantFollowerRefused(t *testing.T, f *exec.Cmd, ferr *bytes.Buffer, root string, now []int) {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- f.Wait() }()
	select {
	case err := <-done:
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.ExitCode() != 1 {
			t.Fatalf("the old follower ended %v, want exit 1 (stderr %q)", err, ferr.String())
		}
	case <-time.After(testutil.Scale(time.Minute)):
		pids := daemonPids(root)
		f.Process.Kill()
		<-done
		t.Fatalf("the old follower still runs; daemons %v, build B's were %v (stderr %q)", pids, now, ferr.String())
	}
	wantFailure(t, result{1, "", ferr.String()}, 1, "now runs another nexus build")
}

// allThreadsStopped is whether every thread of pid is in the stopped state.
func allThreadsStopped(pid int) bool {
	tasks, err := os.ReadDir(filepath.Join("/proc", strconv.Itoa(pid), "task"))
	if err != nil || len(tasks) == 0 {
		return false
	}
	for _, task := range tasks {
		data, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "task", task.Name(), "stat"))
		if err != nil {
			return false
		}
		// "tid (comm) S ...": the state follows the parenthesised name.
		i := bytes.LastIndexByte(data, ')')
		if i < 0 || i+2 >= len(data) || data[i+2] != 'T' {
			return false
		}
	}
	return true
}

// TestRetiredDaemonHandsTheCommandToItsSuccessor: a command saw the
// daemon it started answer and, before it asked it anything, the daemon
// was retired (as a command of another build, or one that needs the
// journal to itself, does). The command goes to the successor: it starts
// a new daemon and succeeds through it, instead of failing "the daemon is
// retiring" (or, once it is gone, "stopped answering").
func TestRetiredDaemonHandsTheCommandToItsSuccessor(t *testing.T) {
	t.Parallel()
	root := shortRoot(t)
	stopDaemonsAtEnd(t, root)
	ls := pauseAt(t, root, "daemon.ensured", "ls", "-q")
	st, err := askDaemon(root)
	if err != nil {
		t.Fatal(err)
	}
	c := control.NewClient(filepath.Join(root, wire.SocketName))
	if err := c.Retire(t.Context()); err != nil {
		t.Fatal(err)
	}
	c.Close()
	if code := ls.resume(t, 0); code != 0 {
		t.Fatalf("ls handed to the successor: exit %d: %s", code, ls.stderr.String())
	}
	now, err := askDaemon(root)
	if err != nil || now.Pid == st.Pid || now.Retiring {
		t.Fatalf("after the hand-over the daemon is %+v (%v), want a successor of pid %d", now, err, st.Pid)
	}
}
