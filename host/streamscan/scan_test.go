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
)

const testRecords = 3000

// startServer runs a JetStream server on 127.0.0.1:port (0: any) with
// its store in dir.
func startServer(t *testing.T, dir string, port int) *server.Server {
	t.Helper()
	if port == 0 {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		port = l.Addr().(*net.TCPAddr).Port
		l.Close()
	}
	srv, err := server.NewServer(&server.Options{
		ServerName: "streamscan-test", Host: "127.0.0.1", Port: port,
		JetStream: true, StoreDir: dir, NoLog: true, NoSigs: true,
	})
	if err != nil {
		t.Fatal(err)
	}
	srv.Start()
	if !srv.ReadyForConnections(time.Minute) {
		t.Fatal("nats-server not ready within a minute")
	}
	return srv
}

func stop(srv *server.Server) {
	srv.Shutdown()
	srv.WaitForShutdown()
}

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
// opts; after the 300th record it calls interrupt, then goes on. It
// returns the sequences read and the read's error.
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
	var got []uint64
	err = Scan(ctx, s, Range{}, func(r Record) error {
		got = append(got, r.Seq)
		if len(got) == 300 {
			interrupt(s)
		}
		return nil
	})
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

// A server lost for good in the middle of a read ends it with an error,
// not with the records received so far as if they were all.
func TestScanFailsWhenTheServerIsGone(t *testing.T) {
	srv := startServer(t, t.TempDir(), 0)
	defer stop(srv)
	fill(t, srv)
	got, err := interruptedRead(t, srv.ClientURL(), []nats.Option{nats.MaxReconnects(2), nats.ReconnectWait(50 * time.Millisecond)},
		func(jetstream.Stream) { stop(srv) })
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
	srv := startServer(t, dir, 0)
	port := srv.Addr().(*net.TCPAddr).Port
	defer func() { stop(srv) }()
	fill(t, srv)
	got, err := interruptedRead(t, srv.ClientURL(), []nats.Option{nats.MaxReconnects(-1), nats.ReconnectWait(50 * time.Millisecond)},
		func(jetstream.Stream) {
			stop(srv)
			srv = startServer(t, dir, port)
		})
	if err != nil {
		t.Fatalf("after %d records: %v", len(got), err)
	}
	checkPrefix(t, got)
	if len(got) != testRecords {
		t.Fatalf("read %d records of %d", len(got), testRecords)
	}
}

// A read whose consumer is deleted under it makes another from where it
// was, and delivers every record once, in order.
func TestScanCompletesWhenItsConsumerIsDeleted(t *testing.T) {
	srv := startServer(t, t.TempDir(), 0)
	defer stop(srv)
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
	if err != nil {
		t.Fatalf("after %d records: %v", len(got), err)
	}
	checkPrefix(t, got)
	if len(got) != testRecords {
		t.Fatalf("read %d records of %d", len(got), testRecords)
	}
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
