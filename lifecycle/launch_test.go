package lifecycle

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nexus-sandbox/nexus/host/proc"
	"github.com/nexus-sandbox/nexus/internal/testutil"
)

// A process SIGKILLed while it starts ends its launch at once, with an
// error that names it, its end and what its log said: the spawner hears
// the readiness pipe close, not a timeout. The bound is far past any
// start, so reaching it fails the test.
func TestLaunchOfAProcessKilledDuringStartup(t *testing.T) {
	t.Parallel()
	root := testutil.ShortRoot(t)
	log := filepath.Join(root, "logs", "hang.log")
	argv := []string{os.Args[0], "hang", log} // the log names the root, for ShortRoot's cleanup
	type result struct {
		who proc.Identity
		err error
	}
	done := make(chan result, 1)
	go func() {
		who, err := Spawner{}.Launch(context.Background(), Launch{What: "supervisor", Argv: argv, Root: root, Log: log,
			Timeout: time.Hour, Signals: true})
		done <- result{who, err}
	}()
	deadline := time.Now().Add(testutil.Scale(time.Minute))
	var pids []int
	for {
		out, _ := os.ReadFile(log)
		pids = proc.WithArgs(argv[1:]...)
		if len(pids) == 1 && strings.Contains(string(out), "starting, never serving") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the process did not start: pids %v, log %q", pids, out)
		}
		time.Sleep(5 * time.Millisecond)
	}
	if err := syscall.Kill(pids[0], syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	select {
	case r := <-done:
		if r.who.Pid != pids[0] {
			t.Errorf("launch returned %v, want pid %d", r.who, pids[0])
		}
		for _, want := range []string{"supervisor exited before answering", "signal: killed", "starting, never serving", log} {
			if r.err == nil || !strings.Contains(r.err.Error(), want) {
				t.Fatalf("want an error saying %q, got %v", want, r.err)
			}
		}
	case <-time.After(testutil.Scale(time.Minute)):
		t.Fatal("the launch still waits on a process SIGKILLed a minute ago")
	}
}
