package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/nexus-sandbox/nexus/host/journal"
)

// relDigest is storeDigest keyed by the path relative to dir.
func relDigest(t *testing.T, dir string) map[string][32]byte {
	t.Helper()
	out := map[string][32]byte{}
	for p, sum := range storeDigest(t, dir) {
		rel, _ := filepath.Rel(dir, p)
		out[rel] = sum
	}
	return out
}

// TestJournalRepair: a journal whose last block is torn mid-record is
// refused; `journal repair --backup` copies it aside byte for byte, cuts
// exactly the torn record, says so, and the journal opens with every whole
// record.
func TestJournalRepair(t *testing.T) {
	t.Parallel()
	root := t.TempDir()
	mustOK(t, nexus(t, root, "demo"), "demo")
	n := strings.Count(mustOK(t, nexus(t, root, "events", "--all", "-q"), "events").stdout, "\n")
	stopDaemons(root)                                // the store is edited behind nexus's back below
	os.RemoveAll(filepath.Join(root, "projections")) // force a full read of the journal
	block := blockFile(t, root)
	info, _ := os.Stat(block)
	torn := info.Size() - 7
	if err := os.Truncate(block, torn); err != nil {
		t.Fatal(err)
	}
	wantFailure(t, nexus(t, root, "ls"), 1, "journal repair --backup DIR")
	jdir := filepath.Join(root, "journal")
	before := relDigest(t, jdir)

	wantFailure(t, nexus(t, root, "journal", "repair"), 2, "--backup")
	full := t.TempDir()
	os.WriteFile(filepath.Join(full, "keep"), []byte("x"), 0o600)
	wantFailure(t, nexus(t, root, "journal", "repair", "--backup", full), 1, "not empty")
	if !sameDigest(relDigest(t, jdir), before) {
		t.Fatal("a refused repair changed the journal")
	}

	backup := filepath.Join(t.TempDir(), "journal-before-repair")
	r := mustOK(t, nexus(t, root, "journal", "repair", "--backup", backup, "--json"), "journal repair")
	var rep journal.RepairReport
	if err := json.Unmarshal([]byte(r.stdout), &rep); err != nil {
		t.Fatalf("repair --json: %v\n%s", err, r.stdout)
	}
	if rep.Block != block || rep.Offset+rep.CutBytes != torn || rep.CutBytes <= 0 ||
		rep.LastGoodSeq != uint64(n-1) || rep.FirstLostSeq != uint64(n) {
		t.Fatalf("report %+v: want the record at sequence %d cut from %s (torn at %d bytes)", rep, n, block, torn)
	}
	if fi, _ := os.Stat(block); fi.Size() != rep.Offset {
		t.Fatalf("block is %d bytes, the report says it was cut at %d", fi.Size(), rep.Offset)
	}
	if !sameDigest(relDigest(t, backup), before) {
		t.Fatal("the backup is not the store as it was before the repair")
	}
	// Read in process: a daemon would first finish the saga whose end the
	// cut took (that is its job), adding an event.
	after := mustOK(t, nexusEnv(t, root, []string{"NEXUS_NO_AUTO_DAEMON=1"}, "events", "--all", "-q"), "events after repair").stdout
	if got := strings.Count(after, "\n"); got != n-1 {
		t.Fatalf("%d events after the repair, want %d", got, n-1)
	}
	mustOK(t, nexus(t, root, "ls"), "ls after repair")
	human := mustOK(t, nexus(t, root, "journal", "repair", "--backup", filepath.Join(t.TempDir(), "b")), "repair of a whole journal")
	if !strings.Contains(human.stdout, "is whole: nothing cut") {
		t.Fatalf("repair of a whole journal said %q", human.stdout)
	}
}
