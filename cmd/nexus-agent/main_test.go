package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/vmihailenco/msgpack/v5"
	"golang.org/x/sys/unix"

	"github.com/nexus-sandbox/nexus/agentproto"
	"github.com/nexus-sandbox/nexus/host/smallfs"
)

var agentBin string

// TestMain builds the agent once, static as it ships (CGO off).
func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "nexus-agent-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	agentBin = filepath.Join(dir, "nexus-agent")
	build := exec.Command("go", "build", "-o", agentBin, ".")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "build nexus-agent: %v\n%s", err, out)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// startAgent runs the agent as a real process serving one end of a
// socketpair (--fd 3) and returns a client on the other end, hello done.
func startAgent(t *testing.T, args ...string) (*agentproto.Client, *exec.Cmd) {
	t.Helper()
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	theirs := os.NewFile(uintptr(fds[1]), "agent-end")
	ours := os.NewFile(uintptr(fds[0]), "host-end")
	cmd := exec.Command(agentBin, append([]string{"--fd", "3"}, args...)...)
	cmd.ExtraFiles = []*os.File{theirs}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	theirs.Close()
	conn, err := net.FileConn(ours)
	ours.Close()
	if err != nil {
		t.Fatal(err)
	}
	c := agentproto.NewClient(conn)
	t.Cleanup(func() {
		c.Close()
		cmd.Process.Kill()
		cmd.Wait()
	})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	v, name, err := c.Hello(ctx)
	if err != nil {
		t.Fatalf("hello: %v", err)
	}
	if v != agentproto.Version || name == "" {
		t.Fatalf("hello answered version %d agent %q", v, name)
	}
	return c, cmd
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func TestAgentBinaryIsStatic(t *testing.T) {
	out, err := exec.Command("file", agentBin).CombinedOutput()
	if err != nil {
		t.Skipf("SKIPPED: file(1) is unavailable: %v", err)
	}
	if !strings.Contains(string(out), "statically linked") {
		t.Fatalf("nexus-agent is not static: %s", out)
	}
}

func TestHelloFirst(t *testing.T) {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	theirs := os.NewFile(uintptr(fds[1]), "agent-end")
	cmd := exec.Command(agentBin, "--fd", "3")
	cmd.ExtraFiles = []*os.File{theirs}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	theirs.Close()
	ours := os.NewFile(uintptr(fds[0]), "host-end")
	conn, err := net.FileConn(ours)
	ours.Close() // FileConn holds a duplicate; this one would keep the session open
	if err != nil {
		t.Fatal(err)
	}
	c := agentproto.NewClient(conn)
	var ae *agentproto.AgentError
	if err := c.Ping(ctxT(t)); !errors.As(err, &ae) || !strings.Contains(ae.Reason, "hello") {
		t.Fatalf("ping before hello: %v", err)
	}
	if _, _, err := c.Hello(ctxT(t)); err != nil {
		t.Fatal(err)
	}
	if err := c.Ping(ctxT(t)); err != nil {
		t.Fatalf("ping after hello: %v", err)
	}
	// The session ending ends the agent started with --fd.
	c.Close()
	if err := cmd.Wait(); err != nil {
		t.Fatalf("agent exit after the session: %v", err)
	}
}

func TestExec(t *testing.T) {
	c, _ := startAgent(t)
	dir := t.TempDir()
	var out, errb bytes.Buffer
	st, err := c.Exec(ctxT(t), agentproto.Exec{
		Argv:   []string{"/bin/sh", "-c", `echo "$FOO"; pwd; echo oops >&2; cat; exit 3`},
		Env:    []string{"FOO=bar", "PATH=/usr/bin:/bin"},
		Cwd:    dir,
		Stdin:  strings.NewReader("from stdin\n"),
		Stdout: &out, Stderr: &errb,
	})
	if err != nil {
		t.Fatal(err)
	}
	if want := "bar\n" + dir + "\nfrom stdin\n"; out.String() != want {
		t.Fatalf("stdout %q, want %q", out.String(), want)
	}
	if errb.String() != "oops\n" {
		t.Fatalf("stderr %q", errb.String())
	}
	if st != (agentproto.ExitStatus{Code: 3}) {
		t.Fatalf("exit %+v, want code 3", st)
	}
	// Output larger than a frame streams through in order.
	out.Reset()
	st, err = c.Exec(ctxT(t), agentproto.Exec{Argv: []string{"/bin/sh", "-c", "head -c 3000000 /dev/zero | tr '\\0' x"}, Stdout: &out})
	if err != nil || st.Code != 0 || out.Len() != 3000000 || strings.Trim(out.String(), "x") != "" {
		t.Fatalf("large output: %d bytes, %+v, %v", out.Len(), st, err)
	}
	// A program that does not exist is an error answer, not an exit.
	var ae *agentproto.AgentError
	if _, err := c.Exec(ctxT(t), agentproto.Exec{Argv: []string{"/no/such/program"}}); !errors.As(err, &ae) {
		t.Fatalf("missing program: %v", err)
	}
}

func TestExecSignal(t *testing.T) {
	c, _ := startAgent(t)
	sigs := make(chan int, 1)
	// The command says it started, then waits; the signal, sent once its
	// first output arrived, kills it.
	up := &onWrite{f: func() { sigs <- int(syscall.SIGTERM) }}
	st, err := c.Exec(ctxT(t), agentproto.Exec{Argv: []string{"/bin/sh", "-c", "echo up; exec sleep 60"}, Stdout: up, Signals: sigs})
	if err != nil {
		t.Fatal(err)
	}
	if st.Signal != int(syscall.SIGTERM) {
		t.Fatalf("exit %+v, want signal %d", st, syscall.SIGTERM)
	}
}

type onWrite struct {
	once sync.Once
	f    func()
}

func (o *onWrite) Write(p []byte) (int, error) { o.once.Do(o.f); return len(p), nil }

func TestFiles(t *testing.T) {
	c, _ := startAgent(t)
	dir := t.TempDir()
	p := filepath.Join(dir, "f")
	data := bytes.Repeat([]byte("0123456789"), 300000) // 3 MB: several frames
	n, err := c.WriteFile(ctxT(t), p, 0o600, bytes.NewReader(data))
	if err != nil || n != int64(len(data)) {
		t.Fatalf("write: %d %v", n, err)
	}
	fi, err := os.Stat(p)
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("written file: %v %v", fi, err)
	}
	var back bytes.Buffer
	if n, err := c.ReadFile(ctxT(t), p, &back); err != nil || n != int64(len(data)) || !bytes.Equal(back.Bytes(), data) {
		t.Fatalf("read back %d bytes: %v", n, err)
	}
	var ae *agentproto.AgentError
	if _, err := c.ReadFile(ctxT(t), filepath.Join(dir, "missing"), &back); !errors.As(err, &ae) {
		t.Fatalf("missing file: %v", err)
	}
	// Nothing but the file itself is left in the directory.
	ents, _ := os.ReadDir(dir)
	if len(ents) != 1 {
		t.Fatalf("directory holds %d entries", len(ents))
	}
}

// frozenFS mounts a small ext4 for a freeze test. The test defers the
// returned thaw: deferred calls run before cleanups, so nothing (the
// agent's exit wait, the unmount) waits on a filesystem a failed test
// left frozen.
func frozenFS(t *testing.T) (string, func()) {
	mnt := smallfs.Mount(t, 16<<20)
	return mnt, func() {
		f, err := os.Open(mnt)
		if err != nil {
			return
		}
		unix.Syscall(unix.SYS_IOCTL, f.Fd(), 0xC0045878, 0) // FITHAW
		f.Close()
	}
}

// writeAsync writes a file under dir and reports when the write returned.
func writeAsync(dir, name string) <-chan error {
	done := make(chan error, 1)
	go func() { done <- os.WriteFile(filepath.Join(dir, name), []byte("after"), 0o600) }()
	return done
}

func blocked(t *testing.T, done <-chan error, what string) {
	t.Helper()
	select {
	case err := <-done:
		t.Fatalf("%s returned while frozen: %v", what, err)
	case <-time.After(500 * time.Millisecond):
	}
}

func proceeds(t *testing.T, done <-chan error, what string) {
	t.Helper()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("%s still blocked", what)
	}
}

func TestFreezeBlocksWritesUntilThaw(t *testing.T) {
	t.Parallel() // each freezes its own filesystem; most of each is waiting
	mnt, thaw := frozenFS(t)
	defer thaw()
	c, _ := startAgent(t, "--freeze-mounts", mnt+","+mnt)
	paths, err := c.Freeze(ctxT(t), time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if len(paths) != 1 || paths[0] != mnt {
		t.Fatalf("froze %v, want [%s] once", paths, mnt)
	}
	done := writeAsync(mnt, "x")
	blocked(t, done, "a host write")
	// A write request into the frozen filesystem blocks only itself: the
	// same session still answers ping and thaw.
	wdone := make(chan error, 1)
	go func() {
		_, err := c.WriteFile(ctxT(t), filepath.Join(mnt, "y"), 0, strings.NewReader("y"))
		wdone <- err
	}()
	blocked(t, wdone, "an agent write")
	if err := c.Ping(ctxT(t)); err != nil {
		t.Fatalf("ping while frozen: %v", err)
	}
	if paths, err := c.Thaw(ctxT(t)); err != nil || len(paths) != 1 {
		t.Fatalf("thaw: %v %v", paths, err)
	}
	proceeds(t, done, "host write after thaw")
	proceeds(t, wdone, "agent write after thaw")
}

func TestFreezeDeadlineThaws(t *testing.T) {
	t.Parallel() // each freezes its own filesystem; most of each is waiting
	mnt, thaw := frozenFS(t)
	defer thaw()
	c, _ := startAgent(t, "--freeze-mounts", mnt)
	if _, err := c.Flush(ctxT(t), 1500*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	done := writeAsync(mnt, "x")
	blocked(t, done, "a write")
	proceeds(t, done, "a write after the deadline")
	if el := time.Since(start); el < time.Second {
		t.Fatalf("the write proceeded after %v, before the deadline", el)
	}
}

func TestTerminatedAgentThaws(t *testing.T) {
	t.Parallel() // each freezes its own filesystem; most of each is waiting
	mnt, thaw := frozenFS(t)
	defer thaw()
	c, cmd := startAgent(t, "--freeze-mounts", mnt)
	if _, err := c.Freeze(ctxT(t), 5*time.Minute); err != nil {
		t.Fatal(err)
	}
	done := writeAsync(mnt, "x")
	blocked(t, done, "a write")
	cmd.Process.Signal(syscall.SIGTERM)
	proceeds(t, done, "a write after the agent was terminated")
}

func TestFreezeFailureThawsAndSays(t *testing.T) {
	t.Parallel() // each freezes its own filesystem; most of each is waiting
	mnt, thaw := frozenFS(t)
	defer thaw()
	// The second target is not a filesystem that can be frozen (a
	// missing path): the first is thawed again and the answer is an error.
	c, _ := startAgent(t, "--freeze-mounts", mnt+","+filepath.Join(mnt, "missing"))
	var ae *agentproto.AgentError
	if _, err := c.Freeze(ctxT(t), time.Minute); !errors.As(err, &ae) {
		t.Fatalf("freeze: %v", err)
	}
	proceeds(t, writeAsync(mnt, "x"), "a write after a failed freeze")
}

// TestUnknownRequestIsAnsweredNotFatal: a request type from a newer host
// gets an error answer and the session goes on (docs/guest-agent.md,
// versioning).
func TestUnknownRequestIsAnsweredNotFatal(t *testing.T) {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	theirs := os.NewFile(uintptr(fds[1]), "agent-end")
	cmd := exec.Command(agentBin, "--fd", "3")
	cmd.ExtraFiles = []*os.File{theirs}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	theirs.Close()
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	ours := os.NewFile(uintptr(fds[0]), "host-end")
	conn, err := net.FileConn(ours)
	ours.Close()
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(10 * time.Second))
	send := func(body map[string]any) {
		b, err := msgpack.Marshal(body)
		if err != nil {
			t.Fatal(err)
		}
		conn.Write(append([]byte{0, 0, byte(len(b) >> 8), byte(len(b))}, b...))
	}
	send(map[string]any{"type": "hello", "id": 1, "version": 1})
	if m, err := agentproto.Read(conn); err != nil || m.Type != agentproto.THello {
		t.Fatalf("hello: %+v %v", m, err)
	}
	send(map[string]any{"type": "balloon", "id": 2})
	if m, err := agentproto.Read(conn); err != nil || m.Type != agentproto.TError || m.ID != 2 {
		t.Fatalf("unknown request: %+v %v", m, err)
	}
	send(map[string]any{"type": "ping", "id": 3})
	if m, err := agentproto.Read(conn); err != nil || m.Type != agentproto.TOK || m.ID != 3 {
		t.Fatalf("ping after an unknown request: %+v %v", m, err)
	}
}

// TestSessionEndKillsItsProcesses: a command still running when its
// session's stream closes is killed with its process group, not left
// behind.
func TestSessionEndKillsItsProcesses(t *testing.T) {
	c, _ := startAgent(t)
	pids := make(chan string, 1)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go c.Exec(ctx, agentproto.Exec{Argv: []string{"/bin/sh", "-c", "sleep 60 & echo $!; wait"}, Stdout: &onWriteData{f: func(b []byte) { pids <- strings.TrimSpace(string(b)) }}})
	var pid string
	select {
	case pid = <-pids:
	case <-time.After(10 * time.Second):
		t.Fatal("the command did not start")
	}
	if _, err := os.Stat("/proc/" + pid); err != nil {
		t.Fatalf("sleep %s is not running: %v", pid, err)
	}
	c.Close()
	for deadline := time.Now().Add(10 * time.Second); ; {
		b, err := os.ReadFile("/proc/" + pid + "/stat")
		if err != nil || strings.Contains(string(b), ") Z ") {
			return // gone, or dead and awaiting its reaper
		}
		if time.Now().After(deadline) {
			t.Fatalf("sleep %s outlived its session", pid)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

type onWriteData struct {
	once sync.Once
	f    func([]byte)
}

func (o *onWriteData) Write(p []byte) (int, error) {
	o.once.Do(func() { o.f(append([]byte(nil), p...)) })
	return len(p), nil
}
