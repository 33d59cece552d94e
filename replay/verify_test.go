package replay

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/oklog/ulid/v2"
	"github.com/vmihailenco/msgpack/v5"

	"github.com/nexus-sandbox/nexus/events"
)

func rec(t *testing.T, seq uint64, e events.Event) Record {
	t.Helper()
	data, err := events.Encode(e)
	if err != nil {
		t.Fatal(err)
	}
	return Record{Seq: seq, MsgID: e.DedupID(), Data: data}
}

func TestVerify(t *testing.T) {
	at := time.Date(2026, 12, 3, 0, 0, 0, 0, time.UTC)
	sb := ulid.Make().String()
	start := events.New(ulid.Make(), at, sb, events.SagaStartedEvent{Kind: "create"}).InSaga("s1", "saga.started")
	disk := events.New(ulid.Make(), at, sb, events.DiskMaterialisedEvent{}).InSaga("s1", "os-disk")
	clean := []Record{rec(t, 1, start), rec(t, 2, disk)}

	rep := Verify(clean)
	if !rep.OK() || rep.Events != 2 || len(rep.OpenSagas) != 1 || rep.OpenSagas[0].ID != "s1" {
		t.Fatalf("clean journal with an open saga: %+v", rep)
	}

	future, _ := msgpack.Marshal(map[string]any{"f": 1, "id": make([]byte, 16), "t": "sandbox.stopped", "v": 9, "ts": 0, "p": map[string]any{}})
	damaged := []Record{
		clean[0],
		rec(t, 3, disk), // gap: 2 is missing
		{Seq: 4, MsgID: clean[0].MsgID, Data: clean[0].Data}, // the same id stored twice
		{Seq: 5, MsgID: "x", Data: []byte("garbage")},
		{Seq: 6, MsgID: "y", Data: future},
	}
	rep = Verify(damaged)
	if rep.OK() || len(rep.Gaps) != 1 || len(rep.DuplicateID) != 1 || len(rep.Undecodable) != 1 || len(rep.NewerSchema) != 1 {
		t.Fatalf("damaged journal report: %+v", rep)
	}
	if rep.Gaps[0] != "2..2" {
		t.Fatalf("gap %q", rep.Gaps[0])
	}
}

func TestConcurrentVerifierMatchesSerial(t *testing.T) {
	at := time.Date(2026, 12, 3, 0, 0, 0, 0, time.UTC)
	var recs []Record
	for i := 1; i <= 3*verifyBatch+7; i++ {
		e := events.New(ulid.Make(), at, ulid.Make().String(), events.SagaStartedEvent{Kind: "create"}).InSaga(fmt.Sprintf("s%d", i), "saga.started")
		recs = append(recs, rec(t, uint64(i), e))
	}
	recs = append(recs, Record{Seq: uint64(len(recs) + 2), MsgID: recs[0].MsgID, Data: []byte("x")})
	want := Verify(recs)
	add, finish := NewVerifier().Concurrent()
	for _, r := range recs {
		add(r)
	}
	got := finish()
	if got.Events != want.Events || len(got.OpenSagas) != len(want.OpenSagas) || len(got.Gaps) != 1 || len(got.DuplicateID) != 1 || len(got.Undecodable) != 1 {
		t.Fatalf("concurrent %+v\nserial %+v", got, want)
	}
}

func TestIDSetFindsRepeats(t *testing.T) {
	s := newIDSet()
	for i := range 1000 {
		if _, dup := s.add(fmt.Sprintf("id-%d", i), uint64(i+1)); dup {
			t.Fatalf("id-%d reported twice on first sight", i)
		}
	}
	if first, dup := s.add("id-7", 5000); !dup || first != 8 {
		t.Fatalf("repeat of id-7: first=%d dup=%v", first, dup)
	}

}

// An event written in the name of a saga the journal had already closed is
// what a runner with no lease would write after recover compensated it.
func TestVerifyFlagsEventsOutsideAnOpenSaga(t *testing.T) {
	const sb = "01JDQ4Z6X1M9A3Y0C5TB2R8NKW"
	mk := func(seq uint64, p events.Payload) Record {
		e := events.New(ulid.Make(), time.Unix(int64(seq), 0), sb, p)
		e.Saga, e.Step = "S1", fmt.Sprint(seq)
		data, err := events.Encode(e)
		if err != nil {
			t.Fatal(err)
		}
		return Record{Seq: seq, MsgID: e.DedupID(), Data: data}
	}
	ok := Verify([]Record{mk(1, events.SagaStartedEvent{Kind: "snapshot"}), mk(2, events.SagaCompensatedEvent{Reason: "r"})})
	if !ok.OK() {
		t.Fatalf("clean saga flagged: %+v", ok)
	}
	bad := Verify([]Record{mk(1, events.SagaStartedEvent{Kind: "snapshot"}), mk(2, events.SagaCompensatedEvent{Reason: "r"}),
		mk(3, events.SnapshotTakenEvent{SnapshotID: "X"})})
	if bad.OK() || len(bad.OutsideSaga) != 1 {
		t.Fatalf("event after the saga closed not flagged: %+v", bad)
	}
}

func TestVerifyFlagsTwoLiveSandboxesWithOneHandle(t *testing.T) {
	a, b, c := ulid.Make().String(), ulid.Make().String(), ulid.Make().String()
	seq := uint64(0)
	mk := func(sb string, p events.Payload) Record {
		seq++
		return rec(t, seq, events.New(ulid.Make(), time.Unix(int64(seq), 0), sb, p))
	}
	// a holds d9, is removed, and c takes d9: one live holder at a time.
	clean := Verify([]Record{
		mk(a, events.SandboxCreatedEvent{Handle: "d9"}), mk(a, events.HandleClaimedEvent{Sandbox: a, Handle: "d9"}),
		mk(a, events.SandboxRemovedEvent{}),
		mk(c, events.SandboxRestoredEvent{Handle: "d9"}), mk(c, events.HandleClaimedEvent{Sandbox: c, Handle: "d9"}),
	})
	if !clean.OK() {
		t.Fatalf("a handle reused after its holder was removed is flagged: %+v", clean)
	}
	seq = 0
	bad := Verify([]Record{
		mk(a, events.SandboxCreatedEvent{Handle: "d9"}),
		mk(b, events.SandboxForkedEvent{Parent: a, Handle: "d9"}),
	})
	if bad.OK() || len(bad.SharedHandles) != 1 {
		t.Fatalf("two live sandboxes with handle d9 not flagged: %+v", bad)
	}
	for _, want := range []string{a, b, `"d9"`} {
		if !strings.Contains(bad.SharedHandles[0], want) {
			t.Fatalf("report %q does not name %s", bad.SharedHandles[0], want)
		}
	}
}
