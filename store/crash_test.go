package store_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/oklog/ulid/v2"

	"github.com/nexus-sandbox/nexus/events"
	"github.com/nexus-sandbox/nexus/host/journal"
	"github.com/nexus-sandbox/nexus/internal/testutil"
	"github.com/nexus-sandbox/nexus/store"
)

// The child process is this test binary re-run with these variables set;
// see TestNodeChild.
const (
	childModeEnv = "NEXUS_NODE_TEST_CHILD"
	childRootEnv = "NEXUS_NODE_TEST_ROOT"
)

// TestNodeChild is not a test: it is the body of the child processes the
// crash tests start and kill. Without childModeEnv it does nothing.
func TestNodeChild(t *testing.T) {
	mode := os.Getenv(childModeEnv)
	if mode == "" {
		t.Skip("only runs as a child of the crash tests")
	}
	// The parent holds our stdin open; EOF means it is gone, and a child
	// left behind would keep the store locked for nobody.
	go func() {
		io.Copy(io.Discard, os.Stdin)
		os.Exit(3)
	}()
	ctx := context.Background()
	if mode == "early-cycles" {
		earlyCycles(os.Getenv(childRootEnv))
	}
	n, err := store.Open(ctx, os.Getenv(childRootEnv), store.Options{})
	if err != nil {
		fmt.Fprintf(os.Stderr, "child: open: %v\n", err)
		os.Exit(2)
	}
	switch mode {
	case "hold":
		fmt.Println("open")
		select {}
	case "append":
		for i := 0; ; i++ {
			e := events.New(ulid.Make(), time.Now(), "", events.VolumeCreatedEvent{
				Name: "vol-" + strconv.Itoa(i), Path: "/var/lib/nexus/volumes/vol-" + strconv.Itoa(i), SizeBytes: int64(i),
			})
			seqs, err := n.Append(ctx, e)
			if err != nil {
				fmt.Fprintf(os.Stderr, "child: append %d: %v\n", i, err)
				os.Exit(2)
			}
			// One write per line, issued only after the ack: a line the
			// parent reads is an event the journal acknowledged.
			if _, err := fmt.Fprintf(os.Stdout, "acked %d %s\n", seqs[0], e.ID); err != nil {
				os.Exit(2)
			}
		}
	case "append-group":
		appendConcurrently(ctx, n)
	default:
		fmt.Fprintf(os.Stderr, "child: unknown mode %q\n", mode)
		os.Exit(2)
	}
}

type child struct {
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	stdout *bufio.Reader
}

func startChild(t *testing.T, mode, root string) *child {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestNodeChild$", "-test.count=1")
	cmd.Env = append(os.Environ(), childModeEnv+"="+mode, childRootEnv+"="+root)
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	testutil.StartChild(t, cmd)
	return &child{cmd: cmd, stdin: stdin, stdout: bufio.NewReader(stdout)}
}

// kill SIGKILLs the child. The caller drains its stdout, then reaps it with
// wait: once Wait returns the process is gone and the kernel has closed its
// descriptors, the journal's flock included.
func (c *child) kill(t *testing.T) {
	t.Helper()
	if err := c.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatalf("SIGKILL child: %v", err)
	}
}

// wait reaps the child and asserts SIGKILL is what ended it, not an exit
// of its own (which would mean it stopped appending before the kill).
func (c *child) wait(t *testing.T) {
	t.Helper()
	err := c.cmd.Wait()
	var ee *exec.ExitError
	if !errors.As(err, &ee) {
		t.Fatalf("child ended with %v, want killed by SIGKILL", err)
	}
	ws, ok := ee.Sys().(syscall.WaitStatus)
	if !ok || !ws.Signaled() || ws.Signal() != syscall.SIGKILL {
		t.Fatalf("child ended with %v, want killed by SIGKILL", err)
	}
}

type ack struct {
	seq uint64
	id  ulid.ULID
}

func parseAck(t *testing.T, line string) ack {
	t.Helper()
	f := strings.Fields(line)
	if len(f) != 3 || f[0] != "acked" {
		t.Fatalf("child wrote %q, want \"acked <seq> <id>\"", line)
	}
	seq, err := strconv.ParseUint(f[1], 10, 64)
	if err != nil {
		t.Fatalf("child wrote %q: %v", line, err)
	}
	id, err := ulid.ParseStrict(f[2])
	if err != nil {
		t.Fatalf("child wrote %q: %v", line, err)
	}
	return ack{seq, id}
}

// appendUntilKilled runs an appending child on root, SIGKILLs it once it
// has acknowledged killAt events, and returns every ack it printed, the
// ones written between the kill decision and the kill included.
func appendUntilKilled(t *testing.T, root string, killAt int) []ack {
	t.Helper()
	return killAfterAcks(t, "append", root, killAt)
}

// killAfterAcks is appendUntilKilled for a child in any appending mode.
func killAfterAcks(t *testing.T, mode, root string, killAt int) []ack {
	t.Helper()
	c := startChild(t, mode, root)
	lines := make(chan string)
	readErr := make(chan error, 1)
	go func() {
		defer close(lines)
		for {
			line, err := c.stdout.ReadString('\n')
			if err != nil {
				// A fragment without its newline was cut by the kill; the
				// child writes each line at once, so this should not happen,
				// and if it did the fragment is no promise of an ack.
				readErr <- err
				return
			}
			lines <- strings.TrimSuffix(line, "\n")
		}
	}()
	var acks []ack
	deadline := time.After(testutil.Scale(2 * time.Minute))
	killed := false
	for !killed {
		select {
		case line, ok := <-lines:
			if !ok {
				t.Fatalf("child stopped after %d acks before it was killed: %v", len(acks), <-readErr)
			}
			acks = append(acks, parseAck(t, line))
			if len(acks) >= killAt {
				c.kill(t)
				killed = true
			}
		case <-deadline:
			t.Fatalf("child acknowledged only %d of %d appends in 2 minutes", len(acks), killAt)
		}
	}
	for line := range lines {
		acks = append(acks, parseAck(t, line))
	}
	if err := <-readErr; !errors.Is(err, io.EOF) {
		t.Fatalf("reading the child's acks: %v", err)
	}
	c.wait(t)
	return acks
}

// holdsAcked fails unless recs are numbered 1, 2, ... with no event
// stored twice, and hold every acknowledged event at the sequence it was
// acknowledged at.
func holdsAcked(t *testing.T, cycle int, recs []store.Record, known []ack) {
	t.Helper()
	seen := map[ulid.ULID]uint64{}
	for i, r := range recs {
		if r.Seq != uint64(i+1) {
			t.Fatalf("cycle %d: record %d has seq %d; sequences are not contiguous", cycle, i, r.Seq)
		}
		if prev, dup := seen[r.Event.ID]; dup {
			t.Fatalf("cycle %d: event %s stored twice, at %d and %d", cycle, r.Event.ID, prev, r.Seq)
		}
		seen[r.Event.ID] = r.Seq
	}
	for _, a := range known {
		seq, ok := seen[a.id]
		if !ok {
			t.Fatalf("cycle %d: acknowledged event %s (seq %d) is missing after SIGKILL", cycle, a.id, a.seq)
		}
		if seq != a.seq {
			t.Fatalf("cycle %d: acknowledged event %s was acked at %d, is at %d", cycle, a.id, a.seq, seq)
		}
	}
}

func readAll(t *testing.T, n *store.Store) []store.Record {
	t.Helper()
	var out []store.Record
	if err := n.Events(context.Background(), store.Query{}, func(r store.Record) error {
		out = append(out, r)
		return nil
	}); err != nil {
		t.Fatalf("Events: %v", err)
	}
	return out
}

func TestSIGKILLMidAppend(t *testing.T) {
	if testing.Short() {
		t.Skip("starts and kills child processes")
	}
	root := t.TempDir()
	ctx := context.Background()
	// known is every event the journal must hold: each acked one, and each
	// unacknowledged one a previous cycle found stored.
	var known []ack
	for cycle := 1; cycle <= 3; cycle++ {
		// Vary where in an append the kill lands.
		got := appendUntilKilled(t, root, 200+rand.IntN(50))
		known = append(known, got...)

		n, err := store.Open(ctx, root, store.Options{})
		if err != nil {
			t.Fatalf("cycle %d: open after SIGKILL: %v", cycle, err)
		}
		recs := readAll(t, n)
		holdsAcked(t, cycle, recs, known)
		// The child has one append in flight when it dies, which may or may
		// not have been stored; nothing else can be there.
		if extra := len(recs) - len(known); extra < 0 || extra > 1 {
			t.Fatalf("cycle %d: journal has %d events, %d known; at most one unacknowledged can exist", cycle, len(recs), len(known))
		}

		// The writer's retry after a crash: the same event again must be
		// recognised, not stored a second time.
		last := got[len(got)-1]
		e := recs[last.seq-1].Event
		seqs, err := n.Append(ctx, e)
		if err != nil {
			t.Fatalf("cycle %d: re-append of the last acked event: %v", cycle, err)
		}
		if len(seqs) != 1 || seqs[0] != last.seq {
			t.Fatalf("cycle %d: re-append returned %v, want the original seq %d", cycle, seqs, last.seq)
		}
		lastSeq, err := n.Journal().LastSeq(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if lastSeq != uint64(len(recs)) {
			t.Fatalf("cycle %d: journal grew to %d on a re-append of event %d of %d", cycle, lastSeq, last.seq, len(recs))
		}
		t.Logf("cycle %d: %d acks from the killed child, journal holds %d events (%d stored unacknowledged)", cycle, len(got), len(recs), len(recs)-len(known))
		if err := n.Close(); err != nil {
			t.Fatalf("cycle %d: close: %v", cycle, err)
		}
		// Keep the in-flight event's id too, so the next cycle also checks
		// it stays stored exactly once.
		if len(recs) > len(known) {
			tail := recs[len(recs)-1]
			known = append(known, ack{tail.Seq, tail.Event.ID})
		}
	}
}

func TestSecondOwnerRefused(t *testing.T) {
	if testing.Short() {
		t.Skip("starts and kills child processes")
	}
	root := t.TempDir()
	ctx := context.Background()
	c := startChild(t, "hold", root)
	line, err := c.stdout.ReadString('\n')
	if err != nil || line != "open\n" {
		t.Fatalf("holding child said %q, %v; want \"open\"", line, err)
	}

	n, err := store.Open(ctx, root, store.Options{})
	if err == nil {
		n.Close()
		t.Fatal("opened the store while another process owns it")
	}
	if !errors.Is(err, journal.ErrLocked) {
		t.Fatalf("open while owned elsewhere: %v, want %v", err, journal.ErrLocked)
	}
	if !strings.Contains(err.Error(), strconv.Itoa(c.cmd.Process.Pid)) {
		t.Fatalf("refusal %q does not name the owner's pid %d", err, c.cmd.Process.Pid)
	}

	c.kill(t)
	if _, err := io.Copy(io.Discard, c.stdout); err != nil {
		t.Fatal(err)
	}
	c.wait(t)
	n, err = store.Open(ctx, root, store.Options{})
	if err != nil {
		t.Fatalf("open after the owner was SIGKILLed: %v", err)
	}
	defer n.Close()
	e := events.New(ulid.Make(), time.Now(), "", events.VolumeCreatedEvent{Name: "after", Path: "/v"})
	if seqs, err := n.Append(ctx, e); err != nil || len(seqs) != 1 || seqs[0] != 1 {
		t.Fatalf("append after taking over: %v, %v", seqs, err)
	}
}
