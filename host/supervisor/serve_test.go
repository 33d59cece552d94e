package supervisor

import (
	"bufio"
	"context"
	"errors"
	"io"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/oklog/ulid/v2"

	"github.com/nexus-sandbox/nexus/internal/testutil"
)

// failsafe only bounds a wait for a signal that should arrive; it is never
// the signal itself.
var failsafe = testutil.Scale(30 * time.Second)

// shortDir keeps socket paths under the 108-byte sun_path limit, which
// t.TempDir() paths under long test names can exceed.
func shortDir(t *testing.T) string {
	t.Helper()
	d, err := os.MkdirTemp("", "sv")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(d) })
	return d
}

type layout struct {
	id, stateDir, iid string
}

func newLayout(t *testing.T) layout {
	root := shortDir(t)
	id := ulid.Make().String()
	return layout{
		id:       id,
		stateDir: filepath.Join(root, "supervisors", id),
		iid:      filepath.Join(root, "iid.sock"),
	}
}

// logLines turns Serve's log into a channel of lines, so a test can wait for
// the "serving" line instead of polling the socket.
type logLines struct {
	pw    *io.PipeWriter
	lines chan string
	mu    sync.Mutex
	all   []string
}

func newLogLines() *logLines {
	pr, pw := io.Pipe()
	l := &logLines{pw: pw, lines: make(chan string, 64)}
	go func() {
		sc := bufio.NewScanner(pr)
		for sc.Scan() {
			l.mu.Lock()
			l.all = append(l.all, sc.Text())
			l.mu.Unlock()
			l.lines <- sc.Text()
		}
		close(l.lines)
	}()
	return l
}

func (l *logLines) text() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return strings.Join(l.all, "\n")
}

func awaitServing(t *testing.T, lines <-chan string, exited chan error) {
	t.Helper()
	deadline := time.After(failsafe)
	for {
		select {
		case line, ok := <-lines:
			if !ok {
				// Serve closes its log only on return; report why it did.
				err := <-exited
				exited <- err
				t.Fatalf("supervisor returned before serving: %v", err)
			}
			if strings.Contains(line, ": serving ") {
				return
			}
		case err := <-exited:
			exited <- err // Cleanup waits on it too
			t.Fatalf("supervisor exited before serving: %v", err)
		case <-deadline:
			t.Fatal("supervisor never reported serving")
		}
	}
}

type inProc struct {
	cancel context.CancelFunc
	done   chan error
	log    *logLines
}

func startInProc(t *testing.T, l layout) *inProc {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	p := &inProc{cancel: cancel, done: make(chan error, 1), log: newLogLines()}
	go func() {
		err := Serve(ctx, ServeOptions{SandboxID: l.id, StateDir: l.stateDir, IIDSocket: l.iid, Log: p.log.pw})
		p.log.pw.Close()
		p.done <- err
	}()
	t.Cleanup(func() {
		cancel()
		<-p.done
	})
	return p
}

func (p *inProc) stop(t *testing.T) error {
	t.Helper()
	p.cancel()
	select {
	case err := <-p.done:
		p.done <- err // leave it for Cleanup
		return err
	case <-time.After(failsafe):
		t.Fatal("Serve did not return after cancel")
		return nil
	}
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), failsafe)
	t.Cleanup(cancel)
	return ctx
}

func identify(t *testing.T, sock string) (Identity, error) {
	var id Identity
	err := getJSON(ctxT(t), sock, "/identity", &id)
	return id, err
}

func assertGone(t *testing.T, paths ...string) {
	t.Helper()
	for _, p := range paths {
		if _, err := os.Lstat(p); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("%s still exists (%v)", p, err)
		}
	}
}

func assertSocket(t *testing.T, p string) {
	t.Helper()
	fi, err := os.Lstat(p)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Type() != fs.ModeSocket {
		t.Fatalf("%s is %v, not a socket", p, fi.Mode().Type())
	}
	if fi.Mode().Perm() != 0o600 {
		t.Fatalf("%s mode %v, want 0600", p, fi.Mode().Perm())
	}
}

func TestServeInProcessCancel(t *testing.T) {
	l := newLayout(t)
	p := startInProc(t, l)
	awaitServing(t, p.log.lines, p.done)

	info, err := Ping(ctxT(t), l.stateDir)
	if err != nil {
		t.Fatal(err)
	}
	ca, err := LoadCA(l.stateDir, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	if info.Sandbox != l.id || info.CASHA256 != ca.Fingerprint() || info.PID != os.Getpid() {
		t.Fatalf("ping %+v, want sandbox %s ca %s pid %d", info, l.id, ca.Fingerprint(), os.Getpid())
	}
	id, err := identify(t, l.iid)
	if err != nil || id.Sandbox != l.id {
		t.Fatalf("identity %+v, %v", id, err)
	}
	// Only GET is served.
	if err := getJSON(ctxT(t), filepath.Join(l.stateDir, SocketName), "/identity", &id); err == nil {
		t.Fatal("control socket answered /identity")
	}
	assertSocket(t, filepath.Join(l.stateDir, SocketName))
	assertSocket(t, l.iid)

	if err := p.stop(t); err != nil {
		t.Fatalf("Serve returned %v after cancel", err)
	}
	assertGone(t, filepath.Join(l.stateDir, SocketName), l.iid)
	if _, err := LoadCA(l.stateDir, time.Now()); err != nil {
		t.Fatalf("state dir must survive shutdown: %v", err)
	}
	if !strings.Contains(p.log.text(), "CALost") {
		t.Fatalf("first boot minted without logging CALost:\n%s", p.log.text())
	}
}

func TestServeRemintsDamagedCAAndLogs(t *testing.T) {
	l := newLayout(t)
	if err := EnsureStateDir(l.stateDir); err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(l.stateDir, CAFileName), []byte("garbage"), 0o600)
	p := startInProc(t, l)
	awaitServing(t, p.log.lines, p.done)
	if !strings.Contains(p.log.text(), "CALost") || !strings.Contains(p.log.text(), "not PEM") {
		t.Fatalf("log lacks CALost reason:\n%s", p.log.text())
	}
	info, err := Ping(ctxT(t), l.stateDir)
	if err != nil {
		t.Fatal(err)
	}
	ca, err := LoadCA(l.stateDir, time.Now())
	if err != nil || ca.Fingerprint() != info.CASHA256 {
		t.Fatalf("served CA is not the one on disk: %v", err)
	}
}

// liveListener is a non-supervisor process stand-in that accepts on path.
func liveListener(t *testing.T, path string) {
	t.Helper()
	ln, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
}

func TestServeRefusesLiveSockets(t *testing.T) {
	t.Run("control", func(t *testing.T) {
		l := newLayout(t)
		EnsureStateDir(l.stateDir)
		ctl := filepath.Join(l.stateDir, SocketName)
		liveListener(t, ctl)
		err := Serve(ctxT(t), ServeOptions{SandboxID: l.id, StateDir: l.stateDir, IIDSocket: l.iid})
		if !errors.Is(err, ErrSocketInUse) {
			t.Fatalf("err = %v, want ErrSocketInUse", err)
		}
		if _, err := os.Lstat(ctl); err != nil {
			t.Fatalf("live socket was unlinked: %v", err)
		}
		assertGone(t, l.iid)
	})
	t.Run("identity", func(t *testing.T) {
		l := newLayout(t)
		liveListener(t, l.iid)
		err := Serve(ctxT(t), ServeOptions{SandboxID: l.id, StateDir: l.stateDir, IIDSocket: l.iid})
		if !errors.Is(err, ErrSocketInUse) {
			t.Fatalf("err = %v, want ErrSocketInUse", err)
		}
		if _, err := os.Lstat(l.iid); err != nil {
			t.Fatalf("live socket was unlinked: %v", err)
		}
		// The control socket it had already bound must not be left behind.
		assertGone(t, filepath.Join(l.stateDir, SocketName))
	})
}

func TestServeRefusesNonSocketAtPath(t *testing.T) {
	l := newLayout(t)
	os.WriteFile(l.iid, []byte("precious"), 0o600)
	err := Serve(ctxT(t), ServeOptions{SandboxID: l.id, StateDir: l.stateDir, IIDSocket: l.iid})
	if err == nil || !strings.Contains(err.Error(), "not a socket") {
		t.Fatalf("err = %v", err)
	}
	if b, _ := os.ReadFile(l.iid); string(b) != "precious" {
		t.Fatal("regular file at the socket path was replaced")
	}
}

func TestServeReplacesStaleSocket(t *testing.T) {
	l := newLayout(t)
	EnsureStateDir(l.stateDir)
	for _, p := range []string{filepath.Join(l.stateDir, SocketName), l.iid} {
		ln, err := net.Listen("unix", p)
		if err != nil {
			t.Fatal(err)
		}
		// Close without unlinking: what a killed process leaves.
		ln.(*net.UnixListener).SetUnlinkOnClose(false)
		ln.Close()
	}
	if _, err := Ping(ctxT(t), l.stateDir); err == nil {
		t.Fatal("ping of a stale socket succeeded")
	}
	p := startInProc(t, l)
	awaitServing(t, p.log.lines, p.done)
	if _, err := Ping(ctxT(t), l.stateDir); err != nil {
		t.Fatal(err)
	}
	if _, err := identify(t, l.iid); err != nil {
		t.Fatal(err)
	}
}

func TestServeLeaseExcludesSecond(t *testing.T) {
	l := newLayout(t)
	p := startInProc(t, l)
	awaitServing(t, p.log.lines, p.done)
	other := filepath.Join(shortDir(t), "iid2.sock")
	err := Serve(ctxT(t), ServeOptions{SandboxID: l.id, StateDir: l.stateDir, IIDSocket: other})
	if !errors.Is(err, ErrAlreadyRunning) {
		t.Fatalf("second Serve: %v, want ErrAlreadyRunning", err)
	}
	assertGone(t, other)
	if _, err := Ping(ctxT(t), l.stateDir); err != nil {
		t.Fatalf("first supervisor disturbed: %v", err)
	}
}

func TestServeRejectsBadOptions(t *testing.T) {
	if err := Serve(context.Background(), ServeOptions{}); err == nil {
		t.Fatal("empty options accepted")
	}
	l := newLayout(t)
	long := filepath.Join(shortDir(t), strings.Repeat("x", 120)+".sock")
	err := Serve(ctxT(t), ServeOptions{SandboxID: l.id, StateDir: l.stateDir, IIDSocket: long})
	if err == nil || !strings.Contains(err.Error(), "too long") {
		t.Fatalf("err = %v", err)
	}
	assertGone(t, filepath.Join(l.stateDir, SocketName))
}
