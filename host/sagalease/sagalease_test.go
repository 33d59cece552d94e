package sagalease

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
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

func TestReleasedLeaseIsNotSharedWithAWaiter(t *testing.T) {
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
	a.Release()
	b := <-got
	defer b.Release()
	// A third process must see b's lease: b holds the file the path names.
	_, err = Acquire(context.Background(), root, ent, Holder{Kind: "rm"}, false)
	var he *HeldError
	if !errors.As(err, &he) || he.By.Kind != "create" {
		t.Fatalf("after release, b's lease is invisible: %v", err)
	}
}

// leaseFiles lists what leases/ holds.
func leaseFiles(t *testing.T, root string) []string {
	t.Helper()
	entries, err := os.ReadDir(filepath.Join(root, Dir))
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	var out []string
	for _, e := range entries {
		out = append(out, e.Name())
	}
	return out
}

// A released lease leaves no file: leases/ holds the held leases only,
// however many entities ever had one.
func TestReleaseLeavesNoFile(t *testing.T) {
	root := t.TempDir()
	held, err := Acquire(context.Background(), root, "sandbox/HELD", Holder{Kind: "start"}, false)
	if err != nil {
		t.Fatal(err)
	}
	defer held.Release()
	for i := range 20 {
		l, err := Acquire(context.Background(), root, fmt.Sprintf("sandbox/S%d", i), Holder{Kind: "stop"}, false)
		if err != nil {
			t.Fatal(err)
		}
		l.Release()
	}
	if got := leaseFiles(t, root); !slices.Equal(got, []string{"sandbox.HELD.lease"}) {
		t.Fatalf("leases/ holds %v, want the held lease's file alone", got)
	}
}

// Many runners taking and releasing one entity's lease at once: at no time
// do two hold it, although each release unlinks the file the others may
// have opened (a runner that locked an unlinked file must retry).
func TestReleaseUnderContentionKeepsOneHolder(t *testing.T) {
	root := t.TempDir()
	var inside, overlaps atomic.Int32
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 200 {
				l, err := Acquire(context.Background(), root, "sandbox/X", Holder{Kind: "start"}, true)
				if err != nil {
					t.Error(err)
					return
				}
				if inside.Add(1) != 1 {
					overlaps.Add(1)
				}
				runtime.Gosched()
				inside.Add(-1)
				l.Release()
			}
		}()
	}
	wg.Wait()
	if n := overlaps.Load(); n > 0 {
		t.Fatalf("two runners held the lease at once %d times", n)
	}
	if got := leaseFiles(t, root); len(got) != 0 {
		t.Fatalf("leases/ holds %v after every runner released", got)
	}
}

// Leftovers lists the files no one holds (a dead holder's, an abandoned
// one, an older root's) and not a held one; Clear removes those it is
// given, leaving a held one, still held, to its holder.
func TestLeftoversAndClear(t *testing.T) {
	root := t.TempDir()
	held, err := Acquire(context.Background(), root, "sandbox/HELD", Holder{Kind: "start"}, false)
	if err != nil {
		t.Fatal(err)
	}
	defer held.Release()
	abandoned, err := Acquire(context.Background(), root, "sandbox/GAVEUP", Holder{Kind: "create"}, false)
	if err != nil {
		t.Fatal(err)
	}
	abandoned.Abandon()
	for _, name := range []string{"sandbox.OLD1.lease", "volume.v.lease", "notes.txt"} {
		if err := os.WriteFile(filepath.Join(root, Dir, name), []byte("{}\n"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	free, err := Leftovers(root)
	want := []string{"sandbox.GAVEUP.lease", "sandbox.OLD1.lease", "volume.v.lease"}
	if err != nil || !slices.Equal(free, want) {
		t.Fatalf("Leftovers = %v, %v; want %v", free, err, want)
	}
	// A file named but taken since, and one gone since, are left alone.
	taken, err := Acquire(context.Background(), root, "volume/v", Holder{Kind: "volume rm"}, false)
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Release()
	n, err := Clear(root, append(free, "sandbox.GONE.lease"))
	if err != nil || n != 2 {
		t.Fatalf("Clear = %d, %v; want the 2 files still free", n, err)
	}
	if got := leaseFiles(t, root); !slices.Equal(got, []string{"notes.txt", "sandbox.HELD.lease", "volume.v.lease"}) {
		t.Fatalf("leases/ holds %v after Clear", got)
	}
	var he *HeldError
	if _, err := Acquire(context.Background(), root, "sandbox/HELD", Holder{Kind: "rm"}, false); !errors.As(err, &he) {
		t.Fatalf("the held lease after Clear: %v, want still held", err)
	}
	if free, err := Leftovers(t.TempDir()); len(free) != 0 || err != nil {
		t.Fatalf("Leftovers of a root without leases/ = %v, %v", free, err)
	}
}
