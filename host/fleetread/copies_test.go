package fleetread

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/nexus-sandbox/nexus/host/fleetstate"
	"github.com/nexus-sandbox/nexus/host/streamscan"
	"github.com/nexus-sandbox/nexus/internal/jstest"
	"github.com/nexus-sandbox/nexus/internal/testutil"
)

// A read from a position past a host's records skips the copies of them
// stored after it, as a read from the start does: the aggregate sources
// at least once, so a source set up again stores records it already held
// (here a second source of host-b's mirror under a narrower filter, which
// stores each of its records again), and a follow from the end must not
// print them as new.
func TestReadFromAPositionSkipsCopiesOfEarlierRecords(t *testing.T) {
	js := jstest.Connect(t, jstest.Start(t, server.Options{}))
	ctx, cancel := context.WithTimeout(context.Background(), testutil.Scale(time.Minute))
	defer cancel()
	publish := func(host string, n int) {
		t.Helper()
		for range n {
			if _, err := js.Publish(ctx, host+".nexus.events.sandbox.created.x", []byte(host)); err != nil {
				t.Fatal(err)
			}
		}
	}
	var sources []*jetstream.StreamSource
	for _, host := range []string{"host-a", "host-b"} {
		if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: fleetstate.MirrorStream(host), Subjects: []string{host + ".>"}}); err != nil {
			t.Fatal(err)
		}
		sources = append(sources, &jetstream.StreamSource{Name: fleetstate.MirrorStream(host)})
	}
	publish("host-a", 2)
	publish("host-b", 3)
	agg, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: fleetstate.AggregateStream, Sources: sources})
	if err != nil {
		t.Fatal(err)
	}
	jstest.WaitMsgs(t, ctx, agg, 5)
	from := uint64(6)
	cfg := agg.CachedInfo().Config
	cfg.Sources = append(cfg.Sources, &jetstream.StreamSource{Name: fleetstate.MirrorStream("host-b"), FilterSubject: "host-b.nexus.>"})
	if _, err := js.UpdateStream(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	jstest.WaitMsgs(t, ctx, agg, 8)
	publish("host-a", 1)
	jstest.WaitMsgs(t, ctx, agg, 9)

	// The lookup a read starts with finds, for every position, the last
	// record of a host before it, as a walk of the stream does.
	for _, host := range []string{"host-a", "host-b"} {
		var want uint64
		for from := uint64(1); from <= 10; from++ {
			got, err := lastBefore(ctx, agg, host+".>", from)
			if err != nil {
				t.Fatal(err)
			}
			if (got == nil) != (want == 0) || got != nil && got.Sequence != want {
				t.Fatalf("%s's last record before %d: %+v, want position %d", host, from, got, want)
			}
			if m, err := agg.GetMsg(ctx, from); err == nil && strings.HasPrefix(m.Subject, host+".") {
				want = from
			}
		}
	}

	r := &Reader{nc: js.Conn(), js: js}
	at, err := agg.GetMsg(ctx, from)
	if err != nil {
		t.Fatal(err)
	}
	for _, rg := range []Range{{From: from}, {From: from, Follow: true}, {FromTime: at.Time}} {
		follow := rg.Follow
		var got []Record
		rctx, rcancel := context.WithTimeout(ctx, testutil.Scale(10*time.Second))
		err := r.Scan(rctx, rg, func(rec Record) error {
			got = append(got, rec)
			if follow {
				return streamscan.ErrStop
			}
			return nil
		})
		rcancel()
		if err != nil && !errors.Is(err, context.DeadlineExceeded) {
			t.Fatal(err)
		}
		if len(got) != 1 || got[0].Host != "host-a" || got[0].HostSeq != 3 {
			t.Fatalf("a read of %+v: %d records, first %+v; want host-a's third alone", rg, len(got), first(got))
		}
	}
}

func first(rs []Record) any {
	if len(rs) == 0 {
		return nil
	}
	return rs[0]
}
