package unixsock

import (
	"context"
	"errors"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// deepDir returns a directory whose socket paths exceed sun_path.
func deepDir(t *testing.T) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), strings.Repeat("d", 60), strings.Repeat("e", 60))
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	return dir
}

func echoOnce(t *testing.T, l net.Listener) {
	t.Helper()
	go func() {
		c, err := l.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		io.Copy(c, c)
	}()
}

func roundTrip(t *testing.T, path string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := Dial(ctx, path)
	if err != nil {
		t.Fatalf("dial %s: %v", path, err)
	}
	defer c.Close()
	if _, err := c.Write([]byte("ping")); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 4)
	if _, err := io.ReadFull(c, buf); err != nil || string(buf) != "ping" {
		t.Fatalf("echo = %q, %v", buf, err)
	}
}

func TestListenAndDialBeyondSunPath(t *testing.T) {
	for _, dir := range []string{t.TempDir(), deepDir(t)} {
		path := filepath.Join(dir, "sb-01JABCDEFGHJKMNPQRSTVWXYZ0.sock")
		l, err := Listen(path)
		if err != nil {
			t.Fatalf("listen at %d bytes: %v", len(path), err)
		}
		fi, err := os.Lstat(path)
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode().Type() != os.ModeSocket || fi.Mode().Perm() != 0o600 {
			t.Fatalf("%s: mode %v, want a 0600 socket", path, fi.Mode())
		}
		echoOnce(t, l)
		roundTrip(t, path)
		if err := l.Close(); err != nil {
			t.Fatal(err)
		}
		if _, err := os.Lstat(path); !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("close left %s: %v", path, err)
		}
	}
}

func TestListenReplacesStaleButRefusesLive(t *testing.T) {
	path := filepath.Join(deepDir(t), "api.sock")
	first, err := Listen(path)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := Listen(path); !errors.Is(err, ErrInUse) {
		t.Fatalf("second listener on a live path: %v, want ErrInUse", err)
	}
	// A dead owner leaves the file: close the descriptor only.
	first.Listener.Close()
	if _, err := os.Lstat(path); err != nil {
		t.Fatalf("the stale file should still exist: %v", err)
	}
	second, err := Listen(path)
	if err != nil {
		t.Fatalf("replacing a stale socket: %v", err)
	}
	defer second.Close()
	// The first listener's Close must not unlink its successor's socket.
	first.Close()
	echoOnce(t, second)
	roundTrip(t, path)
}

func TestListenRefusesNonSocket(t *testing.T) {
	path := filepath.Join(t.TempDir(), "api.sock")
	if err := os.WriteFile(path, []byte("keep"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := Listen(path); err == nil {
		t.Fatal("listen replaced a regular file")
	}
	if b, _ := os.ReadFile(path); string(b) != "keep" {
		t.Fatalf("regular file changed: %q", b)
	}
}

func TestDialDeadSocketIsRefused(t *testing.T) {
	path := filepath.Join(deepDir(t), "api.sock")
	l, err := Listen(path)
	if err != nil {
		t.Fatal(err)
	}
	l.Listener.Close()
	_, err = Dial(context.Background(), path)
	if err == nil || !strings.Contains(err.Error(), "refused") {
		t.Fatalf("dial of a dead socket: %v, want connection refused", err)
	}
}
