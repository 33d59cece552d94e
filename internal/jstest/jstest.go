// Package jstest runs nats-server with JetStream inside a test's process,
// for tests and benchmarks of the engine itself, with nothing of nexus in
// front of it. Tests and benchmarks only.
package jstest

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/nexus-sandbox/nexus/internal/testutil"
)

// Start starts a server with o's settings, JetStream on, no listener, no
// log and no signal handlers, and stops it when the test ends. Stop may
// stop it before.
func Start(tb testing.TB, o server.Options) *server.Server {
	tb.Helper()
	o.DontListen = true
	return start(tb, o)
}

// Listen is Start with a client listener on 127.0.0.1:o.Port (any free
// port when 0), for clients that must reconnect: to the same server
// started again on its port and store, or not at all.
func Listen(tb testing.TB, o server.Options) *server.Server {
	tb.Helper()
	o.Host = "127.0.0.1"
	if o.Port == 0 {
		o.Port = server.RANDOM_PORT
	}
	return start(tb, o)
}

func start(tb testing.TB, o server.Options) *server.Server {
	tb.Helper()
	o.JetStream, o.NoLog, o.NoSigs = true, true, true
	if o.StoreDir == "" {
		o.StoreDir = tb.TempDir()
	}
	srv, err := server.NewServer(&o)
	if err != nil {
		tb.Fatal(err)
	}
	srv.Start()
	tb.Cleanup(func() { Stop(srv) })
	if !srv.ReadyForConnections(testutil.Scale(30 * time.Second)) {
		tb.Fatal("jetstream server not ready")
	}
	return srv
}

// Stop shuts srv down and waits until it has; a second Stop returns at once.
func Stop(srv *server.Server) {
	srv.Shutdown()
	srv.WaitForShutdown()
}

// Connect is a JetStream client of srv over a connection of its own in
// the process, closed when the test ends.
func Connect(tb testing.TB, srv *server.Server, opts ...jetstream.JetStreamOpt) jetstream.JetStream {
	tb.Helper()
	nc, err := nats.Connect("", nats.InProcessServer(srv))
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(nc.Close)
	js, err := jetstream.New(nc, opts...)
	if err != nil {
		tb.Fatal(err)
	}
	return js
}

// WaitMsgs waits until stream holds n messages (a sourced stream fills
// behind its sources), and fails the test with what it holds if it does
// not within a scaled 30 seconds.
func WaitMsgs(tb testing.TB, ctx context.Context, stream jetstream.Stream, n uint64) {
	tb.Helper()
	for deadline := time.Now().Add(testutil.Scale(30 * time.Second)); ; {
		info, err := stream.Info(ctx)
		if err == nil && info.State.Msgs == n {
			return
		}
		if time.Now().After(deadline) {
			var state jetstream.StreamState
			if info != nil {
				state = info.State
			}
			tb.Fatalf("stream holds %+v (%v), want %d messages", state, err, n)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
