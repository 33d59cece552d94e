package qemu

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	stdlog "log"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/nexus-sandbox/nexus/agentproto"
	"github.com/nexus-sandbox/nexus/guest/agent"
	"github.com/nexus-sandbox/nexus/host/initramfs"
	"github.com/nexus-sandbox/nexus/host/vmm"
	"github.com/nexus-sandbox/nexus/internal/testutil"
)

// agentGuest boots a real guest with nexus-agent as PID 1 of an
// initramfs built from the host's modules, behind the adapter, with a
// 32 MiB ext4 workspace; it returns the API client, the vsock socket and
// the console file once the agent answered through the relay.
func agentGuest(t *testing.T, ctx context.Context) (*vmm.Client, string, string) {
	t.Helper()
	g := testutil.RealGuest(t)
	dir, api, _ := adapter(t)
	_, file, _, _ := runtime.Caller(0)
	agent := filepath.Join(t.TempDir(), "nexus-agent")
	build := exec.Command("go", "build", "-o", agent, "./cmd/nexus-agent")
	build.Dir = filepath.Join(filepath.Dir(file), "..", "..")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if b, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build nexus-agent: %v\n%s", err, b)
	}
	initrd := filepath.Join(dir, "initrd.gz")
	if _, err := initramfs.Build(initramfs.Options{ModulesDir: filepath.Join("/lib/modules", g.Release), Init: agent, Out: initrd,
		Wanted: initramfs.Wanted, Optional: initramfs.Optional}); err != nil {
		t.Fatal(err)
	}
	ws := filepath.Join(dir, "ws.ext4")
	os.WriteFile(ws, nil, 0o600)
	os.Truncate(ws, 32<<20)
	if out, err := exec.Command("mkfs.ext4", "-q", "-F", ws).CombinedOutput(); err != nil {
		t.Fatalf("mkfs: %v %s", err, out)
	}
	console, vsock := filepath.Join(dir, "console.log"), filepath.Join(dir, "vsock.sock")
	c := vmm.NewClient(api)
	cfg := vmm.Config{
		Payload: vmm.Payload{Kernel: g.Kernel, Initramfs: initrd, Cmdline: "console=ttyS0 panic=-1 no_timer_check"},
		Disks:   []vmm.Disk{{Path: ws, ImageType: vmm.ImageRaw, Serial: agentproto.SerialWorkspace}},
		Memory:  vmm.Memory{Size: 256 << 20}, Cpus: vmm.Cpus{BootVcpus: 1},
		Vsock:  &vmm.Vsock{Cid: 3, Socket: vsock},
		Serial: &vmm.Console{Mode: vmm.ConsoleFile, File: console},
	}
	if err := c.Create(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	if err := c.Boot(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			b, _ := os.ReadFile(console)
			if len(b) > 4000 {
				b = b[len(b)-4000:]
			}
			t.Logf("console:\n%s", b)
		}
	})
	start := time.Now()
	testutil.WaitUntil(t, 150*time.Second, "the agent answering through the relay", func() bool {
		ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		a, err := vmm.DialAgent(ctx, vsock)
		if err != nil {
			return false
		}
		a.Close()
		return true
	})
	t.Logf("agent answered through the relay %.1fs after boot", time.Since(start).Seconds())
	return c, vsock, console
}

// TestRelaySessionsBackToBack: many host sessions, one after another, on
// one real guest's virtio-serial relay, each a fresh DialAgent: every
// other one abandons a read of a 3 MiB file halfway (its data still
// streaming from the guest when the host closes), and every one after it
// must read the whole file intact: no byte of an earlier session reaches
// a later one, and no session waits for a port the guest is reopening.
// Then sessions across pause and resume: one dialled while the VM is
// paused answers once it runs, and one open across a pause goes on.
func TestRelaySessionsBackToBack(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), testutil.Scale(5*time.Minute))
	defer cancel()
	c, vsock, _ := agentGuest(t, ctx)

	data := make([]byte, 3<<20)
	rand.Read(data)
	want := sha256.Sum256(data)
	session := func(what string, f func(a *agentproto.Client, ctx context.Context) error) error {
		ctx, cancel := context.WithTimeout(ctx, testutil.Scale(20*time.Second))
		defer cancel()
		a, err := vmm.DialAgent(ctx, vsock)
		if err != nil {
			return fmt.Errorf("%s: dial: %w", what, err)
		}
		defer a.Close()
		if err := f(a, ctx); err != nil {
			return fmt.Errorf("%s: %w", what, err)
		}
		return nil
	}
	if err := session("write", func(a *agentproto.Client, ctx context.Context) error {
		_, err := a.WriteFile(ctx, "/workspace/big", 0o600, bytes.NewReader(data))
		return err
	}); err != nil {
		t.Fatal(err)
	}
	readWhole := func(a *agentproto.Client, ctx context.Context) error {
		h := sha256.New()
		n, err := a.ReadFile(ctx, "/workspace/big", h)
		if err != nil {
			return err
		}
		if n != int64(len(data)) || !bytes.Equal(h.Sum(nil), want[:]) {
			return fmt.Errorf("read %d bytes that are not the file's %d", n, len(data))
		}
		return a.Ping(ctx)
	}
	abandon := func(a *agentproto.Client, ctx context.Context) error {
		// Stop after the first MiB: the rest is in flight when the
		// session closes.
		_, err := a.ReadFile(ctx, "/workspace/big", &cutoff{left: 1 << 20})
		if !errors.Is(err, errCutoff) {
			return fmt.Errorf("abandoned read: %v", err)
		}
		return nil
	}
	const rounds = 12
	var failures []string
	began := time.Now()
	for i := 0; i < rounds; i++ {
		if err := session(fmt.Sprintf("round %d abandon", i), abandon); err != nil {
			failures = append(failures, err.Error())
		}
		if err := session(fmt.Sprintf("round %d read", i), readWhole); err != nil {
			failures = append(failures, err.Error())
		}
		// Sessions that only say hello, closed at once.
		for j := 0; j < 3; j++ {
			if err := session(fmt.Sprintf("round %d ping %d", i, j), func(a *agentproto.Client, ctx context.Context) error { return a.Ping(ctx) }); err != nil {
				failures = append(failures, err.Error())
			}
		}
	}
	t.Logf("%d sessions in %.1fs", rounds*5, time.Since(began).Seconds())

	// Across pause and resume: a session dialled while the VM is paused
	// is answered once it runs again; one open across a pause goes on.
	for i := 0; i < 3; i++ {
		if err := c.Pause(ctx); err != nil {
			t.Fatal(err)
		}
		done := make(chan error, 1)
		go func() { done <- session(fmt.Sprintf("pause %d: dialled while paused", i), readWhole) }()
		time.Sleep(time.Second)
		if err := c.Resume(ctx); err != nil {
			t.Fatal(err)
		}
		if err := <-done; err != nil {
			failures = append(failures, err.Error())
		}
		if err := session(fmt.Sprintf("pause %d: open across a pause", i), func(a *agentproto.Client, ctx context.Context) error {
			if err := a.Ping(ctx); err != nil {
				return err
			}
			if err := c.Pause(ctx); err != nil {
				return err
			}
			time.Sleep(500 * time.Millisecond)
			if err := c.Resume(ctx); err != nil {
				return err
			}
			return readWhole(a, ctx)
		}); err != nil {
			failures = append(failures, err.Error())
		}
		if err := session(fmt.Sprintf("pause %d: right after resume", i), readWhole); err != nil {
			failures = append(failures, err.Error())
		}
	}
	if len(failures) > 0 {
		t.Fatalf("%d of %d sessions failed:\n%s", len(failures), rounds*5+9, strings.Join(failures, "\n"))
	}
}

var errCutoff = errors.New("cut off on purpose")

// cutoff takes left bytes, then fails the read that is writing to it.
type cutoff struct{ left int }

func (c *cutoff) Write(p []byte) (int, error) {
	if len(p) > c.left {
		return 0, errCutoff
	}
	c.left -= len(p)
	return len(p), nil
}

var _ io.Writer = (*cutoff)(nil)

// TestRelayFramesAndBoundariesWithoutQEMU: the relay in front of the real
// guest agent's ServeSerial over one stream (a unix socket standing for
// QEMU's end of the port), no VM: a session that abandons a read, then a
// host that dies inside a frame, then a session that must read the whole
// file intact. The half frame never reaches the agent (without whole-frame
// forwarding it swallows the next session's reset and that session
// times out), and nothing of the abandoned read reaches a later session.
func TestRelayFramesAndBoundariesWithoutQEMU(t *testing.T) {
	dir := testutil.ShortRoot(t)
	guestRoot := t.TempDir()
	data := make([]byte, 3<<20)
	rand.Read(data)
	os.WriteFile(filepath.Join(guestRoot, "big"), data, 0o600)
	port := filepath.Join(dir, "port.sock")
	l, err := net.Listen("unix", port)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() {
		c, err := l.Accept()
		l.Close()
		if err != nil {
			served <- err
			return
		}
		served <- agent.New(agent.Config{FreezeMounts: []string{}, Root: guestRoot}).ServeSerial(ctx, c, 10*time.Millisecond)
	}()
	r := &relay{agent: port, log: stdlog.New(io.Discard, "", 0), turn: make(chan struct{}, 1)}
	vsock := filepath.Join(dir, "vsock.sock")
	if err := r.listen(vsock); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		r.close()
		cancel()
		<-served
	})
	dial := func() *agentproto.Client {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), testutil.Scale(30*time.Second))
		defer cancel()
		a, err := vmm.DialAgent(ctx, vsock)
		if err != nil {
			t.Fatal(err)
		}
		return a
	}
	for i := 0; i < 5; i++ {
		a := dial()
		if _, err := a.ReadFile(context.Background(), "/big", &cutoff{left: 1 << 20}); !errors.Is(err, errCutoff) {
			t.Fatalf("abandoned read: %v", err)
		}
		a.Close()

		// A host that dies inside a frame: the header promises 100
		// bytes, 10 arrive.
		c, err := net.Dial("unix", vsock)
		if err != nil {
			t.Fatal(err)
		}
		c.SetDeadline(time.Now().Add(testutil.Scale(30 * time.Second)))
		fmt.Fprintf(c, "CONNECT 1024\n")
		if line, err := bufio.NewReader(c).ReadString('\n'); err != nil || !strings.HasPrefix(line, "OK ") {
			t.Fatalf("CONNECT: %q %v", line, err)
		}
		c.Write([]byte{0, 0, 0, 100, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10})
		c.Close()

		a = dial()
		h := sha256.New()
		ctx, cancel := context.WithTimeout(context.Background(), testutil.Scale(30*time.Second))
		n, err := a.ReadFile(ctx, "/big", h)
		want := sha256.Sum256(data)
		if err != nil || n != int64(len(data)) || !bytes.Equal(h.Sum(nil), want[:]) {
			t.Fatalf("round %d: read after an abandoned read and a cut frame: %d bytes, %v", i, n, err)
		}
		if err := a.Ping(ctx); err != nil {
			t.Fatal(err)
		}
		cancel()
		a.Close()
	}
}
