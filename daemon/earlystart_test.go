package daemon_test

import (
	"context"
	"log/slog"
	"strings"
	"syscall"
	"testing"

	"github.com/nexus-sandbox/nexus/daemon"
	"github.com/nexus-sandbox/nexus/internal/testutil"
)

const earlyLine = "answering reads of the sandbox store while the journal opens"

// startLogged runs a daemon on root and returns it with its log.
func startLogged(t *testing.T, root string) (*running, *testutil.Buffer) {
	t.Helper()
	var logs testutil.Buffer
	d := startDaemonWith(t, root, daemon.Options{Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	return d, &logs
}

// TestDaemonStartsEarlyOnlyAfterACleanStop: a daemon stopped cleanly
// leaves the store marked current, and the next one answers reads before
// its journal opens; a daemon SIGKILLed after an append leaves no mark,
// and the next one opens the journal first; an append through an early
// daemon works and is read by the next one.
func TestDaemonStartsEarlyOnlyAfterACleanStop(t *testing.T) {
	root := t.TempDir()
	d, _ := startLogged(t, root)
	b := connect(t, root)
	if _, err := b.Append(context.Background(), volumeEvent(1)); err != nil {
		t.Fatal(err)
	}
	b.Close()
	if err := d.stop(t); err != nil {
		t.Fatal(err)
	}

	d, logs := startLogged(t, root)
	if !strings.Contains(logs.String(), earlyLine) {
		t.Fatalf("the daemon after a clean stop did not start early; log:\n%s", logs.String())
	}
	b = connect(t, root)
	if _, err := b.Append(context.Background(), volumeEvent(2)); err != nil {
		t.Fatal(err)
	}
	if got := len(allEvents(t, b)); got != 2 {
		t.Fatalf("%d events after an append through an early daemon, want 2", got)
	}
	b.Close()
	if err := d.stop(t); err != nil {
		t.Fatal(err)
	}

	child := startDaemonChild(t, root)
	b = connect(t, root)
	if _, err := b.Append(context.Background(), volumeEvent(3)); err != nil {
		t.Fatal(err)
	}
	b.Close()
	if err := child.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	child.Wait()
	d, logs = startLogged(t, root)
	if strings.Contains(logs.String(), earlyLine) {
		t.Fatalf("the daemon after a SIGKILLed one started early; log:\n%s", logs.String())
	}
	b = connect(t, root)
	if got := len(allEvents(t, b)); got != 3 {
		t.Fatalf("%d events after the killed daemon, want 3", got)
	}
}
