package journal

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/nexus-sandbox/nexus/internal/testutil"
)

func openLogged(t *testing.T, dir string) (*Journal, *testutil.Buffer) {
	t.Helper()
	var logs testutil.Buffer
	j, err := Open(context.Background(), Options{Dir: dir, Logger: slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelWarn}))})
	if err != nil {
		t.Fatalf("Open %s: %v", dir, err)
	}
	t.Cleanup(func() { j.Close() })
	return j, &logs
}

// TestCleanCloseLeavesStreamStateToReuse: Close shuts the embedded server
// down so that the file store writes its full stream state (index.db:
// the per-subject index and per-block summary, ending with the last
// record's checksum), and the next open recovers from it instead of
// rebuilding from the blocks. nats-server says when it cannot ("Stream
// state outdated ... will rebuild"); the second half shows it does say so
// for a store left without a clean close, so the silence is meaningful.
func TestCleanCloseLeavesStreamStateToReuse(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "journal")
	j, _ := openLogged(t, dir)
	appendN(t, j, 0, 100)
	j.Close()
	state := filepath.Join(j.msgsDir(), "index.db")
	if _, err := os.Stat(state); err != nil {
		t.Fatalf("no stream state after a clean close: %v", err)
	}

	j, logs := openLogged(t, dir)
	if n := len(readAll(t, j, 1, Subjects)); n != 100 {
		t.Fatalf("read %d records, want 100", n)
	}
	if out := logs.String(); strings.Contains(out, "Stream state") || strings.Contains(out, "rebuild") {
		t.Fatalf("the open after a clean close rebuilt the stream state:\n%s", out)
	}

	// The same store as a kill would leave it: appended to after the state
	// was written, and copied while the server still runs.
	appendN(t, j, 100, 10)
	crashed := filepath.Join(t.TempDir(), "journal")
	copyDir(t, dir, crashed)
	if err := os.Remove(filepath.Join(crashed, lockFile)); err != nil {
		t.Fatal(err)
	}
	j.Close()
	c, logs := openLogged(t, crashed)
	if n := len(readAll(t, c, 1, Subjects)); n != 110 {
		t.Fatalf("read %d records from the crashed copy, want 110", n)
	}
	if out := logs.String(); !strings.Contains(out, "Stream state outdated") {
		t.Fatalf("the open of a store left without a clean close did not report rebuilding; logs:\n%s", out)
	}
}
