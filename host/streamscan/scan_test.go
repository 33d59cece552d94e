package streamscan

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/nexus-sandbox/nexus/internal/jstest"
)

const testRecords = 3000

// fill makes stream T with testRecords records on t.<i%3>, each 200
// bytes.
func fill(t *testing.T, srv *server.Server) {
	t.Helper()
	nc, err := nats.Connect(srv.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "T", Subjects: []string{"t.>"}}); err != nil {
		t.Fatal(err)
	}
	data := []byte(strings.Repeat("x", 200))
	for i := range testRecords {
		if _, err := js.PublishAsync(fmt.Sprintf("t.%d", i%3), data); err != nil {
			t.Fatal(err)
		}
	}
	select {
	case <-js.PublishAsyncComplete():
	case <-ctx.Done():
		t.Fatal("publishes not acknowledged within a minute")
	}
}

// interruptedRead reads all of stream T through a connection made with
// opts; after the 300th record the read waits while the test calls
// interrupt, then goes on. It returns the sequences read and the read's
// error.
func interruptedRead(t *testing.T, url string, opts []nats.Option, interrupt func(jetstream.Stream)) ([]uint64, error) {
	t.Helper()
	nc, err := nats.Connect(url, opts...)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	// Bounds a read that neither ends nor fails; the reads below end
	// within seconds.
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	s, err := js.Stream(ctx, "T")
	if err != nil {
		t.Fatal(err)
	}
	paused, resume := make(chan struct{}), make(chan struct{})
	var got []uint64
	read := make(chan error, 1)
	go func() {
		read <- Scan(ctx, s, Range{}, func(r Record) error {
			got = append(got, r.Seq)
			if len(got) == 300 {
				close(paused)
				select {
				case <-resume:
				case <-ctx.Done():
				}
			}
			return nil
		})
	}()
	select {
	case <-paused:
	case err := <-read:
		t.Fatalf("the read ended before its 300th record: %v", err)
	case <-ctx.Done():
		t.Fatal("the read did not reach its 300th record in 3 minutes")
	}
	interrupt(s)
	close(resume)
	select {
	case err = <-read:
	case <-ctx.Done():
		t.Fatal("the read neither ended nor failed in 3 minutes")
	}
	if errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("the read neither ended nor failed in 3 minutes (%d records read)", len(got))
	}
	return got, err
}

// checkPrefix fails unless got is 1, 2, ... len(got): no record lost
// between two, none twice, none out of order.
func checkPrefix(t *testing.T, got []uint64) {
	t.Helper()
	for i, s := range got {
		if s != uint64(i+1) {
			t.Fatalf("record %d of the read is sequence %d", i+1, s)
		}
	}
}

// checkWhole fails the test unless the read ended without an error
// having delivered every record once, in order.
func checkWhole(t *testing.T, got []uint64, err error) {
	t.Helper()
	if err != nil {
		t.Fatalf("after %d records: %v", len(got), err)
	}
	checkPrefix(t, got)
	if len(got) != testRecords {
		t.Fatalf("read %d records of %d", len(got), testRecords)
	}
}

// A server lost for good in the middle of a read ends it with an error,
// not with the records received so far as if they were all.
func TestScanFailsWhenTheServerIsGone(t *testing.T) {
	srv := jstest.Listen(t, server.Options{})
	fill(t, srv)
	got, err := interruptedRead(t, srv.ClientURL(), []nats.Option{nats.MaxReconnects(2), nats.ReconnectWait(50 * time.Millisecond)},
		func(jetstream.Stream) { jstest.Stop(srv) })
	checkPrefix(t, got)
	if err == nil {
		t.Fatalf("the read ended without an error after %d of %d records, the server gone", len(got), testRecords)
	}
	if len(got) >= testRecords {
		t.Fatalf("read all %d records from a server shut down after 300", len(got))
	}
	t.Logf("%d records, then: %v", len(got), err)
}

// A read goes on across a restart of the server and delivers every
// record once, in order.
func TestScanCompletesAcrossARestart(t *testing.T) {
	dir := t.TempDir()
	srv := jstest.Listen(t, server.Options{StoreDir: dir})
	port := srv.Addr().(*net.TCPAddr).Port
	fill(t, srv)
	got, err := interruptedRead(t, srv.ClientURL(), []nats.Option{nats.MaxReconnects(-1), nats.ReconnectWait(50 * time.Millisecond)},
		func(jetstream.Stream) {
			jstest.Stop(srv)
			jstest.Listen(t, server.Options{StoreDir: dir, Port: port})
		})
	checkWhole(t, got, err)
}

// A read whose consumer is deleted under it makes another from where it
// was, and delivers every record once, in order.
func TestScanCompletesWhenItsConsumerIsDeleted(t *testing.T) {
	srv := jstest.Listen(t, server.Options{})
	fill(t, srv)
	deleted := 0
	got, err := interruptedRead(t, srv.ClientURL(), nil, func(s jetstream.Stream) {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		names := s.ConsumerNames(ctx)
		for name := range names.Name() {
			if err := s.DeleteConsumer(ctx, name); err != nil {
				t.Errorf("delete consumer %s: %v", name, err)
			}
			deleted++
		}
		if err := names.Err(); err != nil {
			t.Errorf("list consumers: %v", err)
		}
	})
	if deleted == 0 {
		t.Fatal("the read had no consumer to delete")
	}
	checkWhole(t, got, err)
}

func TestParseAck(t *testing.T) {
	for _, c := range []struct {
		reply string
		want  ackMeta
		ok    bool
	}{
		{"$JS.ACK.T.c1.1.42.7.1700000000000000000.9", ackMeta{seq: 42, nanos: 1700000000000000000, pending: 9}, true},
		{"$JS.ACK._.ACCHASH.T.c1.1.42.7.1700000000000000000.9.rnd", ackMeta{seq: 42, nanos: 1700000000000000000, pending: 9}, true},
		{"$JS.ACK.hub.ACCHASH.T.c1.1.42.7.1700000000000000000.9", ackMeta{seq: 42, nanos: 1700000000000000000, pending: 9}, true},
		{"$JS.ACK.hub.ACCHASH.T.c1.1.42.7.1700000000000000000.9.rnd.more", ackMeta{seq: 42, nanos: 1700000000000000000, pending: 9}, true},
		{"$JS.ACK.T.c1.1.42.7.1700000000000000000", ackMeta{}, false},
		{"$JS.ACK.x.T.c1.1.42.7.1700000000000000000.9", ackMeta{}, false},
		{"$JS.ACK.T.c1.1.x.7.1700000000000000000.9", ackMeta{}, false},
		{"$JS.ACK.T.c1.1.0.7.1700000000000000000.9", ackMeta{}, false},
		{"$JS.ACK.T.c1.1.42.7.1700000000000000000.9.", ackMeta{}, false},
		{"_INBOX.abc", ackMeta{}, false},
		{"", ackMeta{}, false},
	} {
		got, ok := parseAck(c.reply)
		if ok != c.ok || got != c.want {
			t.Errorf("%q: %+v, %v; want %+v, %v", c.reply, got, ok, c.want, c.ok)
		}
	}
}
