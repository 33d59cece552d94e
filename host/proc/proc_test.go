package proc

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/nexus-sandbox/nexus/internal/testutil"
)

// startChild starts argv as our child and kills and reaps it at cleanup.
func startChild(t *testing.T, argv ...string) *exec.Cmd {
	t.Helper()
	return testutil.StartChild(t, exec.Command(argv[0], argv[1:]...))
}

// startReady starts a shell script that prints "ready" once it has set itself
// up, and returns after reading it, so tests never race the script's setup.
func startReady(t *testing.T, script string) *exec.Cmd {
	t.Helper()
	cmd := exec.Command("sh", "-c", script)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
	})
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil || line != "ready\n" {
		t.Fatalf("child said %q, %v", line, err)
	}
	return cmd
}

func TestSelf(t *testing.T) {
	id, err := Self()
	if err != nil {
		t.Fatal(err)
	}
	if id.Pid != os.Getpid() || id.StartTicks == 0 {
		t.Fatalf("Self = %+v, pid %d", id, os.Getpid())
	}
	if alive, err := Alive(id); err != nil || !alive {
		t.Fatalf("Alive(self) = %v, %v", alive, err)
	}
}

func TestOfChild(t *testing.T) {
	self, _ := Self()
	cmd := startChild(t, "sleep", "60")
	id, err := Of(cmd.Process.Pid)
	if err != nil {
		t.Fatal(err)
	}
	if id.Pid != cmd.Process.Pid || id.StartTicks < self.StartTicks {
		t.Fatalf("Of(child) = %+v, self %+v", id, self)
	}
	again, err := Of(cmd.Process.Pid)
	if err != nil || again != id {
		t.Fatalf("Of twice: %+v then %+v, %v", id, again, err)
	}
	if alive, err := Alive(id); err != nil || !alive {
		t.Fatalf("Alive = %v, %v", alive, err)
	}
}

func TestOfGone(t *testing.T) {
	data, err := os.ReadFile("/proc/sys/kernel/pid_max")
	if err != nil {
		t.Fatal(err)
	}
	max, err := strconv.Atoi(strings.TrimSpace(string(data)))
	if err != nil {
		t.Fatal(err)
	}
	// No process can have a pid above pid_max.
	if _, err := Of(max + 1); !errors.Is(err, ErrGone) {
		t.Fatalf("Of(pid_max+1) = %v, want ErrGone", err)
	}
	if alive, err := Alive(Identity{Pid: max + 1, StartTicks: 1}); err != nil || alive {
		t.Fatalf("Alive(pid_max+1) = %v, %v", alive, err)
	}
}

func TestAliveAfterKill(t *testing.T) {
	cmd := startChild(t, "sleep", "60")
	id, err := Of(cmd.Process.Pid)
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	// Wait for the exit but leave the child unreaped: a zombie must count as
	// gone even though its /proc entry and start ticks are still there.
	var info unix.Siginfo
	if err := unix.Waitid(unix.P_PID, id.Pid, &info, unix.WEXITED|unix.WNOWAIT, nil); err != nil {
		t.Fatal(err)
	}
	if zid, err := Of(id.Pid); err != nil || zid != id {
		t.Fatalf("zombie Of = %+v, %v; want %+v", zid, err, id)
	}
	if alive, err := Alive(id); err != nil || alive {
		t.Fatalf("Alive(zombie) = %v, %v", alive, err)
	}
	cmd.Wait()
	if alive, err := Alive(id); err != nil || alive {
		t.Fatalf("Alive(reaped) = %v, %v", alive, err)
	}
}

func TestAliveWrongTicks(t *testing.T) {
	cmd := startChild(t, "sleep", "60")
	id, err := Of(cmd.Process.Pid)
	if err != nil {
		t.Fatal(err)
	}
	reused := Identity{Pid: id.Pid, StartTicks: id.StartTicks - 1}
	if alive, err := Alive(reused); err != nil || alive {
		t.Fatalf("Alive(wrong ticks) = %v, %v", alive, err)
	}
}

func TestTerminateGraceful(t *testing.T) {
	cmd := startChild(t, "sleep", "60")
	id, err := Of(cmd.Process.Pid)
	if err != nil {
		t.Fatal(err)
	}
	if err := Terminate(id, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	cmd.Wait()
	if sig := signalOf(cmd); sig != syscall.SIGTERM {
		t.Fatalf("child ended by %v, want SIGTERM", sig)
	}
}

func TestTerminateIgnoresTERM(t *testing.T) {
	// exec keeps the ignored disposition, so the process we signal is the
	// one ignoring TERM and no orphaned sleep outlives the test.
	cmd := startReady(t, `trap "" TERM; echo ready; exec sleep 60`)
	id, err := Of(cmd.Process.Pid)
	if err != nil {
		t.Fatal(err)
	}
	const grace = 200 * time.Millisecond
	start := time.Now()
	if err := Terminate(id, grace); err != nil {
		t.Fatal(err)
	}
	if took := time.Since(start); took < grace {
		t.Fatalf("Terminate returned after %v, before the %v grace", took, grace)
	}
	cmd.Wait()
	if sig := signalOf(cmd); sig != syscall.SIGKILL {
		t.Fatalf("child ended by %v, want SIGKILL", sig)
	}
}

func TestTerminateReusedPid(t *testing.T) {
	cmd := startChild(t, "sleep", "60")
	id, err := Of(cmd.Process.Pid)
	if err != nil {
		t.Fatal(err)
	}
	// Same pid, other start: stands for a pid the kernel gave to a newcomer.
	if err := Terminate(Identity{Pid: id.Pid, StartTicks: id.StartTicks + 1}, time.Second); err != nil {
		t.Fatal(err)
	}
	if alive, err := Alive(id); err != nil || !alive {
		t.Fatalf("Terminate signalled a process with other start ticks: alive=%v, %v", alive, err)
	}
}

func TestTerminateGone(t *testing.T) {
	cmd := startChild(t, "sleep", "60")
	id, _ := Of(cmd.Process.Pid)
	cmd.Process.Kill()
	cmd.Wait()
	if err := Terminate(id, time.Second); err != nil {
		t.Fatalf("Terminate(gone) = %v", err)
	}
}

func TestTerminateByProcFallback(t *testing.T) {
	cmd := startReady(t, `trap "" TERM; echo ready; exec sleep 60`)
	id, _ := Of(cmd.Process.Pid)
	if err := terminateByProc(id, 100*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	cmd.Wait()
	if sig := signalOf(cmd); sig != syscall.SIGKILL {
		t.Fatalf("child ended by %v, want SIGKILL", sig)
	}
}

func TestCommWithSpacesAndParen(t *testing.T) {
	src, err := os.Open("/bin/sleep")
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	exe := filepath.Join(t.TempDir(), "we ird) name")
	dst, err := os.OpenFile(exe, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o755)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(dst, src); err != nil {
		t.Fatal(err)
	}
	if err := dst.Close(); err != nil {
		t.Fatal(err)
	}
	// argv[0] stays "sleep" in case sleep is a multi-call binary that
	// dispatches on it; comm comes from the file name regardless.
	cmd := &exec.Cmd{Path: exe, Args: []string{"sleep", "60"}}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { cmd.Process.Kill(); cmd.Wait() }()

	comm, err := os.ReadFile("/proc/" + strconv.Itoa(cmd.Process.Pid) + "/comm")
	if err != nil {
		t.Fatal(err)
	}
	if string(comm) != "we ird) name\n" {
		t.Fatalf("comm = %q", comm)
	}
	self, _ := Self()
	id, err := Of(cmd.Process.Pid)
	if err != nil {
		t.Fatal(err)
	}
	if id.StartTicks < self.StartTicks {
		t.Fatalf("child start %d before ours %d: misparsed", id.StartTicks, self.StartTicks)
	}
	if alive, err := Alive(id); err != nil || !alive {
		t.Fatalf("Alive = %v, %v", alive, err)
	}
	if err := Terminate(id, 5*time.Second); err != nil {
		t.Fatal(err)
	}
}

func TestParseStat(t *testing.T) {
	tail := " S 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 424242 20 21\n"
	for _, comm := range []string{"sleep", "we ird) name", ") S 9 9 9", "a\nb)", "()", ""} {
		st, err := parseStat([]byte("123 (" + comm + ")" + tail))
		if err != nil {
			t.Fatalf("comm %q: %v", comm, err)
		}
		if st.state != 'S' || st.startTicks != 424242 {
			t.Fatalf("comm %q: got %+v", comm, st)
		}
	}
	for _, bad := range []string{"", "123 sleep S 1", "123 (x) S 1 2 3", "123 (x) S" + strings.Repeat(" 1", 18) + " x"} {
		if _, err := parseStat([]byte(bad)); err == nil {
			t.Fatalf("parseStat(%q) succeeded", bad)
		}
	}
}

func TestSpawnDetached(t *testing.T) {
	dir := t.TempDir()
	logPath := filepath.Join(dir, "child.log")
	// The child is not ours to wait on, so it reports having written its
	// lines through a fifo.
	fifo := filepath.Join(dir, "ready")
	if err := unix.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	id, err := SpawnDetached(
		[]string{"sh", "-c", `echo "out $GREETING"; echo err >&2; read x || echo "stdin eof"; echo ready > "$FIFO"; exec sleep 60`},
		[]string{"GREETING=hi", "FIFO=" + fifo, "PATH=" + os.Getenv("PATH")},
		logPath)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Kill(id.Pid, unix.SIGKILL) })
	if ready, err := os.ReadFile(fifo); err != nil || string(ready) != "ready\n" {
		t.Fatalf("child said %q, %v", ready, err)
	}

	if alive, err := Alive(id); err != nil || !alive {
		t.Fatalf("Alive = %v, %v", alive, err)
	}
	data, err := os.ReadFile("/proc/" + strconv.Itoa(id.Pid) + "/stat")
	if err != nil {
		t.Fatal(err)
	}
	// Field 6 is the session id; a session leader's equals its pid.
	fields := bytes.Fields(data[bytes.LastIndexByte(data, ')')+1:])
	if sid, _ := strconv.Atoi(string(fields[3])); sid != id.Pid {
		t.Fatalf("session %d, want own session %d", sid, id.Pid)
	}
	if err := Terminate(id, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	log, err := os.ReadFile(logPath)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"out hi\n", "err\n", "stdin eof\n"} {
		if !strings.Contains(string(log), want) {
			t.Fatalf("log %q lacks %q", log, want)
		}
	}
	fi, err := os.Stat(logPath)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o600 {
		t.Fatalf("log mode %v", fi.Mode())
	}
	// Reaping happens in our background goroutine and tells the test
	// nothing, so this is the one place a deadline poll is the only way.
	deadline := time.Now().Add(testutil.Scale(5 * time.Second))
	for {
		if _, err := Of(id.Pid); errors.Is(err, ErrGone) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("pid %d still has a /proc entry: not reaped", id.Pid)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func TestSpawnDetachedBadCommand(t *testing.T) {
	logPath := filepath.Join(t.TempDir(), "x.log")
	if _, err := SpawnDetached([]string{filepath.Join(t.TempDir(), "missing")}, nil, logPath); err == nil {
		t.Fatal("spawning a missing binary succeeded")
	}
	if _, err := SpawnDetached(nil, nil, logPath); err == nil {
		t.Fatal("spawning empty argv succeeded")
	}
}

func signalOf(cmd *exec.Cmd) syscall.Signal {
	if ws, ok := cmd.ProcessState.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return ws.Signal()
	}
	return 0
}
