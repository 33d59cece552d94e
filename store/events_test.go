package store_test

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/nexus-sandbox/nexus/events"
	"github.com/nexus-sandbox/nexus/host/streamscan"
	"github.com/nexus-sandbox/nexus/internal/testutil"
	"github.com/nexus-sandbox/nexus/store"
)

// TestEventsReadOnlyWhatTheyReturn is "events read by position",
// structurally: over a journal of 20,000 events, a tail, one
// sandbox's events or a late start costs the records returned, counted by
// the journal, not the history before them.
func TestEventsReadOnlyWhatTheyReturn(t *testing.T) {
	testutil.SkipInShort(t, "appends tens of thousands of events")
	const total = 20_000
	root := filepath.Join(t.TempDir(), "root")
	if err := os.Mkdir(root, 0o700); err != nil {
		t.Fatal(err)
	}
	benchAppendJournal(t, filepath.Join(root, "journal"), 0, total)
	// One sandbox from the middle of the history, and the events of the
	// sandbox category in a window of sequences (event i is at seq i+1).
	var sandbox string
	var itsEvents, inWindow, seq int
	benchHistory(0, total, func(e events.Event) {
		seq++
		if sandbox == "" && seq > total/2 && e.Type == events.DiskMaterialised {
			sandbox = e.Sandbox
		}
		if seq >= 5000 && seq <= 5099 && (e.Type == events.SandboxCreated || e.Type == events.SandboxRemoved) {
			inWindow++
		}
	})
	var itsSeqs []uint64
	seq = 0
	benchHistory(0, total, func(e events.Event) {
		seq++
		if e.Sandbox == sandbox {
			itsEvents++
			itsSeqs = append(itsSeqs, uint64(seq))
		}
	})
	if itsEvents < 3 || inWindow < 10 {
		t.Fatalf("fixture: %d events of %s, %d in the window", itsEvents, sandbox, inWindow)
	}
	n, err := store.Open(context.Background(), root, store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	cases := []struct {
		name string
		q    store.Query
		want int
	}{
		{"tail", store.Query{Tail: 5}, 5},
		{"one sandbox", store.Query{Sandbox: sandbox}, itsEvents},
		{"one sandbox's last", store.Query{Sandbox: sandbox, Tail: 1}, 1},
		{"a type's tail", store.Query{Types: []string{"sandbox.removed", "disk"}, Tail: 7}, 7},
		{"a late start", store.Query{Since: total - 9}, 10},
		{"a window", store.Query{Since: 5000, Until: 5099, Type: "sandbox"}, inWindow},
	}
	for _, c := range cases {
		before := n.Journal().RecordsRead()
		got := 0
		var last uint64
		if err := n.Events(context.Background(), c.q, func(r store.Record) error {
			got++
			last = r.Seq
			return nil
		}); err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		if got != c.want {
			t.Fatalf("%s: %d events, want %d", c.name, got, c.want)
		}
		if c.q.Tail > 0 && c.q.Sandbox == "" && last != total && c.q.Types == nil {
			t.Fatalf("%s: ends at %d, journal at %d", c.name, last, total)
		}
		// A filtered tail also reads the window of last records it
		// matches itself before it counts.
		most := uint64(got)
		if c.q.Tail > 0 && (c.q.Sandbox != "" || c.q.Types != nil) {
			most += streamscan.TailWindow(c.q.Tail)
		}
		if read := n.Journal().RecordsRead() - before; read < uint64(got) || read > most {
			t.Errorf("%s: read %d records of %d to return %d", c.name, read, total, got)
		}
	}
	// A sandbox's tail is bounded by its last event, which the store
	// knows: it is found among the records before that one, with no count
	// (a filtered count matches every sandbox's subjects).
	var starts, tail []uint64
	streamscan.CountedFrom = func(seq uint64) { starts = append(starts, seq) }
	defer func() { streamscan.CountedFrom = nil }()
	if err := n.Events(context.Background(), store.Query{Sandbox: sandbox, Tail: 2}, func(r store.Record) error {
		tail = append(tail, r.Seq)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if want := itsSeqs[len(itsSeqs)-2:]; !slices.Equal(tail, want) || len(starts) > 0 {
		t.Fatalf("the last 2 of sandbox %s: %v, want %v; counts from %v", sandbox, tail, want, starts)
	}
}
