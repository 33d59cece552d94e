package journal

import (
	"context"
	"errors"
	"strconv"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// TestLiveMessagesAreStoredOnesWithTheirSequence: a subscriber on the event
// subjects receives each stored event once, after it is stored, with its
// journal sequence in Nats-Sequence, and never an append the journal
// refused (a lost expected-sequence race) or de-duplicated (a retry).
func TestLiveMessagesAreStoredOnesWithTheirSequence(t *testing.T) {
	j := openTest(t, t.TempDir())
	sub, err := j.nc.SubscribeSync(Subjects)
	if err != nil {
		t.Fatal(err)
	}
	if err := j.nc.Flush(); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	appendN(t, j, 0, 3)
	if ack, err := j.Append(ctx, Message{Subject: "nexus.events.sandbox.created.s0", ID: "m-1", Data: []byte("retry")}); err != nil || !ack.Duplicate {
		t.Fatalf("retry = %+v, %v; want a duplicate", ack, err)
	}
	stale := uint64(1)
	if _, err := j.Append(ctx, Message{Subject: "nexus.events.sandbox.created.s0", ID: "late", Data: []byte("late"), ExpectLastSeq: &stale}); !errors.Is(err, ErrConflict) {
		t.Fatalf("stale append: %v", err)
	}
	appendN(t, j, 3, 1)
	for want := uint64(1); want <= 4; want++ {
		msg, err := sub.NextMsg(5 * time.Second)
		if err != nil {
			t.Fatalf("live event %d: %v", want, err)
		}
		if seq, _ := strconv.ParseUint(msg.Header.Get(jetstream.SequenceHeader), 10, 64); seq != want {
			t.Fatalf("live event %d: %s = %q (%q on %s)", want, jetstream.SequenceHeader, msg.Header.Get(jetstream.SequenceHeader), msg.Data, msg.Subject)
		}
		if msg.Subject != "nexus.events.sandbox.created.s"+strconv.Itoa(int(want-1)%3) || string(msg.Data) != "event "+strconv.Itoa(int(want-1)) {
			t.Fatalf("live event %d: %q on %s", want, msg.Data, msg.Subject)
		}
	}
	if msg, err := sub.NextMsg(200 * time.Millisecond); !errors.Is(err, nats.ErrTimeout) {
		t.Fatalf("a fifth live message: %q, %v", msgData(msg), err)
	}
}

func msgData(m *nats.Msg) []byte {
	if m == nil {
		return nil
	}
	return m.Data
}

// TestJournalOfTheEarlierStreamConfigOpens: a journal whose stream took
// appends on the event subjects themselves (before appends were
// republished) opens, keeps its records, and takes new appends.
func TestJournalOfTheEarlierStreamConfigOpens(t *testing.T) {
	dir := t.TempDir()
	j := openTest(t, dir)
	ctx := context.Background()
	old := streamConfig(DefaultDedupeWindow)
	old.Subjects, old.SubjectTransform, old.RePublish = []string{Subjects}, nil, nil
	if _, err := j.js.UpdateStream(ctx, old); err != nil {
		t.Fatal(err)
	}
	if _, err := j.js.Publish(ctx, "nexus.events.sandbox.created.s0", []byte("old"), jetstream.WithMsgID("old")); err != nil {
		t.Fatal(err)
	}
	j.Close()
	j = openTest(t, dir)
	appendN(t, j, 0, 2)
	recs := readAll(t, j, 1, Subjects)
	if len(recs) != 3 || string(recs[0].Data) != "old" || recs[2].Seq != 3 || recs[2].Subject != "nexus.events.sandbox.created.s1" {
		t.Fatalf("records after the upgrade: %+v", recs)
	}
}
