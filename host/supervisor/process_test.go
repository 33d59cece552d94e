package supervisor

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

const (
	childEnv      = "NEXUS_SUPERVISOR_TEST_CHILD"
	childIDEnv    = "NEXUS_SUPERVISOR_TEST_ID"
	childStateEnv = "NEXUS_SUPERVISOR_TEST_STATE"
	childIIDEnv   = "NEXUS_SUPERVISOR_TEST_IID"
	// childWaitEnv makes the test executable wait for its stdin to close,
	// a process that carries a command line and does nothing else.
	childWaitEnv = "NEXUS_SUPERVISOR_TEST_WAIT"
)

// TestMain doubles as the supervisor binary: with childEnv set, the test
// executable runs Serve as a real detached process would.
func TestMain(m *testing.M) {
	if os.Getenv(childWaitEnv) == "1" {
		io.Copy(io.Discard, os.Stdin)
		os.Exit(0)
	}
	if os.Getenv(childEnv) == "1" {
		os.Exit(childMain())
	}
	os.Exit(m.Run())
}

func childMain() int {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	err := Serve(ctx, ServeOptions{
		SandboxID: os.Getenv(childIDEnv),
		StateDir:  os.Getenv(childStateEnv),
		IIDSocket: os.Getenv(childIIDEnv),
		Log:       os.Stdout,
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, "serve:", err)
		return 1
	}
	return 0
}

type child struct {
	cmd    *exec.Cmd
	lines  chan string
	exited chan error
	mu     sync.Mutex
	out    []string
	stderr bytes.Buffer
}

func (c *child) output() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return strings.Join(c.out, "\n")
}

func startChild(t *testing.T, l layout) *child {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(),
		childEnv+"=1", childIDEnv+"="+l.id, childStateEnv+"="+l.stateDir, childIIDEnv+"="+l.iid)
	c := &child{cmd: cmd, lines: make(chan string, 64), exited: make(chan error, 1)}
	cmd.Stderr = &c.stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			c.mu.Lock()
			c.out = append(c.out, sc.Text())
			c.mu.Unlock()
			select {
			case c.lines <- sc.Text():
			default:
			}
		}
		// Wait only after the pipe is drained, as os/exec requires.
		c.exited <- cmd.Wait()
	}()
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			cmd.Process.Kill()
			<-c.exited
		}
	})
	return c
}

func (c *child) awaitServing(t *testing.T) {
	t.Helper()
	deadline := time.After(failsafe)
	for {
		select {
		case line := <-c.lines:
			if strings.Contains(line, ": serving ") {
				return
			}
		case err := <-c.exited:
			c.exited <- err
			t.Fatalf("child exited before serving: %v\nstdout:\n%s\nstderr:\n%s", err, c.output(), c.stderr.String())
		case <-deadline:
			t.Fatal("child never reported serving")
		}
	}
}

func (c *child) wait(t *testing.T) error {
	t.Helper()
	select {
	case err := <-c.exited:
		c.exited <- err
		return err
	case <-time.After(failsafe):
		t.Fatal("child did not exit")
		return nil
	}
}

func TestSupervisorProcessSurvivesSIGKILL(t *testing.T) {
	l := newLayout(t)
	ctl := filepath.Join(l.stateDir, SocketName)

	a := startChild(t, l)
	a.awaitServing(t)
	infoA, err := Ping(ctxT(t), l.stateDir)
	if err != nil {
		t.Fatal(err)
	}
	if infoA.PID != a.cmd.Process.Pid || infoA.Sandbox != l.id || len(infoA.CASHA256) != 64 {
		t.Fatalf("ping %+v from pid %d", infoA, a.cmd.Process.Pid)
	}
	if id, err := identify(t, l.iid); err != nil || id.Sandbox != l.id {
		t.Fatalf("identity %+v %v", id, err)
	}
	assertStateModes(t, l.stateDir)
	assertSocket(t, ctl)
	assertSocket(t, l.iid)

	// A second supervisor on the same state dir must refuse and leave the
	// live one's sockets alone.
	dup := startChild(t, l)
	if err := dup.wait(t); err == nil {
		t.Fatal("second supervisor on a live state dir exited 0")
	}
	if !strings.Contains(dup.stderr.String(), ErrAlreadyRunning.Error()) {
		t.Fatalf("second supervisor's refusal: %s", dup.stderr.String())
	}
	if info, err := Ping(ctxT(t), l.stateDir); err != nil || info.PID != infoA.PID {
		t.Fatalf("live supervisor disturbed: %+v %v", info, err)
	}

	if err := a.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	a.wait(t)
	// SIGKILL runs no cleanup: both socket files stay, refusing connections.
	for _, p := range []string{ctl, l.iid} {
		if fi, err := os.Lstat(p); err != nil || fi.Mode().Type() != fs.ModeSocket {
			t.Fatalf("expected stale socket at %s: %v", p, err)
		}
	}
	if _, err := Ping(ctxT(t), l.stateDir); err == nil {
		t.Fatal("ping succeeded with the supervisor dead")
	}

	b := startChild(t, l)
	b.awaitServing(t)
	infoB, err := Ping(ctxT(t), l.stateDir)
	if err != nil {
		t.Fatal(err)
	}
	if infoB.PID != b.cmd.Process.Pid {
		t.Fatalf("answered by pid %d, want %d", infoB.PID, b.cmd.Process.Pid)
	}
	if infoB.CASHA256 != infoA.CASHA256 {
		t.Fatalf("CA changed across SIGKILL: %s -> %s (RL-19 requires re-seeding)", infoA.CASHA256, infoB.CASHA256)
	}
	if strings.Contains(b.output(), "CALost") {
		t.Fatalf("replacement reported CALost:\n%s", b.output())
	}
	if !strings.Contains(a.output(), "CALost") {
		t.Fatalf("first boot did not log the mint:\n%s", a.output())
	}
	if _, err := identify(t, l.iid); err != nil {
		t.Fatal(err)
	}

	if err := b.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := b.wait(t); err != nil {
		t.Fatalf("SIGTERM exit: %v\nstderr:\n%s", err, b.stderr.String())
	}
	assertGone(t, ctl, l.iid)
	ca, err := LoadCA(l.stateDir, time.Now())
	if err != nil {
		t.Fatalf("state must survive exit: %v", err)
	}
	if ca.Fingerprint() != infoA.CASHA256 {
		t.Fatal("CA on disk changed")
	}
	assertStateModes(t, l.stateDir)
}

// assertStateModes checks the state dir is 0700 and every file in it 0600.
func assertStateModes(t *testing.T, dir string) {
	t.Helper()
	if m := mode(t, dir); m != 0o700 {
		t.Fatalf("state dir mode %v", m)
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if m := mode(t, filepath.Join(dir, e.Name())); m != 0o600 {
			t.Errorf("%s mode %v, want 0600", e.Name(), m)
		}
	}
}
