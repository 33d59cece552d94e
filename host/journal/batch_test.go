package journal

import (
	"context"
	"errors"
	"path/filepath"
	"testing"
)

func batchMsg(subject, id string) Message {
	return Message{Subject: subject, ID: id, Data: []byte("data " + id)}
}

func TestAppendBatchStoresAllAtConsecutiveSequences(t *testing.T) {
	ctx := context.Background()
	j := openTest(t, t.TempDir())
	appendN(t, j, 0, 2)
	last := uint64(2)
	msgs := []Message{
		batchMsg("nexus.events.saga.started.A", "b1"),
		batchMsg("nexus.events.disk.materialised.A", "b2"),
		batchMsg("nexus.events.sandbox.created.B", "b3"),
	}
	msgs[0].ExpectLastSeq = &last
	msgs[0].ExpectSubjects, msgs[0].ExpectSubjectSeq = "nexus.events.*.*.A", 0
	msgs[2].ExpectSubjects, msgs[2].ExpectSubjectSeq = "nexus.events.*.*.B", 0
	acks, err := j.AppendBatch(ctx, msgs)
	if err != nil {
		t.Fatal(err)
	}
	if len(acks) != 3 || acks[0].Seq != 3 || acks[1].Seq != 4 || acks[2].Seq != 5 {
		t.Fatalf("acks = %+v, want sequences 3, 4, 5", acks)
	}
	recs := readAll(t, j, 3, Subjects)
	if len(recs) != 3 {
		t.Fatalf("%d records after the batch, want 3", len(recs))
	}
	for i, r := range recs {
		if r.Seq != acks[i].Seq || r.MsgID != msgs[i].ID || r.Subject != msgs[i].Subject || string(r.Data) != string(msgs[i].Data) {
			t.Fatalf("record %d = %+v, want %+v at %d", i, r, msgs[i], acks[i].Seq)
		}
	}
	// A single message is a batch too.
	one, err := j.AppendBatch(ctx, []Message{batchMsg("nexus.events.sandbox.created.C", "b4")})
	if err != nil || len(one) != 1 || one[0].Seq != 6 {
		t.Fatalf("batch of one = %+v, %v", one, err)
	}
}

// A refused batch stores nothing: not the messages before the one whose
// expectation failed, nor those after it.
func TestAppendBatchIsAllOrNothing(t *testing.T) {
	ctx := context.Background()
	j := openTest(t, t.TempDir())
	appendN(t, j, 0, 3) // s0 at 1, s1 at 2, s2 at 3
	stale := uint64(1)
	cases := []struct {
		name string
		msgs func() []Message
	}{
		{"stale subject expectation in the middle", func() []Message {
			m := []Message{batchMsg("nexus.events.saga.started.X", "x1"), batchMsg("nexus.events.saga.started.s1", "x2"), batchMsg("nexus.events.saga.started.Y", "x3")}
			m[1].ExpectSubjects, m[1].ExpectSubjectSeq = "nexus.events.*.*.s1", 1 // s1's last is 2
			return m
		}},
		{"stale stream expectation", func() []Message {
			m := []Message{batchMsg("nexus.events.saga.started.X", "x1"), batchMsg("nexus.events.saga.started.Y", "x2")}
			m[0].ExpectLastSeq = &stale
			return m
		}},
		{"an id already stored", func() []Message {
			return []Message{batchMsg("nexus.events.saga.started.X", "x1"), batchMsg("nexus.events.sandbox.created.s0", "m-0")}
		}},
		{"an id twice", func() []Message {
			return []Message{batchMsg("nexus.events.saga.started.X", "x1"), batchMsg("nexus.events.saga.started.Y", "x1")}
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := j.AppendBatch(ctx, c.msgs())
			var be *BatchError
			if !errors.Is(err, ErrBatchRefused) || !errors.As(err, &be) || be.Code == 0 {
				t.Fatalf("AppendBatch = %v, want a server refusal (ErrBatchRefused)", err)
			}
			if last, err := j.LastSeq(ctx); err != nil || last != 3 {
				t.Fatalf("last sequence after a refused batch = %d, %v; want 3", last, err)
			}
		})
	}
	// The ids of the refused batches were never stored, so they append.
	acks, err := j.AppendBatch(ctx, []Message{batchMsg("nexus.events.saga.started.X", "x1"), batchMsg("nexus.events.saga.started.Y", "x2")})
	if err != nil || acks[0].Seq != 4 || acks[1].Seq != 5 {
		t.Fatalf("batch after the refusals = %+v, %v", acks, err)
	}
}

// An expectation inside a batch is checked against the stored records, so
// a batch may not expect subjects one of its own earlier messages writes:
// that check would pass while the entity had already moved.
func TestAppendBatchRefusesExpectationOverItsOwnMessages(t *testing.T) {
	j := openTest(t, t.TempDir())
	last := uint64(0)
	cases := map[string][]Message{
		"expectation over an earlier message": {
			batchMsg("nexus.events.sandbox.created.A", "a1"),
			{Subject: "nexus.events.saga.started.A", ID: "a2", ExpectSubjects: "nexus.events.*.*.A"},
		},
		"stream expectation after the first": {
			batchMsg("nexus.events.sandbox.created.A", "a1"),
			{Subject: "nexus.events.saga.started.B", ID: "a2", ExpectLastSeq: &last},
		},
		"no id":    {{Subject: "nexus.events.sandbox.created.A"}},
		"no batch": {},
	}
	for name, msgs := range cases {
		if _, err := j.AppendBatch(context.Background(), msgs); err == nil || errors.Is(err, ErrBatchRefused) {
			t.Errorf("%s: AppendBatch = %v, want a usage error", name, err)
		}
	}
	if n := len(readAll(t, j, 1, Subjects)); n != 0 {
		t.Fatalf("%d records stored, want 0", n)
	}
}

// A journal whose stream was made before batches existed takes them once
// Open has updated its config.
func TestOpenEnablesBatchesOnAnOlderStream(t *testing.T) {
	ctx := context.Background()
	dir := filepath.Join(t.TempDir(), "journal")
	j := openTest(t, dir)
	appendN(t, j, 0, 1)
	old := streamConfig(DefaultDedupeWindow)
	old.AllowAtomicPublish = false
	if _, err := j.js.UpdateStream(ctx, old); err != nil {
		t.Fatal(err)
	}
	if _, err := j.AppendBatch(ctx, []Message{batchMsg("nexus.events.saga.started.A", "a1")}); !errors.Is(err, ErrBatchRefused) {
		t.Fatalf("batch on a stream without atomic publish = %v, want refused", err)
	}
	if err := j.Close(); err != nil {
		t.Fatal(err)
	}
	j = openTest(t, dir)
	acks, err := j.AppendBatch(ctx, []Message{batchMsg("nexus.events.saga.started.A", "a1"), batchMsg("nexus.events.saga.started.A", "a2")})
	if err != nil || len(acks) != 2 || acks[1].Seq != 3 {
		t.Fatalf("batch after reopening = %+v, %v", acks, err)
	}
}

func TestSubjectMatches(t *testing.T) {
	for _, c := range []struct {
		filter, subject string
		want            bool
	}{
		{"nexus.events.*.*.A", "nexus.events.saga.started.A", true},
		{"nexus.events.*.*.A", "nexus.events.saga.started.B", false},
		{"nexus.events.*.*.A", "nexus.events.saga.started.A.x", false},
		{"nexus.events.>", "nexus.events.saga.started.A", true},
		{"nexus.events.>", "nexus.events", false},
		{"nexus.events.saga.started.A", "nexus.events.saga.started.A", true},
	} {
		if got := subjectMatches(c.filter, c.subject); got != c.want {
			t.Errorf("subjectMatches(%q, %q) = %v, want %v", c.filter, c.subject, got, c.want)
		}
	}
}
