package fleet

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/nexus-sandbox/nexus/host/journal"
	"github.com/nexus-sandbox/nexus/internal/testutil"
)

// TestReadMirrorComparesWithTheHostsReport: on a real three-node fleet the
// host publishes its journal's last sequence to its report stream; a
// mirror that starts at 1 and has no gaps but ends before that report (a
// copy cut short while the host was away) is refused, and the whole
// mirror reads.
func TestReadMirrorComparesWithTheHostsReport(t *testing.T) {
	c := startCluster(t, plainTemplate)
	j, m := mirrorTo(t, c, "h", "p", "host-a", 200*time.Millisecond)
	appendN(t, j, 0, 5)

	u := c.clientURL(2, "h", "p")
	admin, js := connectJS(t, u)
	defer admin.Close()
	ctx, cancel := context.WithTimeout(context.Background(), testutil.Scale(60*time.Second))
	defer cancel()
	var info *jetstream.StreamInfo
	var rep HostReport
	for {
		if s, err := js.Stream(ctx, m.StreamName()); err == nil {
			info = s.CachedInfo()
			// A request to a stream just made, before its leader is
			// elected, goes unanswered: each waits a few seconds at most.
			rctx, rcancel := context.WithTimeout(ctx, 3*time.Second)
			rep, err = readReport(rctx, js, "host-a", m.HostID)
			rcancel()
			if err == nil && info.State.LastSeq == 5 && rep.LastSeq == 5 {
				break
			}
		}
		if ctx.Err() != nil {
			t.Fatalf("the mirror never held and reported 5 events: %+v, report %+v", info.State, rep)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if rep, _ := readReport(ctx, js, "host-a", m.HostID); time.Since(rep.Reported) > time.Minute || info.Config.Metadata[metaHostID] != m.HostID {
		t.Fatalf("report %+v, metadata %v", rep, info.Config.Metadata)
	}
	count := 0
	if err := ReadMirror(ctx, u, "", "", m.StreamName(), func(journal.Record) error { count++; return nil }, nil); err != nil || count != 5 {
		t.Fatalf("the whole mirror: %d records, %v", count, err)
	}
	if st := m.State(ctx); st.ReportedSeq != 5 || st.MirrorLastSeq != 5 {
		t.Fatalf("status of a reported mirror: %+v", st)
	}
	j.Close()

	// With the host away, the mirror is replaced by a copy of its first
	// three events, metadata and all; the report stays.
	s, _ := js.Stream(ctx, m.StreamName())
	var head []*jetstream.RawStreamMsg
	for seq := uint64(1); seq <= 3; seq++ {
		msg, err := s.GetMsg(ctx, seq)
		if err != nil {
			t.Fatal(err)
		}
		head = append(head, msg)
	}
	cfg := info.Config
	cfg.Mirror, cfg.DenyDelete, cfg.DenyPurge, cfg.Subjects = nil, false, false, []string{"host-a.>"}
	if err := js.DeleteStream(ctx, cfg.Name); err != nil {
		t.Fatal(err)
	}
	if _, err := js.CreateStream(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	for _, msg := range head {
		if _, err := js.PublishMsg(ctx, &nats.Msg{Subject: msg.Subject, Data: msg.Data, Header: msg.Header}); err != nil {
			t.Fatal(err)
		}
	}
	err := ReadMirror(ctx, u, "", "", m.StreamName(), func(journal.Record) error { return nil }, nil)
	if err == nil || !strings.Contains(err.Error(), "last_seq check failed: the mirror ends at 3, but its host reported its journal at 5") {
		t.Fatalf("a mirror cut short of its host's report: %v", err)
	}
}
