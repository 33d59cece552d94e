package daemon_test

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/oklog/ulid/v2"

	"github.com/nexus-sandbox/nexus/control/wire"
	"github.com/nexus-sandbox/nexus/daemon"
	"github.com/nexus-sandbox/nexus/host/fleet"
	"github.com/nexus-sandbox/nexus/internal/testutil"
)

// A daemon whose name the fleet says is another host's only after the
// daemon began serving stops, with the refusal as its error.
func TestDaemonStopsOnALateRefusal(t *testing.T) {
	testutil.SkipInShort(t, "starts a fleet server")
	o := &server.Options{ServerName: "fleet", Host: "127.0.0.1", Port: server.RANDOM_PORT,
		JetStream: true, JetStreamDomain: "fleet", StoreDir: t.TempDir(), NoLog: true, NoSigs: true,
		AuthTimeout: testutil.Scale(30 * time.Second).Seconds()}
	o.LeafNode.Host, o.LeafNode.Port = "127.0.0.1", server.RANDOM_PORT
	o.LeafNode.AuthTimeout = o.AuthTimeout
	hub, err := server.NewServer(o)
	if err != nil {
		t.Fatal(err)
	}
	hub.SetLoggerV2(testutil.KeepServerLog(t, "fleet server"), false, false, false)
	hub.Start()
	t.Cleanup(hub.Shutdown)
	if !hub.ReadyForConnections(testutil.Scale(10 * time.Second)) {
		t.Fatal("fleet not ready")
	}
	v, err := hub.Varz(nil)
	if err != nil {
		t.Fatal(err)
	}
	// host-a's mirror on the fleet, made by another host identity.
	nc, err := nats.Connect(hub.ClientURL(), nats.Timeout(testutil.Scale(30*time.Second)))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	ctx, cancel := context.WithTimeout(context.Background(), testutil.Scale(20*time.Second))
	defer cancel()
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: fleet.MirrorStream("host-a"), Subjects: []string{"elsewhere.>"},
		Metadata: map[string]string{"nexus_host_id": ulid.Make().String(), "nexus_host": "host-a"}}); err != nil {
		t.Fatal(err)
	}

	u, _ := url.Parse(fmt.Sprintf("nats-leaf://127.0.0.1:%d", v.LeafNode.Port))
	// Open waits for the fleet no time at all, so the refusal comes to a
	// daemon that already serves.
	m := &fleet.Mirror{URLs: []*url.URL{u}, Domain: "fleet", Host: "host-a", Check: 200 * time.Millisecond, StartWait: time.Nanosecond}
	ready := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		done <- daemon.Run(context.Background(), t.TempDir(), daemon.Options{Mirror: m, Ready: func(wire.Status) { close(ready) }})
	}()
	select {
	case err := <-done:
		select {
		case <-ready:
		default:
			t.Skipf("refused at open, before serving: %v", err)
		}
		if !errors.Is(err, fleet.ErrHostTaken) {
			t.Fatalf("the daemon returned %v, want the refusal", err)
		}
	case <-time.After(testutil.Scale(60 * time.Second)):
		ok, last := m.Status()
		t.Fatalf("the daemon still serves as host-a (mirror status %v, %q)", ok, last)
	}
}
