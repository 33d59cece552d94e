package lease

import (
	"bufio"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestSharedAndExclusive: shared holders coexist, an exclusive try fails
// while any holds and names every holder's pid from the kernel's table,
// and a shared acquire waits out an exclusive holder.
func TestSharedAndExclusive(t *testing.T) {
	path := filepath.Join(t.TempDir(), ".lease")
	ctx := context.Background()
	a, err := AcquireShared(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	b, err := AcquireShared(ctx, path)
	if err != nil {
		t.Fatal("second shared holder refused:", err)
	}
	_, err = TryAcquireNaming(path)
	if !errors.Is(err, ErrHeld) || !strings.Contains(err.Error(), "pid "+strconv.Itoa(os.Getpid())+" (shared") {
		t.Fatalf("exclusive while shared held: %v", err)
	}
	hs, err := Holders(path)
	if err != nil || len(hs) != 2 || hs[0].Exclusive {
		t.Fatalf("holders = %+v, %v; want two shared", hs, err)
	}
	a.Release()
	b.Release()
	ex, err := TryAcquireNaming(path)
	if err != nil {
		t.Fatal("exclusive after release:", err)
	}
	short, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	if _, err := AcquireShared(short, path); !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "exclusive") {
		t.Fatalf("shared while exclusive held: %v", err)
	}
	got := make(chan error, 1)
	go func() {
		l, err := AcquireShared(ctx, path)
		if err == nil {
			l.Release()
		}
		got <- err
	}()
	ex.Release()
	if err := <-got; err != nil {
		t.Fatal("shared waiter after exclusive release:", err)
	}
}

// TestHoldersNamesOtherProcess: a lease held by another, real process is
// attributed to that pid, and dropped by the kernel when it is killed.
func TestHoldersNamesOtherProcess(t *testing.T) {
	flock, err := exec.LookPath("flock")
	if err != nil {
		t.Fatal("flock(1) is not installed (make setup-fast installs util-linux):", err)
	}
	path := filepath.Join(t.TempDir(), ".lease")
	os.WriteFile(path, nil, 0o600)
	// The child says "ready" only once it holds the lease.
	cmd := exec.Command(flock, "--shared", "--no-fork", path, "sh", "-c", "echo ready; exec sleep 60")
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill()
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil || line != "ready\n" {
		t.Fatalf("child: %q %v", line, err)
	}
	_, err = TryAcquireNaming(path)
	if err == nil || !strings.Contains(err.Error(), "pid "+strconv.Itoa(cmd.Process.Pid)) {
		t.Fatalf("refusal does not name the holder %d: %v", cmd.Process.Pid, err)
	}
	cmd.Process.Kill()
	cmd.Wait()
	l, err := TryAcquire(path)
	if err != nil {
		t.Fatal("lease not dropped when its holder was killed:", err)
	}
	l.Release()
}
