package store_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/oklog/ulid/v2"
	"golang.org/x/sys/unix"

	"github.com/nexus-sandbox/nexus/events"
	"github.com/nexus-sandbox/nexus/host/journal"
	"github.com/nexus-sandbox/nexus/internal/testutil"
	"github.com/nexus-sandbox/nexus/store"
)

// shut reports whether n's journal is still closed: Opened with a done
// context answers at once.
func shut(n *store.Store) bool {
	return errors.Is(n.Opened(canceled()), context.Canceled)
}

func canceled() context.Context {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	return ctx
}

// TestEarlyOpenReadsTheStoreBeforeTheJournal: a root its last Close left
// current opens early: with the journal's server held shut, the mark is
// already gone from the store (taken before the server may start), and
// Sandbox by ID and by handle, a page, Named and the count are answered
// from the store; the journal then opens, an append works, and the next
// early open reads it.
func TestEarlyOpenReadsTheStoreBeforeTheJournal(t *testing.T) {
	ctx := context.Background()
	root, ids := markedRoot(t, 50)
	gate := make(chan struct{})
	var once sync.Once
	release := func() { once.Do(func() { close(gate) }) }
	n, err := store.Open(ctx, root, store.EarlyGated(gate))
	if err != nil {
		t.Fatal(err)
	}
	defer release() // a failure must not leave the journal's open waiting
	if !n.Early() {
		t.Fatal("a root closed cleanly did not open early")
	}
	if n.MarkHeld() {
		t.Fatal("the current mark is still in the store after Open: a process killed from here on would leave it")
	}
	if sb, found, err := n.Sandbox(ctx, ids[3]); err != nil || !found || sb.Handle != "sb-3" {
		t.Fatalf("Sandbox by ID while the journal opens: %+v %v %v", sb, found, err)
	}
	if sb, found, err := n.Sandbox(ctx, "sb-7"); err != nil || !found || sb.ID != ids[7] {
		t.Fatalf("Sandbox by handle while the journal opens: %+v %v %v", sb, found, err)
	}
	if page, err := n.ListedPage(ctx, "", 10); err != nil || len(page) != 10 {
		t.Fatalf("ListedPage while the journal opens: %d %v", len(page), err)
	}
	if refs, err := n.Named(ctx, ids[9][:20]); err != nil || len(refs) != 1 {
		t.Fatalf("Named while the journal opens: %v %v", refs, err)
	}
	if c, err := n.SandboxCount(ctx); err != nil || c != 50 {
		t.Fatalf("SandboxCount while the journal opens: %d %v", c, err)
	}
	if !shut(n) {
		t.Fatal("the journal opened through its gate")
	}
	release()
	// Reads go on while the journal opens and the load replaces the view.
	for !errors.Is(n.Opened(canceled()), nil) {
		if sb, found, err := n.Sandbox(ctx, ids[11]); err != nil || !found || sb.Handle != "sb-11" {
			t.Fatalf("Sandbox while the journal opened: %+v %v %v", sb, found, err)
		}
		if page, err := n.ListedPage(ctx, "", 5); err != nil || len(page) != 5 {
			t.Fatalf("ListedPage while the journal opened: %d %v", len(page), err)
		}
	}
	if err := n.Opened(ctx); err != nil {
		t.Fatal(err)
	}
	id := ulid.Make().String()
	if _, err := n.Append(ctx, created(id, "late")); err != nil {
		t.Fatal(err)
	}
	if err := n.Close(); err != nil {
		t.Fatal(err)
	}
	gate = make(chan struct{})
	n, err = store.Open(ctx, root, store.EarlyGated(gate))
	if err != nil {
		t.Fatal(err)
	}
	early := n.Early()
	sb, found, err := n.Sandbox(ctx, "late")
	close(gate)
	n.Close()
	if !early {
		t.Fatal("a root closed cleanly after an append did not open early")
	}
	if err != nil || !found || sb.ID != id {
		t.Fatalf("the appended sandbox read early: %+v %v %v", sb, found, err)
	}
}

// markedRoot is fillRoot's root closed once more by a store opened Early,
// which catches the sandbox store up to the journal and so marks it.
func markedRoot(t *testing.T, count int) (string, []string) {
	t.Helper()
	root, ids := fillRoot(t, count)
	n, err := store.Open(context.Background(), root, store.Options{Early: true})
	if err != nil {
		t.Fatal(err)
	}
	if err := n.Close(); err != nil {
		t.Fatal(err)
	}
	return root, ids
}

func created(id, handle string) events.Event {
	return events.New(ulid.Make(), time.Now(), id, events.SandboxCreatedEvent{
		Handle: handle, Image: "ghcr.io/nexus/base:24.04", Driver: "process",
		Resources: []events.Resource{{Kind: events.KindRawDisk, Path: "disks/" + id + ".raw"}},
	})
}

// appendBeside appends e to root's journal without the store, as any
// other opener of the journal could (an older build, a server started on
// the directory by hand).
func appendBeside(t *testing.T, root string, e events.Event) {
	t.Helper()
	j, err := journal.Open(context.Background(), journal.Options{Dir: filepath.Join(root, "journal")})
	if err != nil {
		t.Fatal(err)
	}
	defer j.Close()
	subject, err := e.Subject()
	if err != nil {
		t.Fatal(err)
	}
	data, err := events.Encode(e)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := j.Append(context.Background(), journal.Message{Subject: subject, ID: e.DedupID(), Data: data}); err != nil {
		t.Fatal(err)
	}
}

// TestEarlyOpenRefusesAJournalChangedBeside: an event appended to the
// journal without the store leaves the mark in place but the journal's
// files changed, so Open does not read the store early (it would miss the
// sandbox) and, through the ordinary load, holds it.
func TestEarlyOpenRefusesAJournalChangedBeside(t *testing.T) {
	ctx := context.Background()
	root, _ := markedRoot(t, 20)
	id := ulid.Make().String()
	appendBeside(t, root, created(id, "beside"))
	gate := make(chan struct{})
	close(gate)
	n, err := store.Open(ctx, root, store.EarlyGated(gate))
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	if n.Early() {
		t.Fatal("opened early on a journal appended to since the store's mark")
	}
	if sb, found, err := n.Sandbox(ctx, "beside"); err != nil || !found || sb.ID != id {
		t.Fatalf("the sandbox appended beside the store: %+v %v %v", sb, found, err)
	}
}

// TestEarlyOpenCatchesUpAMarkThatLied: a mark that matches the journal's
// files but not its last sequence (forged here: an event appended beside
// the store, then the mark written again for the new files) is said
// loudly once the journal opens, and the store catches up to the journal.
func TestEarlyOpenCatchesUpAMarkThatLied(t *testing.T) {
	ctx := context.Background()
	root, _ := markedRoot(t, 20)
	id := ulid.Make().String()
	appendBeside(t, root, created(id, "beside"))
	if err := store.ForgeMark(root); err != nil {
		t.Fatal(err)
	}
	var logs testutil.Buffer
	gate := make(chan struct{})
	o := store.EarlyGated(gate)
	o.Journal.Logger = slog.New(slog.NewTextHandler(&logs, nil))
	n, err := store.Open(ctx, root, o)
	if err != nil {
		t.Fatal(err)
	}
	early := n.Early()
	_, staleFound, _ := n.Sandbox(ctx, "beside")
	close(gate)
	defer n.Close()
	if !early {
		t.Fatal("the forged mark was not taken for current")
	}
	if staleFound {
		t.Fatal("the early read holds the event the mark did not cover")
	}
	if err := n.Opened(ctx); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(logs.String(), "SANDBOX STORE WAS NOT CURRENT") {
		t.Fatalf("nothing said of the mark that lied; log:\n%s", logs.String())
	}
	if sb, found, err := n.Sandbox(ctx, "beside"); err != nil || !found || sb.ID != id {
		t.Fatalf("the store did not catch up: %+v %v %v", sb, found, err)
	}
}

// TestKilledOpenerLeavesNoMark: a process that opens the store without
// Early (nexusd's own commands) and is SIGKILLed after appending leaves
// no mark: Open took it before the journal's server started.
func TestKilledOpenerLeavesNoMark(t *testing.T) {
	root, _ := markedRoot(t, 20)
	if marked, matches, _, _, _, err := store.MarkTruth(root); err != nil || !marked || !matches {
		t.Fatalf("after a clean close: marked %v matches %v (%v)", marked, matches, err)
	}
	// MarkTruth opened the journal: close a store once more for a mark.
	n, err := store.Open(context.Background(), root, store.Options{Early: true})
	if err != nil {
		t.Fatal(err)
	}
	if err := n.Close(); err != nil {
		t.Fatal(err)
	}
	appendUntilKilled(t, root, 3)
	if marked, _, _, _, _, err := store.MarkTruth(root); err != nil || marked {
		t.Fatalf("after an opener was killed: marked %v (%v)", marked, err)
	}
}

// earlyCycles is the child of TestKillsThroughOpenAndClose: it opens the
// root as the daemon does, appends, closes, and again, saying each step.
func earlyCycles(root string) {
	ctx := context.Background()
	say := func(s string) {
		if _, err := fmt.Println(s); err != nil {
			os.Exit(2)
		}
	}
	for i := 0; ; i++ {
		n, err := store.Open(ctx, root, store.Options{Early: true})
		if err != nil {
			fmt.Fprintf(os.Stderr, "child: open: %v\n", err)
			os.Exit(2)
		}
		say("open")
		if err := n.Opened(ctx); err != nil {
			fmt.Fprintf(os.Stderr, "child: journal: %v\n", err)
			os.Exit(2)
		}
		say("opened")
		id := ulid.Make().String()
		if _, err := n.Append(ctx, created(id, fmt.Sprintf("c-%s", id[20:]))); err != nil {
			fmt.Fprintf(os.Stderr, "child: append: %v\n", err)
			os.Exit(2)
		}
		say("appended")
		if err := n.Close(); err != nil {
			fmt.Fprintf(os.Stderr, "child: close: %v\n", err)
			os.Exit(2)
		}
		say("closed")
	}
}

// TestKillsThroughOpenAndClose SIGKILLs a process that opens a root
// early, appends and closes it over and over, at points spread through
// its open and its close, and then reads the root: a mark that still
// matches the journal's files must be the journal's last sequence and the
// store's position. A mark written before the store caught up, or left
// behind by an open, fails it.
func TestKillsThroughOpenAndClose(t *testing.T) {
	root, _ := markedRoot(t, 10)
	kills := 12
	if testing.Short() {
		kills = 4
	}
	var valid int
	for k := 0; k < kills; k++ {
		c := startChild(t, "early-cycles", root)
		lines := 1 + rand.IntN(12)
		for i := 0; i < lines; i++ {
			if _, err := c.stdout.ReadString('\n'); err != nil {
				t.Fatalf("kill %d: child stopped after %d lines: %v", k, i, err)
			}
		}
		// A kill schedule, not a timing assertion: where within the next
		// step it lands is what varies.
		time.Sleep(time.Duration(rand.IntN(4000)) * time.Microsecond)
		c.kill(t)
		io.Copy(io.Discard, c.stdout)
		c.wait(t)
		marked, matches, markSeq, storeSeq, last, err := store.MarkTruth(root)
		if err != nil {
			t.Fatalf("kill %d: %v", k, err)
		}
		if marked && matches {
			valid++
			if markSeq != last || storeSeq != last {
				t.Fatalf("kill %d after %d lines: a mark that matches the journal's files says %d, the store is at %d, the journal ends at %d", k, lines, markSeq, storeSeq, last)
			}
		}
	}
	t.Logf("%d kills, %d left a mark that matched the journal", kills, valid)
}

// TestEarlyOpenTakesTheLoadForAPlantedFile: with a FIFO or a symlink where
// the load reads its own files (a whole view's snapshot), an open that
// finds the store marked current does not answer early: it takes the load,
// which refuses the root naming the file, and never blocks on the FIFO.
func TestEarlyOpenTakesTheLoadForAPlantedFile(t *testing.T) {
	for _, plant := range []struct {
		name string
		make func(path string) error
		want string
	}{
		{"fifo", func(p string) error { return unix.Mkfifo(p, 0o600) }, "fifo"},
		{"symlink", func(p string) error { return os.Symlink("/dev/null", p) }, "symbolic link"},
	} {
		t.Run(plant.name, func(t *testing.T) {
			root, _ := markedRoot(t, 5)
			snap := filepath.Join(root, "projections", "sagas.snap")
			os.Remove(snap)
			if err := plant.make(snap); err != nil {
				t.Fatal(err)
			}
			gate := make(chan struct{})
			close(gate)
			n, err := store.Open(context.Background(), root, store.EarlyGated(gate))
			if err == nil {
				early := n.Early()
				oerr := n.Opened(context.Background())
				n.Close()
				t.Fatalf("opened (early %v, journal %v) with a %s at %s", early, oerr, plant.name, snap)
			}
			if !strings.Contains(err.Error(), snap) || !strings.Contains(err.Error(), plant.want) {
				t.Fatalf("the refusal does not name the %s at %s: %v", plant.name, snap, err)
			}
		})
	}
}

// TestFailedEarlyOpenLeavesNoMark: a file planted while an early open
// answers reads fails the journal's open behind them (Opened says so,
// naming the file); the store's Close then leaves no mark, so the next
// open takes the load and fails at once, naming the file, instead of
// answering reads early again.
func TestFailedEarlyOpenLeavesNoMark(t *testing.T) {
	ctx := context.Background()
	root, _ := markedRoot(t, 5)
	snap := filepath.Join(root, "projections", "sagas.snap")
	gate := make(chan struct{})
	n, err := store.Open(ctx, root, store.EarlyGated(gate))
	if err != nil {
		t.Fatal(err)
	}
	if !n.Early() {
		close(gate)
		n.Close()
		t.Fatal("a root closed cleanly did not open early")
	}
	os.Remove(snap)
	if err := unix.Mkfifo(snap, 0o600); err != nil {
		t.Fatal(err)
	}
	close(gate)
	if err := n.Opened(ctx); err == nil || !strings.Contains(err.Error(), snap) {
		t.Fatalf("the open behind the early reads, with a FIFO planted: %v", err)
	}
	if err := n.Close(); err != nil {
		t.Fatal(err)
	}
	if marked, _, _, _, _, err := store.MarkTruth(root); err != nil || marked {
		t.Fatalf("after an open that failed: marked %v (%v)", marked, err)
	}
}
