package daemon_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/oklog/ulid/v2"

	"github.com/nexus-sandbox/nexus/control"
	"github.com/nexus-sandbox/nexus/control/wire"
	"github.com/nexus-sandbox/nexus/core"
	"github.com/nexus-sandbox/nexus/daemon"
	"github.com/nexus-sandbox/nexus/events"
	"github.com/nexus-sandbox/nexus/internal/testutil"
	"github.com/nexus-sandbox/nexus/store"
)

// The daemon child is this test binary re-run with this variable naming
// the state root; see TestDaemonChild.
const daemonChildEnv = "NEXUS_CONTROL_TEST_DAEMON_ROOT"

// TestDaemonChild is not a test: it is the daemon process the crash test
// starts and SIGKILLs. Without daemonChildEnv it does nothing.
func TestDaemonChild(t *testing.T) {
	root := os.Getenv(daemonChildEnv)
	if root == "" {
		t.Skip("only runs as a child of the daemon crash test")
	}
	// The parent holds our stdin open; EOF means it is gone.
	go func() {
		io.Copy(io.Discard, os.Stdin)
		os.Exit(3)
	}()
	err := daemon.Run(context.Background(), root, daemon.Options{Ready: func(wire.Status) { fmt.Println("ready") }})
	fmt.Fprintf(os.Stderr, "daemon child: %v\n", err)
	os.Exit(2)
}

// startDaemonChild runs a daemon on root in a child process and returns
// once it serves.
func startDaemonChild(t *testing.T, root string) *exec.Cmd {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestDaemonChild$", "-test.count=1")
	cmd.Env = append(os.Environ(), daemonChildEnv+"="+root)
	cmd.Stderr = os.Stderr
	if _, err := cmd.StdinPipe(); err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	testutil.StartChild(t, cmd)
	line, err := bufio.NewReader(stdout).ReadString('\n')
	if err != nil || line != "ready\n" {
		t.Fatalf("daemon child said %q, %v", line, err)
	}
	return cmd
}

// crashWriter appends about its own sandbox, with or without the guard's
// expectation, until its append goes unanswered.
type crashWriter struct {
	sandbox string
	expect  bool
	rev     uint64 // the sandbox's last acknowledged sequence
	acked   map[ulid.ULID]uint64
	pending *events.Event // sent, never answered
}

func (w *crashWriter) appendOnce(ctx context.Context, b control.Backend, e events.Event) ([]uint64, error) {
	if !w.expect {
		return b.Append(ctx, e)
	}
	return b.AppendExpect(ctx, []core.Expect{{Entity: core.Sandbox(w.sandbox), Seq: w.rev}}, e)
}

// A daemon SIGKILLed while concurrent writers' appends are in its groups:
// no acknowledged append is lost or moved, none is stored twice, and an
// append that got no answer, sent again through the next daemon with the
// same event (what a client does), is stored once and answered with the
// sequence it was stored at, with or without an expectation.
func TestSIGKILLedDaemonMidGroup(t *testing.T) {
	if testing.Short() {
		t.Skip("starts and kills daemon processes")
	}
	root := testutil.ShortRoot(t)
	sock := filepath.Join(root, wire.SocketName)
	ctx := context.Background()
	const writers = 16
	ws := make([]*crashWriter, writers)
	for i := range ws {
		ws[i] = &crashWriter{sandbox: ulid.Make().String(), expect: i%2 == 0, acked: map[ulid.ULID]uint64{}}
	}
	for cycle := 1; cycle <= 3; cycle++ {
		d := startDaemonChild(t, root)
		// Unanswered appends of the last cycle first, through this daemon.
		resend(t, sock, ws, cycle)
		var total sync.WaitGroup
		var mu sync.Mutex
		acks := 0
		killed := make(chan struct{})
		killAt := 200 + 100*cycle
		for _, w := range ws {
			total.Add(1)
			go func() {
				defer total.Done()
				c := control.NewClient(sock) // no daemon is started for it
				defer c.Close()
				for {
					e := events.New(ulid.Make(), time.Now(), w.sandbox, events.SandboxCreatedEvent{Image: "i", Driver: "process"})
					seqs, err := w.appendOnce(ctx, c, e)
					if err != nil {
						select {
						case <-killed:
							w.pending = &e
						default:
							t.Errorf("append before the kill: %v", err)
						}
						return
					}
					w.acked[e.ID], w.rev = seqs[0], seqs[0]
					mu.Lock()
					acks++
					if acks == killAt {
						close(killed)
						d.Process.Signal(syscall.SIGKILL)
					}
					mu.Unlock()
				}
			}()
		}
		total.Wait()
		if err := d.Wait(); err == nil || d.ProcessState.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
			t.Fatalf("cycle %d: daemon ended with %v, want SIGKILL", cycle, err)
		}
		if t.Failed() {
			return
		}
		checkJournal(t, root, ws, cycle)
	}
	d := startDaemonChild(t, root)
	resend(t, sock, ws, 4)
	d.Process.Signal(syscall.SIGKILL)
	d.Wait()
	checkJournal(t, root, ws, 4)
}

// resend sends each writer's unanswered append again, as a client does
// through the next daemon, and takes its answer as the acknowledgement.
func resend(t *testing.T, sock string, ws []*crashWriter, cycle int) {
	t.Helper()
	for _, w := range ws {
		if w.pending == nil {
			continue
		}
		c := control.NewClient(sock)
		seqs, err := w.appendOnce(context.Background(), c, *w.pending)
		c.Close()
		if err != nil {
			t.Fatalf("cycle %d: unanswered append %s sent again (expectation %v): %v", cycle, w.pending.ID, w.expect, err)
		}
		w.acked[w.pending.ID], w.rev, w.pending = seqs[0], seqs[0], nil
	}
}

// checkJournal opens root in process and checks every acknowledged append
// is stored once at its sequence, and no event twice.
func checkJournal(t *testing.T, root string, ws []*crashWriter, cycle int) {
	t.Helper()
	n, err := store.Open(context.Background(), root, store.Options{})
	if err != nil {
		t.Fatalf("cycle %d: open after SIGKILL: %v", cycle, err)
	}
	defer n.Close()
	stored := map[ulid.ULID]uint64{}
	err = n.Events(context.Background(), store.Query{}, func(r store.Record) error {
		if prev, dup := stored[r.Event.ID]; dup {
			return fmt.Errorf("event %s stored twice, at %d and %d", r.Event.ID, prev, r.Seq)
		}
		stored[r.Event.ID] = r.Seq
		return nil
	})
	if err != nil {
		t.Fatalf("cycle %d: %v", cycle, err)
	}
	acked, pending := 0, 0
	for _, w := range ws {
		for id, seq := range w.acked {
			if got, ok := stored[id]; !ok || got != seq {
				t.Fatalf("cycle %d: acknowledged event %s (seq %d) is at %d (stored: %v) after SIGKILL", cycle, id, seq, got, ok)
			}
			acked++
		}
		if w.pending != nil {
			pending++
		}
	}
	if extra := len(stored) - acked; extra < 0 || extra > pending {
		t.Fatalf("cycle %d: %d events stored, %d acknowledged, %d unanswered", cycle, len(stored), acked, pending)
	}
	t.Logf("cycle %d: %d acknowledged, %d unanswered, %d of those stored", cycle, acked, pending, len(stored)-acked)
}
