package fleet

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/oklog/ulid/v2"

	"github.com/nexus-sandbox/nexus/events"
	"github.com/nexus-sandbox/nexus/host/journal"
	"github.com/nexus-sandbox/nexus/internal/testutil"
)

// journalDigest appends a journal.digest of j's records so far, as the
// daemon does, and returns its sequence.
func journalDigest(t *testing.T, j *journal.Journal) uint64 {
	t.Helper()
	var c events.Chain
	for _, r := range readAll(t, j, 1, "") {
		c.Add(r.Seq, r.Data)
	}
	e := events.New(ulid.Make(), time.Now(), "", events.JournalDigestEvent{Seq: c.Seq, Digest: c.Digest()})
	data, err := events.Encode(e)
	if err != nil {
		t.Fatal(err)
	}
	ack, err := j.Append(context.Background(), journal.Message{Subject: digestSubject, ID: e.ID.String(), Data: data})
	if err != nil {
		t.Fatal(err)
	}
	return ack.Seq
}

// failedChecks names the checks in fs.
func failedChecks(fs []FailedCheck) []string {
	var out []string
	for _, f := range fs {
		out = append(out, f.Check)
	}
	return out
}

// TestMirrorContentChecks: on a real three-node fleet a mirror is held to
// its host's journal by content, not only by span. An operator who
// replaces the mirror with a copy of the same span but one record changed
// is caught by the digest alone, in `fleet status` (the host's view) and
// in a read against the host's report (`replay verify --nats`); one who
// purges its head fails the first-sequence and count checks.
func TestMirrorContentChecks(t *testing.T) {
	c := startCluster(t, plainTemplate)
	j, m := mirrorTo(t, c, "h", "p", "host-a", 200*time.Millisecond)
	defer j.Close()
	appendN(t, j, 0, 5)
	if seq := journalDigest(t, j); seq != 6 {
		t.Fatalf("digest at %d, want 6", seq)
	}
	appendN(t, j, 5, 1)

	u := c.clientURL(2, "h", "p")
	operator, js := connectJS(t, u)
	defer operator.Close()
	ctx, cancel := context.WithTimeout(context.Background(), testutil.Scale(2*time.Minute))
	defer cancel()
	var st *MirrorState
	for {
		st = m.State(ctx)
		rctx, rcancel := context.WithTimeout(ctx, 3*time.Second)
		rep, err := readReport(rctx, js, "host-a", m.HostID)
		rcancel()
		if err == nil && rep.DigestSeq == 5 && rep.LastSeq == 7 && st.MirrorLastSeq == 7 && st.DigestSeq == 5 {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("the mirror never held 7 events checked against the digest of 5: %+v, report %+v (%v)", st, rep, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if len(st.FailedChecks) != 0 {
		t.Fatalf("a true mirror failed %v", st.FailedChecks)
	}
	if err := ReadMirror(ctx, u, "", "", m.StreamName(), func(journal.Record) error { return nil }, nil); err != nil {
		t.Fatalf("a true mirror read against its report: %v", err)
	}

	// The operator replaces the mirror with a stream of the same records,
	// metadata and all, but record 3's bytes changed.
	s, err := js.Stream(ctx, m.StreamName())
	if err != nil {
		t.Fatal(err)
	}
	var msgs []*jetstream.RawStreamMsg
	for seq := uint64(1); seq <= 7; seq++ {
		msg, err := s.GetMsg(ctx, seq)
		if err != nil {
			t.Fatal(err)
		}
		msgs = append(msgs, msg)
	}
	msgs[2].Data = []byte("event X")
	cfg := s.CachedInfo().Config
	cfg.Mirror, cfg.DenyDelete, cfg.DenyPurge, cfg.Subjects = nil, false, false, []string{"host-a.>"}
	// The host re-creates a mirror it finds gone: the operator's stream
	// takes the name once the host's is deleted again.
	for try := 1; ; try++ {
		if err := js.DeleteStream(ctx, cfg.Name); err != nil && !errors.Is(err, jetstream.ErrStreamNotFound) {
			t.Fatal(err)
		}
		_, err := js.CreateStream(ctx, cfg)
		if err == nil {
			break
		}
		if try == 20 {
			t.Fatalf("the operator's stream: %v", err)
		}
	}
	for _, msg := range msgs {
		if _, err := js.PublishMsg(ctx, &nats.Msg{Subject: msg.Subject, Data: msg.Data, Header: msg.Header}); err != nil {
			t.Fatal(err)
		}
	}
	st = m.State(ctx)
	if got := failedChecks(st.FailedChecks); !slices.Equal(got, []string{CheckDigest}) || st.MirrorLastSeq != 7 || st.MirrorMsgs != 7 {
		t.Fatalf("a mirror with one record changed, same span: failed %v (%+v)", st.FailedChecks, st)
	}
	err = ReadMirror(ctx, u, "", "", m.StreamName(), func(journal.Record) error { return nil }, nil)
	if err == nil || !strings.Contains(err.Error(), "digest check failed") || strings.Contains(err.Error(), "count check") {
		t.Fatalf("a mirror with one record changed, read against the report: %v", err)
	}

	// The operator purges its head.
	s, _ = js.Stream(ctx, m.StreamName())
	if err := s.Purge(ctx, jetstream.WithPurgeSequence(3)); err != nil {
		t.Fatal(err)
	}
	st = m.State(ctx)
	if got := failedChecks(st.FailedChecks); !slices.Contains(got, CheckFirstSeq) || !slices.Contains(got, CheckCount) {
		t.Fatalf("a mirror with its head purged: failed %v (%+v)", st.FailedChecks, st)
	}
	err = ReadMirror(ctx, u, "", "", m.StreamName(), func(journal.Record) error { return nil }, nil)
	if err == nil || !strings.Contains(err.Error(), "first_seq check failed") {
		t.Fatalf("a mirror with its head purged, read against the report: %v", err)
	}
}

// A mirror's chain is read once: a later check reads only the records
// after the last one it read (a record deleted below that is not read
// again; the count check names it), and a stream made again is read from
// its start.
func TestChainCacheReadsOnlyWhatIsNew(t *testing.T) {
	srv := startFleet(t, t.TempDir(), freePort(t), freePort(t))
	nc, js := connectJS(t, srv.ClientURL())
	defer nc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), testutil.Scale(time.Minute))
	defer cancel()
	s, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "S", Subjects: []string{"s.>"}})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 10 {
		if _, err := js.Publish(ctx, "s.x", fmt.Appendf(nil, "record %d", i+1)); err != nil {
			t.Fatal(err)
		}
	}
	whole, err := chainTo(ctx, s, 10)
	if err != nil || whole.Seq != 10 {
		t.Fatalf("chain to 10: %+v %v", whole, err)
	}
	created := s.CachedInfo().Created
	var cc chainCache
	if c, err := cc.to(ctx, s, created, 5); err != nil || c.Seq != 5 {
		t.Fatalf("chain to 5: %+v %v", c, err)
	}
	if err := s.DeleteMsg(ctx, 3); err != nil {
		t.Fatal(err)
	}
	if c, err := cc.to(ctx, s, created, 10); err != nil || c != whole {
		t.Fatalf("chain to 10 after 5: %+v %v, want %+v (records 1 to 5 read once)", c, err, whole)
	}
	gapped, err := chainTo(ctx, s, 10)
	if err != nil || gapped == whole {
		t.Fatalf("chain to 10 without record 3: %+v %v", gapped, err)
	}
	if c, err := cc.to(ctx, s, created.Add(time.Second), 10); err != nil || c != gapped {
		t.Fatalf("chain of a stream made again: %+v %v, want %+v (read from its start)", c, err, gapped)
	}
}
