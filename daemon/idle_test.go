package daemon_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/nexus-sandbox/nexus/control"
	"github.com/nexus-sandbox/nexus/control/local"
	"github.com/nexus-sandbox/nexus/control/wire"
	"github.com/nexus-sandbox/nexus/daemon"
	"github.com/nexus-sandbox/nexus/internal/testutil"
	"github.com/nexus-sandbox/nexus/store"
)

// runDaemon runs Run with o on a new root and returns once it
// answers, with the channel Run's result arrives on.
func runDaemon(t *testing.T, o daemon.Options) (string, chan error) {
	t.Helper()
	root := t.TempDir()
	return root, runDaemonAt(t, root, o)
}

// runDaemonAt is runDaemon on root.
func runDaemonAt(t *testing.T, root string, o daemon.Options) chan error {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	ready := make(chan struct{})
	o.Ready = func(wire.Status) { close(ready) }
	go func() { done <- daemon.Run(ctx, root, o) }()
	t.Cleanup(func() {
		cancel()
		<-done
	})
	select {
	case <-ready:
	case err := <-done:
		t.Fatalf("daemon exited before it was ready: %v", err)
	case <-time.After(testutil.Scale(30 * time.Second)):
		t.Fatal("daemon not ready after 30s")
	}
	return done
}

// wantExit waits for Run to return nil and puts its result back for
// the cleanup.
func wantExit(t *testing.T, done chan error, why string) {
	t.Helper()
	select {
	case err := <-done:
		done <- err
		if err != nil {
			t.Fatalf("daemon %s: %v", why, err)
		}
	case <-time.After(testutil.Scale(2 * time.Minute)):
		t.Fatalf("daemon did not exit (%s)", why)
	}
}

// TestIdleDaemonStaysForClientsThenExits: a connected client (even idle
// between requests) keeps an idling daemon; once it closes, the daemon
// exits, its socket is gone, and the store opens in process at once.
func TestIdleDaemonStaysForClientsThenExits(t *testing.T) {
	root, done := runDaemon(t, daemon.Options{Idle: 200 * time.Millisecond, Auto: true})
	b := connect(t, root)
	for range 5 {
		time.Sleep(100 * time.Millisecond)
		if _, err := b.Append(context.Background(), volumeEvent(1)); err != nil {
			t.Fatalf("append to an idling daemon with a client: %v", err)
		}
	}
	time.Sleep(time.Second) // five idle periods, client connected between requests
	select {
	case err := <-done:
		done <- err
		t.Fatalf("daemon left a connected client: %v", err)
	default:
	}
	b.Close()
	wantExit(t, done, "after its last client closed")
	if _, err := os.Lstat(filepath.Join(root, wire.SocketName)); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("socket after idle exit: %v", err)
	}
	n, err := store.Open(context.Background(), root, store.Options{})
	if err != nil {
		t.Fatalf("store after idle exit: %v", err)
	}
	defer n.Close()
	var count int
	n.Events(context.Background(), store.Query{}, func(store.Record) error { count++; return nil })
	if count != 5 {
		t.Fatalf("%d events after idle exit, want 5", count)
	}
}

// TestRetire: an exclusive connect retires an on-demand daemon and owns the
// store in process; a hand-started daemon is used as it is.
func TestRetire(t *testing.T) {
	root, done := runDaemon(t, daemon.Options{Auto: true})
	b, err := control.ConnectWith(context.Background(), root, control.ConnectOptions{Wait: time.Minute, Exclusive: true, Auto: &control.AutoStart{}, InProcess: local.InProcess{}})
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := b.(local.Backend); !ok {
		t.Fatalf("exclusive connect beside an on-demand daemon gave %T", b)
	}
	b.Close()
	wantExit(t, done, "retired")

	hand := startDaemon(t, "")
	b, err = control.ConnectWith(context.Background(), hand.root, control.ConnectOptions{Wait: time.Minute, Exclusive: true, Auto: &control.AutoStart{}, InProcess: local.InProcess{}})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	if _, ok := b.(*control.Client); !ok {
		t.Fatalf("exclusive connect beside a hand-started daemon gave %T", b)
	}
}
