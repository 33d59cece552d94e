package fleet

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/oklog/ulid/v2"

	"github.com/nexus-sandbox/nexus/host/journal"
	"github.com/nexus-sandbox/nexus/internal/testutil"
)

const (
	fleetDomain = "fleet"
	leafUser    = "host-a"
	leafPass    = "s3cret-leaf"
)

// startFleet runs a second embedded nats-server standing in for the
// fleet's JetStream: its own domain, a leaf-node listener with a password.
// A restart passes the ports of the first run, so the host's link finds
// the fleet where it was.
func startFleet(t *testing.T, dir string, clientPort, leafPort int) *server.Server {
	t.Helper()
	testutil.SkipInShort(t, "starts a fleet server")
	o := &server.Options{
		ServerName: "fleet", Host: "127.0.0.1", Port: clientPort,
		JetStream: true, JetStreamDomain: fleetDomain, StoreDir: dir,
		NoLog: true, NoSigs: true, AuthTimeout: testutil.Scale(30 * time.Second).Seconds(),
	}
	o.LeafNode.Host, o.LeafNode.Port = "127.0.0.1", leafPort
	o.LeafNode.AuthTimeout = o.AuthTimeout
	o.LeafNode.Username, o.LeafNode.Password = leafUser, leafPass
	s, err := server.NewServer(o)
	if err != nil {
		t.Fatal(err)
	}
	s.SetLoggerV2(testutil.KeepServerLog(t, "fleet server"), false, false, false)
	s.Start()
	if !s.ReadyForConnections(testutil.Scale(10 * time.Second)) {
		t.Fatal("fleet server not ready")
	}
	return s
}

// mirrored reads the fleet's mirror stream from the start.
// freePort asks the kernel for an unused port.
func freePort(t testing.TB) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

func mirrored(t *testing.T, fleet *server.Server, stream string) []*nats.Msg {
	t.Helper()
	nc, js := connectJS(t, fleet.ClientURL())
	defer nc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s, err := js.Stream(ctx, stream)
	if err != nil {
		return nil
	}
	info, err := s.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var out []*nats.Msg
	for seq := uint64(1); seq <= info.State.LastSeq; seq++ {
		m, err := s.GetMsg(ctx, seq)
		if err != nil {
			t.Fatalf("get %d: %v", seq, err)
		}
		out = append(out, &nats.Msg{Subject: m.Subject, Data: m.Data, Header: m.Header})
	}
	return out
}

// awaitMirrored waits until the fleet holds n messages of the mirror; the
// fleet pulls asynchronously, so this is the signal, with a deadline.
func awaitMirrored(t *testing.T, fleet *server.Server, stream string, n int) []*nats.Msg {
	t.Helper()
	// The fleet retries a mirror whose source went away with a growing
	// backoff; after an outage it resumes within about 40 s here.
	deadline := time.Now().Add(testutil.Scale(90 * time.Second))
	for {
		got := mirrored(t, fleet, stream)
		if len(got) >= n {
			return got
		}
		if time.Now().After(deadline) {
			t.Fatalf("fleet mirror holds %d of %d messages after 30 s", len(got), n)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// awaitCreated waits until the fleet holds the mirror stream.
func awaitCreated(t *testing.T, fleet *server.Server, stream string) {
	t.Helper()
	nc, js := connectJS(t, fleet.ClientURL())
	defer nc.Close()
	testutil.WaitUntil(t, 30*time.Second, stream+" made on the fleet", func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_, err := js.Stream(ctx, stream)
		return err == nil
	})
}

// awaitReported waits until the host's report stream holds its report of
// journal sequence seq.
func awaitReported(t *testing.T, fleet *server.Server, stream string, seq uint64) {
	t.Helper()
	nc, js := connectJS(t, fleet.ClientURL())
	defer nc.Close()
	testutil.WaitUntil(t, 20*time.Second, fmt.Sprintf("sequence %d in %s's report", seq, stream), func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		rep, err := readReport(ctx, js, hostOfStream(stream), "")
		return err == nil && rep.LastSeq == seq
	})
}

// openMirrored opens a fresh journal mirroring, as host "host-a", to the
// fleet's leaf port.
func openMirrored(t *testing.T, leafPort int) (*journal.Journal, *Mirror) {
	t.Helper()
	j, m, err := openHost(t, "host-a", ulid.Make().String(), nil, leafPort)
	if err != nil {
		t.Fatal(err)
	}
	return j, m
}

// openHost opens a fresh journal mirroring as host name with identity id
// to the fleet's leaf ports, logging to log (nil: nowhere).
func openHost(t *testing.T, name, id string, log *slog.Logger, leafPorts ...int) (*journal.Journal, *Mirror, error) {
	t.Helper()
	m := &Mirror{Domain: fleetDomain, Host: name, HostID: id, Check: 200 * time.Millisecond}
	for _, p := range leafPorts {
		u, _ := url.Parse(fmt.Sprintf("nats-leaf://%s:%s@127.0.0.1:%d", leafUser, leafPass, p))
		m.URLs = append(m.URLs, u)
	}
	j, err := journal.Open(context.Background(), journal.Options{Dir: filepath.Join(t.TempDir(), "journal"), Mirror: m, Logger: log})
	if err != nil {
		return nil, m, err
	}
	t.Cleanup(func() { j.Close() })
	return j, m, nil
}

func TestMirrorToFleetSurvivesAnOutage(t *testing.T) {
	testutil.SkipInShort(t, "waits for the leaf link to come back after a fleet outage")
	fleetDir := t.TempDir()
	clientPort, leafPort := freePort(t), freePort(t)
	fleet := startFleet(t, fleetDir, clientPort, leafPort)
	j, m := openMirrored(t, leafPort)
	appendN(t, j, 0, 5)
	got := awaitMirrored(t, fleet, m.StreamName(), 5)
	// The create's answer can be lost on a busy fleet though the stream was
	// made; the next check finds the stream its own and clears the error.
	testutil.WaitUntil(t, 30*time.Second, "mirror status ok", func() bool {
		ok, _ := m.Status()
		return ok
	})

	// The fleet goes away; the journal keeps appending.
	fleet.Shutdown()
	fleet.WaitForShutdown()
	appendN(t, j, 5, 7)
	fleet = startFleet(t, fleetDir, clientPort, leafPort)
	defer fleet.Shutdown()

	got = awaitMirrored(t, fleet, m.StreamName(), 12)
	if len(got) != 12 {
		t.Fatalf("mirror holds %d messages, want exactly 12 (no duplicates)", len(got))
	}
	for i, msg := range got {
		if want := fmt.Sprintf("event %d", i); string(msg.Data) != want {
			t.Fatalf("mirror message %d = %q, want %q (order)", i+1, msg.Data, want)
		}
		if !strings.HasPrefix(msg.Subject, "host-a.nexus.events.") {
			t.Fatalf("mirror subject %q is not prefixed by the host", msg.Subject)
		}
	}

	// replay reads the mirror as it reads a journal: ids kept, in order.
	var recs []journal.Record
	if err := ReadMirror(context.Background(), fleet.ClientURL(), "", "", m.StreamName(), func(r journal.Record) error {
		recs = append(recs, r)
		return nil
	}, nil); err != nil {
		t.Fatal(err)
	}
	if len(recs) != 12 || recs[0].MsgID != "m-0" || recs[11].MsgID != "m-11" || recs[11].Seq != 12 {
		t.Fatalf("ReadMirror: %d records, first %+v", len(recs), recs[0])
	}
}

// TestFleetCannotWriteTheJournal: everything the fleet can send over the
// link that would change the journal is refused by the embedded server.
func TestFleetCannotWriteTheJournal(t *testing.T) {
	leafPort := freePort(t)
	fleet := startFleet(t, t.TempDir(), freePort(t), leafPort)
	defer fleet.Shutdown()
	j, m := openMirrored(t, leafPort)
	appendN(t, j, 0, 3)
	awaitMirrored(t, fleet, m.StreamName(), 3)

	nc, err := nats.Connect(fleet.ClientURL(), nats.Timeout(testutil.Scale(30*time.Second)))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	// A publish into the journal's subjects, stored and append-side, from
	// the fleet side.
	for _, subj := range []string{"nexus.events.sandbox.created.x", journal.AppendSubject("nexus.events.sandbox.created.x")} {
		if err := nc.Publish(subj, []byte("injected")); err != nil {
			t.Fatal(err)
		}
	}
	nc.Flush()
	// JetStream API calls addressed to this host's domain.
	local, err := jetstream.NewWithDomain(nc, m.localDomain())
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if err := local.DeleteStream(ctx, journal.StreamName); err == nil {
		t.Fatal("the fleet deleted the journal stream")
	}
	ctx2, cancel2 := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel2()
	if _, err := local.UpdateStream(ctx2, jetstream.StreamConfig{Name: journal.StreamName, Subjects: []string{journal.Subjects}}); err == nil {
		t.Fatal("the fleet updated the journal stream")
	}
	if recs := readAll(t, j, 1, ""); len(recs) != 3 {
		t.Fatalf("journal holds %d records after the fleet's attempts, want 3", len(recs))
	}
}

// A mirror's stream is named after the journal's stream it copies
// (fleetstate spells the name without linking the journal).
func TestMirrorStreamNamesTheJournalsStream(t *testing.T) {
	if got, want := MirrorStream("host-b"), journal.StreamName+"_HOST_B"; got != want {
		t.Fatalf("MirrorStream(host-b) = %s, want %s", got, want)
	}
}
