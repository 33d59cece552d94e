package proc

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// roleEnv makes the test binary, spawned by a test here, play a child.
const roleEnv = "PROC_TEST_ROLE"

func TestMain(m *testing.M) {
	if role := os.Getenv(roleEnv); role != "" {
		os.Exit(playRole(role))
	}
	os.Exit(m.Run())
}

// playRole is a spawned child: "serve" signals at once and reports what
// it inherited; "hang" never signals; "die" says why and exits 3;
// "on-usr1" signals when sent SIGUSR1, then says it lives on.
func playRole(role string) int {
	ready := ReadyHook()
	switch role {
	case "serve":
		flags, err := unix.FcntlInt(readyFD, unix.F_GETFD, 0)
		_, inEnv := os.LookupEnv(ReadyEnv)
		fmt.Printf("cloexec=%v env=%v\n", err == nil && flags&unix.FD_CLOEXEC != 0, inEnv)
		ready()
		sleepForever()
	case "hang":
		sleepForever()
	case "die":
		fmt.Println("the child's last words")
		return 3
	case "on-usr1":
		usr1 := make(chan os.Signal, 1)
		signal.Notify(usr1, syscall.SIGUSR1)
		fmt.Println("waiting")
		<-usr1
		ready()
		fmt.Println("lives on")
		sleepForever()
	}
	return 1
}

// sleepForever blocks as a serving process does; a bare select{} is
// reported by the runtime as a deadlock, and the process dies.
func sleepForever() {
	for {
		time.Sleep(time.Hour)
	}
}

// spawnRole spawns the test binary as role with a readiness pipe, its
// output in the returned log; cleanup kills it.
func spawnRole(t *testing.T, role string) (Identity, *Readiness, string) {
	t.Helper()
	log := filepath.Join(t.TempDir(), "child.log")
	logf, err := os.Create(log)
	if err != nil {
		t.Fatal(err)
	}
	defer logf.Close()
	id, rd, err := SpawnReady([]string{os.Args[0], "-test.run=^$"}, append(os.Environ(), roleEnv+"="+role), logf)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		rd.Close()
		syscall.Kill(id.Pid, syscall.SIGKILL)
	})
	return id, rd, log
}

// waitBound is far past any start on a loaded machine: reaching it is a
// failure, never a result.
const waitBound = 2 * time.Minute

func TestSpawnReadySignalsAndHidesThePipe(t *testing.T) {
	_, rd, log := spawnRole(t, "serve")
	if err := rd.Wait(context.Background(), waitBound); err != nil {
		out, _ := os.ReadFile(log)
		t.Fatalf("wait: %v; log: %s", err, out)
	}
	// The line is written before the signal: it is there now.
	out, _ := os.ReadFile(log)
	if !strings.Contains(string(out), "cloexec=true env=false") {
		t.Fatalf("the child must take the pipe close-on-exec and clear %s, so nothing it starts inherits them; it says %q", ReadyEnv, out)
	}
}

// A child SIGKILLed before it serves closes the pipe unwritten: the
// spawner hears it at once, with the signal, and does not wait out its
// bound.
func TestSpawnReadyChildKilledDuringStartup(t *testing.T) {
	id, rd, _ := spawnRole(t, "hang")
	if err := syscall.Kill(id.Pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	err := rd.Wait(context.Background(), waitBound)
	if !errors.Is(err, ErrExitedEarly) || !strings.Contains(err.Error(), "killed") {
		t.Fatalf("want ErrExitedEarly naming the kill, got %v", err)
	}
}

func TestSpawnReadyChildExitsBeforeServing(t *testing.T) {
	_, rd, _ := spawnRole(t, "die")
	err := rd.Wait(context.Background(), waitBound)
	if !errors.Is(err, ErrExitedEarly) || !strings.Contains(err.Error(), "exit status 3") {
		t.Fatalf("want ErrExitedEarly with exit status 3, got %v", err)
	}
}

func TestSpawnReadyBoundAndContext(t *testing.T) {
	_, rd, _ := spawnRole(t, "hang")
	if err := rd.Wait(context.Background(), 50*time.Millisecond); err == nil || !strings.Contains(err.Error(), "did not answer within") {
		t.Fatalf("a child that never serves: want the bound's error, got %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := rd.Wait(ctx, waitBound); !errors.Is(err, context.Canceled) {
		t.Fatalf("a cancelled wait: want context.Canceled, got %v", err)
	}
}

// A child whose spawner stopped listening (it died, or gave up waiting)
// signals into a pipe nobody reads and serves on: the pipe never ends it.
func TestSpawnReadyChildOutlivesItsSpawner(t *testing.T) {
	id, rd, log := spawnRole(t, "on-usr1")
	waitLog(t, id, log, "waiting")
	rd.Close()
	if err := syscall.Kill(id.Pid, syscall.SIGUSR1); err != nil {
		t.Fatal(err)
	}
	waitLog(t, id, log, "lives on")
	if alive, err := Alive(id); !alive || err != nil {
		out, _ := os.ReadFile(log)
		t.Fatalf("the child died signalling into a closed pipe: alive=%v %v; log: %s", alive, err, out)
	}
}

// waitLog waits for the child to say want, failing at once if it dies.
func waitLog(t *testing.T, id Identity, log, want string) {
	t.Helper()
	deadline := time.Now().Add(waitBound)
	for {
		out, _ := os.ReadFile(log)
		if strings.Contains(string(out), want) {
			return
		}
		if alive, _ := Alive(id); !alive {
			t.Fatalf("the child died before it said %q; log: %s", want, out)
		}
		if time.Now().After(deadline) {
			t.Fatalf("the child never said %q; log: %s", want, out)
		}
		time.Sleep(5 * time.Millisecond)
	}
}
