package vmm

import (
	"context"
	"errors"
	"net"
	"path/filepath"
	"syscall"
	"testing"
	"time"
)

// TestIsDead: only a refused dial or a missing socket is death; a server
// that never answers is not.
func TestIsDead(t *testing.T) {
	dir := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	_, err := NewClient(filepath.Join(dir, "missing.sock")).Ping(ctx)
	if !IsDead(err) {
		t.Fatalf("missing socket: IsDead(%v) = false", err)
	}

	// A socket file with nobody listening, as a crashed server leaves.
	stale := filepath.Join(dir, "stale.sock")
	l, err := net.ListenUnix("unix", &net.UnixAddr{Name: stale, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	l.SetUnlinkOnClose(false)
	l.Close()
	_, err = NewClient(stale).Ping(ctx)
	if !IsDead(err) || !errors.Is(err, syscall.ECONNREFUSED) {
		t.Fatalf("stale socket: IsDead(%v) = false", err)
	}

	// A listener that never answers: a timeout proves nothing.
	hung := filepath.Join(dir, "hung.sock")
	hl, err := net.Listen("unix", hung)
	if err != nil {
		t.Fatal(err)
	}
	defer hl.Close()
	tctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	defer cancel()
	_, err = NewClient(hung).Ping(tctx)
	if err == nil || IsDead(err) {
		t.Fatalf("hung server: IsDead(%v) = true", err)
	}
	if IsDead(nil) || IsDead(errors.New("connection refused")) {
		t.Fatal("IsDead of nil or a plain error")
	}
}
