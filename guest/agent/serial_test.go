package agent

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/nexus-sandbox/nexus/agentproto"
)

// TestServeSerialSessionBoundaries drives ServeSerial over one stream, as
// the qemu adapter's relay does over a virtio-serial port: a reset in the
// middle of a read ends that session, its echo is the last thing the old
// session's frames precede (no data of the abandoned read after it), and
// the next session starts fresh (hello first); a frame that does not
// decode makes the agent skip to the next reset, whose echo comes back.
func TestServeSerialSessionBoundaries(t *testing.T) {
	root := t.TempDir()
	os.WriteFile(filepath.Join(root, "big"), make([]byte, 4<<20), 0o600)
	a := New(Config{FreezeMounts: []string{}, Root: root})
	host, guest := net.Pipe()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.ServeSerial(ctx, guest, 10*time.Millisecond) }()
	t.Cleanup(func() {
		cancel()
		host.Close()
		<-done
	})
	frames := make(chan *agentproto.Message, 1024)
	go func() {
		for {
			m, err := agentproto.Read(host)
			if err != nil {
				close(frames)
				return
			}
			frames <- m
		}
	}()
	send := func(m *agentproto.Message) {
		t.Helper()
		if err := agentproto.Write(host, m); err != nil {
			t.Fatal(err)
		}
	}
	next := func() *agentproto.Message {
		t.Helper()
		select {
		case m, ok := <-frames:
			if !ok {
				t.Fatal("the agent closed the stream")
			}
			return m
		case <-time.After(10 * time.Second):
			t.Fatal("no frame from the agent within 10s")
		}
		return nil
	}
	send(&agentproto.Message{Type: agentproto.THello, ID: 1, Version: 1})
	if m := next(); m.Type != agentproto.THello {
		t.Fatalf("hello answered %s", brief(m))
	}
	send(&agentproto.Message{Type: agentproto.TRead, ID: 2, Path: "/big"})
	if m := next(); m.Type != agentproto.TData || m.ID != 2 {
		t.Fatalf("read answered %s", brief(m))
	}
	send(&agentproto.Message{Type: agentproto.TReset, ID: 9, Nonce: 42})
	for {
		m := next()
		if m.Type == agentproto.TReset {
			if m.Nonce != 42 || m.ID != 9 {
				t.Fatalf("reset echoed as %s", brief(m))
			}
			break
		}
		// The read's own frames may precede the echo, its end included
		// when the agent sent all 4 MiB before it read the reset.
		if m.ID != 2 || m.Type != agentproto.TData && m.Type != agentproto.TOK {
			t.Fatalf("before the echo: %s", brief(m))
		}
	}
	// A fresh session: hello first, and nothing of the read.
	send(&agentproto.Message{Type: agentproto.TPing, ID: 2})
	if m := next(); m.Type != agentproto.TError || m.ID != 2 {
		t.Fatalf("after the reset, a ping before hello answered %+v (the old session went on?)", m)
	}
	send(&agentproto.Message{Type: agentproto.THello, ID: 3, Version: 1})
	if m := next(); m.Type != agentproto.THello || m.ID != 3 {
		t.Fatalf("hello in the new session answered %s", brief(m))
	}

	// A frame that is not one (a stream cut inside a frame, then another
	// frame's bytes): the agent skips to the next reset.
	host.Write([]byte{0, 0, 0, 12, 0xc1, 0xc1, 0xc1, 0xc1, 0xc1, 0xc1, 0xc1, 0xc1, 0xc1, 0xc1, 0xc1, 0xc1})
	send(&agentproto.Message{Type: agentproto.TPing, ID: 4})
	send(&agentproto.Message{Type: agentproto.TReset, ID: 5, Nonce: 7})
	if m := next(); m.Type != agentproto.TReset || m.Nonce != 7 {
		t.Fatalf("after a broken frame, the reset answered %s", brief(m))
	}
	send(&agentproto.Message{Type: agentproto.THello, ID: 6, Version: 1})
	if m := next(); m.Type != agentproto.THello || m.ID != 6 {
		t.Fatalf("hello after the resync answered %s", brief(m))
	}
}

// brief names a frame without its data.
func brief(m *agentproto.Message) string {
	return fmt.Sprintf("%s id %d nonce %d (%d data bytes) %s", m.Type, m.ID, m.Nonce, len(m.Data), m.Error)
}

// The agent skips its wait for a virtio-serial port only when the kernel
// command line carries nexus.agent=vsock as a word of its own.
func TestVsockOnly(t *testing.T) {
	for cmdline, want := range map[string]bool{
		"console=ttyS0 root=/dev/vda rw nexus.agent=vsock": true,
		"nexus.agent=vsock":                                    true,
		"console=ttyS0 root=/dev/vda rw":                       false,
		"console=ttyS0 nexus.agent=vsockx":                     false,
		"console=ttyS0 xnexus.agent=vsock":                     false,
		"nexus.mount=nexus-vol-data:/data nexus.agent=vsock\n": true, // /proc/cmdline ends in a newline
		"": false,
	} {
		if got := VsockOnly(cmdline); got != want {
			t.Errorf("VsockOnly(%q) = %v, want %v", cmdline, got, want)
		}
	}
}
