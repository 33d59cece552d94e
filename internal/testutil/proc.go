package testutil

import (
	"fmt"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"
)

// StopWait is how long a stopped child has, after SIGTERM, to exit before
// it is dumped and killed (scaled).
const StopWait = time.Minute

// logTail bounds how much of a child's log a failure prints: enough for a
// goroutine dump of a hung nexus.
const logTail = 64 << 10

// Proc is a child of the test (a daemon, a command) whose every wait is
// bounded: its stdout and stderr are kept, and a wait that runs out dumps
// its goroutines (SIGQUIT, which a Go program answers with a dump to
// stderr), kills it and fails the test with its stderr. When the test
// ends, a child still running is stopped the same way.
type Proc struct {
	Cmd            *exec.Cmd
	Stdout, Stderr Buffer
	done           chan struct{}
	err            error // Cmd.Wait's, once done is closed
}

// Start starts cmd as a Proc; cmd's Stdout and Stderr must be unset.
func Start(t testing.TB, cmd *exec.Cmd) *Proc {
	t.Helper()
	p := start(t, cmd)
	t.Cleanup(func() { p.Stop(t) })
	return p
}

// Run runs cmd to its end, as Start then Wait (nothing is left to stop at
// the test's end: Wait kills what it gives up on).
func Run(t testing.TB, cmd *exec.Cmd, limit time.Duration) *Proc {
	t.Helper()
	p := start(t, cmd)
	p.Wait(t, limit)
	return p
}

func start(t testing.TB, cmd *exec.Cmd) *Proc {
	t.Helper()
	p := &Proc{Cmd: cmd, done: make(chan struct{})}
	cmd.Stdout, cmd.Stderr = &p.Stdout, &p.Stderr
	if cmd.WaitDelay == 0 {
		// A grandchild that kept the output pipes would hold Wait after
		// the child's own exit.
		cmd.WaitDelay = 10 * time.Second
	}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", p.name(), err)
	}
	go func() {
		p.err = cmd.Wait()
		close(p.done)
	}()
	return p
}

func (p *Proc) name() string {
	return strings.Join(p.Cmd.Args, " ")
}

// Done is closed once the child has exited.
func (p *Proc) Done() <-chan struct{} { return p.done }

// Exited reports whether the child has exited.
func (p *Proc) Exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// Code is the child's exit code once it exited (-1 for a signal), and
// whether it has.
func (p *Proc) Code() (int, bool) {
	if !p.Exited() {
		return 0, false
	}
	return p.Cmd.ProcessState.ExitCode(), true
}

// Wait waits until the child exits, at most Scale(limit), and returns its
// exit code; past that it fails the test with the child's log.
func (p *Proc) Wait(t testing.TB, limit time.Duration) int {
	t.Helper()
	limit = Scale(limit)
	select {
	case <-p.done:
		return p.Cmd.ProcessState.ExitCode()
	case <-time.After(limit):
		p.dumpAndKill()
		t.Fatalf("%s still running after %v; its stderr (ends with its goroutines):\n%s", p.name(), limit, p.tail())
		return -1
	}
}

// WaitLog waits until the child's stderr holds one of want, at most
// Scale(limit); the child exiting first, or the limit passing, fails the
// test with its stderr.
func (p *Proc) WaitLog(t testing.TB, limit time.Duration, want ...string) {
	t.Helper()
	said := func() bool {
		log := p.Stderr.String()
		for _, w := range want {
			if strings.Contains(log, w) {
				return true
			}
		}
		return false
	}
	limit = Scale(limit)
	deadline := time.After(limit)
	for !said() {
		select {
		case <-p.done:
			if said() {
				return
			}
			t.Fatalf("%s exited (%v) before saying %q; its stderr:\n%s", p.name(), p.err, want, p.tail())
		case <-deadline:
			p.dumpAndKill()
			t.Fatalf("%s did not say %q in %v; its stderr (ends with its goroutines):\n%s", p.name(), want, limit, p.tail())
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// Stop sends SIGTERM and waits for the exit, at most Scale(StopWait),
// returning the exit code; a child that does not stop fails the test with
// its log. Stopping an exited child only returns its code.
func (p *Proc) Stop(t testing.TB) int {
	t.Helper()
	if !p.Exited() {
		p.Cmd.Process.Signal(syscall.SIGTERM)
	}
	limit := Scale(StopWait)
	select {
	case <-p.done:
		return p.Cmd.ProcessState.ExitCode()
	case <-time.After(limit):
		p.dumpAndKill()
		t.Errorf("%s did not stop within %v of SIGTERM; its stderr (ends with its goroutines):\n%s", p.name(), limit, p.tail())
		return -1
	}
}

// dumpAndKill asks for a goroutine dump, gives it a moment to be written,
// then kills the child and waits for it.
func (p *Proc) dumpAndKill() {
	p.Cmd.Process.Signal(syscall.SIGQUIT)
	select {
	case <-p.done:
		return
	case <-time.After(5 * time.Second):
	}
	p.Cmd.Process.Kill()
	<-p.done
}

func (p *Proc) tail() string {
	s := p.Stderr.String()
	if len(s) > logTail {
		s = fmt.Sprintf("[%d bytes before]\n", len(s)-logTail) + s[len(s)-logTail:]
	}
	return s
}
