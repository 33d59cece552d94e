package store_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/oklog/ulid/v2"

	"github.com/nexus-sandbox/nexus/core"
	"github.com/nexus-sandbox/nexus/events"
	"github.com/nexus-sandbox/nexus/store"
)

// groupWriters is how many goroutines the append-group child runs; each
// has one call in flight, of one event or of a three-event saga step.
const groupWriters = 16

// appendConcurrently is the append-group child: groupWriters goroutines
// append until the process is killed, each about its own sandbox, so their
// appends are committed in groups. Every event of a call is printed only
// after the call returned, one line per write.
func appendConcurrently(ctx context.Context, n *store.Store) {
	var out sync.Mutex
	for w := 0; w < groupWriters; w++ {
		go func() {
			sb := ulid.Make().String()
			rev := uint64(0)
			for i := 0; ; i++ {
				var evs []events.Event
				if i%4 == 3 {
					// A saga step's events: one atomic batch.
					saga := ulid.Make().String()
					for k, p := range []events.Payload{events.SagaStartedEvent{Kind: "rm"}, events.WarningRaisedEvent{Reason: "step"}, events.SagaFinishedEvent{}} {
						e := events.New(ulid.Make(), time.Now(), sb, p)
						e.Saga, e.Step = saga, fmt.Sprint("s", k)
						evs = append(evs, e)
					}
				} else {
					evs = append(evs, events.New(ulid.Make(), time.Now(), sb, events.SandboxCreatedEvent{Image: "i", Driver: "process"}))
				}
				seqs, err := n.AppendExpect(ctx, []core.Expect{{Entity: core.Sandbox(sb), Seq: rev}}, evs...)
				if err != nil {
					fmt.Fprintf(os.Stderr, "child: writer append: %v\n", err)
					os.Exit(2)
				}
				rev = seqs[len(seqs)-1]
				var b strings.Builder
				for k, e := range evs {
					fmt.Fprintf(&b, "acked %d %s\n", seqs[k], e.ID)
				}
				out.Lock()
				_, err = os.Stdout.WriteString(b.String())
				out.Unlock()
				if err != nil {
					os.Exit(2)
				}
			}
		}()
	}
	select {}
}

// Concurrent appenders committed in groups: every acknowledged event is in
// the journal after a SIGKILL, at the sequence it was acknowledged with,
// and stored once; the unacknowledged ones stored are at most what was in
// flight.
func TestSIGKILLMidGroupCommit(t *testing.T) {
	if testing.Short() {
		t.Skip("starts and kills child processes")
	}
	root := t.TempDir()
	ctx := context.Background()
	var known []ack
	for cycle := 1; cycle <= 3; cycle++ {
		got := killAfterAcks(t, "append-group", root, 300+rand.IntN(200))
		known = append(known, got...)
		n, err := store.Open(ctx, root, store.Options{})
		if err != nil {
			t.Fatalf("cycle %d: open after SIGKILL: %v", cycle, err)
		}
		recs := readAll(t, n)
		holdsAcked(t, cycle, recs, known)
		if extra := len(recs) - len(known); extra < 0 || extra > 3*groupWriters {
			t.Fatalf("cycle %d: journal has %d events, %d known; at most %d unacknowledged can exist", cycle, len(recs), len(known), 3*groupWriters)
		}
		t.Logf("cycle %d: %d acks, journal holds %d events (%d stored unacknowledged)", cycle, len(got), len(recs), len(recs)-len(known))
		// What was stored unacknowledged must stay stored, once.
		ids := map[ulid.ULID]bool{}
		for _, a := range known {
			ids[a.id] = true
		}
		for _, r := range recs {
			if !ids[r.Event.ID] {
				known = append(known, ack{r.Seq, r.Event.ID})
			}
		}
		if err := n.Close(); err != nil {
			t.Fatalf("cycle %d: close: %v", cycle, err)
		}
	}
}
