package daemon

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/oklog/ulid/v2"

	"github.com/nexus-sandbox/nexus/events"
	"github.com/nexus-sandbox/nexus/host/journal"
	"github.com/nexus-sandbox/nexus/internal/testutil"
	"github.com/nexus-sandbox/nexus/store"
)

// digestRecord is a journal.digest record at seq covering records 1 to covers.
func digestRecord(t *testing.T, seq uint64, covers uint64, digest string) journal.Record {
	t.Helper()
	data, err := events.Encode(events.New(ulid.Make(), time.Now(), "", events.JournalDigestEvent{Seq: covers, Digest: digest}))
	if err != nil {
		t.Fatal(err)
	}
	return journal.Record{Seq: seq, Subject: digestSubject, Data: data}
}

// TestDigesterChecksJournaledDigests: a digester reading a journal from
// its start counts as pending only the records after the last journaled
// digest's span, and refuses a digest that is not the chain's at the
// sequence it names.
func TestDigesterChecksJournaledDigests(t *testing.T) {
	var d digester
	var want events.Chain
	var at4 string
	for seq := uint64(1); seq <= 5; seq++ {
		r := journal.Record{Seq: seq, Subject: "nexus.events.sandbox.created.x", Data: []byte{byte(seq)}}
		if err := d.take(r); err != nil {
			t.Fatal(err)
		}
		want.Add(r.Seq, r.Data)
		if seq == 4 {
			at4 = want.Digest()
		}
	}
	// A digest of records 1 to 4, record 5 appended while it was made.
	if err := d.take(digestRecord(t, 6, 4, at4)); err != nil {
		t.Fatalf("a true digest: %v", err)
	}
	if d.pending != 1 {
		t.Fatalf("%d pending after a digest of 1 to 4 at 6, want 1 (record 5)", d.pending)
	}
	if err := d.take(digestRecord(t, 7, 6, at4)); err == nil || !strings.Contains(err.Error(), "changed after it was digested") {
		t.Fatalf("a digest not the chain's: %v", err)
	}
	if err := d.take(digestRecord(t, 8, 9, at4)); err == nil || !strings.Contains(err.Error(), "not records before it") {
		t.Fatalf("a digest of records after it: %v", err)
	}
}

// appendEvents appends n warnings to s.
func appendEvents(t *testing.T, s *store.Store, n int) {
	t.Helper()
	for range n {
		e := events.New(ulid.Make(), time.Now(), "", events.WarningRaisedEvent{Reason: "test"})
		if _, err := s.Append(context.Background(), e); err != nil {
			t.Fatal(err)
		}
	}
}

// journaledDigests are the journal's digest events by their sequence,
// each checked against the chain over the records it covers.
func journaledDigests(t *testing.T, s *store.Store) []uint64 {
	t.Helper()
	var chain events.Chain
	sums := map[uint64]string{}
	var at []uint64
	err := s.Journal().Read(context.Background(), 1, "", func(r journal.Record) error {
		if r.Subject == digestSubject {
			e, err := events.Decode(r.Data)
			if err != nil {
				t.Fatal(err)
			}
			dg := e.Payload.(events.JournalDigestEvent)
			if sums[dg.Seq] != dg.Digest {
				t.Fatalf("the digest at %d covers 1 to %d as %s, the records hash to %s", r.Seq, dg.Seq, dg.Digest, sums[dg.Seq])
			}
			at = append(at, r.Seq, dg.Seq)
		}
		chain.Add(r.Seq, r.Data)
		sums[r.Seq] = chain.Digest()
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return at
}

// TestDigestsAcrossARestart: a daemon started again on a journal goes on
// with the chain from the journal's first record, so its digests compare
// with the same copy as those before it, and the records the last digest
// covered do not call for another one.
func TestDigestsAcrossARestart(t *testing.T) {
	root := t.TempDir()
	open := func() *store.Store {
		s, err := store.Open(context.Background(), root, store.Options{})
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	awaitDigest := func(s *store.Store, seq uint64) {
		t.Helper()
		deadline := time.Now().Add(testutil.Scale(30 * time.Second))
		for {
			at := journaledDigests(t, s)
			if len(at) > 0 && at[len(at)-1] >= seq {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("no digest covering %d; digests (at, covering): %v", seq, at)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	s := open()
	appendEvents(t, s, 5)
	stop := journalDigests(context.Background(), s, 3, time.Hour)
	awaitDigest(s, 5)
	stop()
	s.Close()

	// Started again on the journal: the 2 records since are below the
	// count, the third calls for the digest.
	s = open()
	defer s.Close()
	appendEvents(t, s, 2)
	stop = journalDigests(context.Background(), s, 3, time.Hour)
	defer stop()
	appendEvents(t, s, 1)
	awaitDigest(s, 9)
	if at := journaledDigests(t, s); !slices.Equal(at, []uint64{6, 5, 10, 9}) {
		t.Fatalf("digests (at, covering) %v, want 6 covering 1 to 5, 10 covering 1 to 9", at)
	}
}
