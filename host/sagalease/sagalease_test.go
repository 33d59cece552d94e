package sagalease

import (
	"bufio"
	"context"
	"errors"
	"os"
	"os/exec"
	"syscall"
	"testing"
	"time"
)

const childEnv = "NEXUS_SAGALEASE_CHILD_ROOT"

// TestChildHolds is the body of the child process: it takes the lease and
// waits to be killed.
func TestChildHolds(t *testing.T) {
	root := os.Getenv(childEnv)
	if root == "" {
		t.Skip("only runs as the child of TestLeaseDiesWithItsHolder")
	}
	if _, err := Acquire(context.Background(), root, "sandbox/X", Holder{Kind: "start", Saga: "S1"}, false); err != nil {
		os.Exit(2)
	}
	os.Stdout.WriteString("held\n")
	time.Sleep(time.Hour)
}

func TestLeaseDiesWithItsHolder(t *testing.T) {
	root := t.TempDir()
	cmd := exec.Command(os.Args[0], "-test.run", "^TestChildHolds$")
	cmd.Env = append(os.Environ(), childEnv+"="+root)
	out, _ := cmd.StdoutPipe()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill()
	if line, _ := bufio.NewReader(out).ReadString('\n'); line != "held\n" {
		t.Fatalf("child said %q", line)
	}
	_, err := Acquire(context.Background(), root, "sandbox/X", Holder{Kind: "rm"}, false)
	var he *HeldError
	if !errors.As(err, &he) || he.By.Pid != cmd.Process.Pid || he.By.Kind != "start" || he.By.Saga != "S1" {
		t.Fatalf("Acquire of a held lease = %v, want HeldError naming pid %d", err, cmd.Process.Pid)
	}
	// A waiter gets the lease as soon as the holder dies, however it dies.
	got := make(chan error, 1)
	go func() {
		l, err := Acquire(context.Background(), root, "sandbox/X", Holder{Kind: "recover"}, true)
		l.Release()
		got <- err
	}()
	cmd.Process.Signal(syscall.SIGKILL)
	cmd.Wait()
	if err := <-got; err != nil {
		t.Fatalf("waiter after the holder's SIGKILL: %v", err)
	}
	l, err := Acquire(context.Background(), root, "sandbox/X", Holder{Kind: "rm"}, false)
	if err != nil {
		t.Fatalf("lease still held after its holder died and the waiter released it: %v", err)
	}
	l.Release()
}

func TestRemovedLeaseIsNotSharedWithAWaiter(t *testing.T) {
	root := t.TempDir()
	ent := "volume/v"
	a, err := Acquire(context.Background(), root, ent, Holder{Kind: "volume rm"}, false)
	if err != nil {
		t.Fatal(err)
	}
	// b opens the file before a removes it, then waits for the lock.
	got := make(chan *Lease, 1)
	go func() {
		l, _ := Acquire(context.Background(), root, ent, Holder{Kind: "create"}, true)
		got <- l
	}()
	time.Sleep(20 * time.Millisecond)
	a.Remove()
	b := <-got
	defer b.Release()
	// A third process must see b's lease: b holds the file the path names.
	_, err = Acquire(context.Background(), root, ent, Holder{Kind: "rm"}, false)
	var he *HeldError
	if !errors.As(err, &he) || he.By.Kind != "create" {
		t.Fatalf("after remove, b's lease is invisible: %v", err)
	}
}
