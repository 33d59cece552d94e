package fleet

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/nexus-sandbox/nexus/host/journal"
	"github.com/nexus-sandbox/nexus/internal/testutil"
)

// fleetBurst links hosts nexus hosts to a 3-node cluster run from the
// template, appends events to every journal at once, and returns how long
// the burst took and how long after its end every mirror was current. It
// also fails if a hub ever holds fewer leaf links than there are hosts
// (an eviction) while they catch up.
func fleetBurst(tb testing.TB, hosts, events int) (burst, after time.Duration) {
	tb.Helper()

	names := make([]string, hosts)
	for i := range names {
		names[i] = fmt.Sprintf("host-%02d", i)
	}
	c := startTemplateFleet(tb, names, nil)
	js, ms := c.openHosts(tb, 0)
	ajs := c.auditor(tb, 0)

	began := time.Now()
	done := make(chan error, hosts)
	for i := range js {
		go func() {
			for k := range events {
				if _, err := js[i].Append(context.Background(), journal.Message{
					Subject: "nexus.events.sandbox.created.x", ID: fmt.Sprintf("m-%d", k), Data: []byte("e"),
				}); err != nil {
					done <- err
					return
				}
			}
			done <- nil
		}()
	}
	for range js {
		if err := <-done; err != nil {
			tb.Fatal(err)
		}
	}
	start := time.Now()
	burst = start.Sub(began)
	deadline := start.Add(testutil.Scale(2 * time.Minute))
	for _, m := range ms {
		for {
			leaves := 0
			for _, n := range c.nodes {
				leaves += n.NumLeafNodes()
			}
			if leaves < hosts {
				tb.Fatalf("the hubs hold %d leaf links for %d hosts: a link was dropped", leaves, hosts)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			s, err := ajs.Stream(ctx, m.StreamName())
			cancel()
			if err == nil && s.CachedInfo().State.Msgs == uint64(events) {
				break
			}
			if time.Now().After(deadline) {
				tb.Fatalf("%s not current after %v (%v)", m.StreamName(), testutil.Scale(2*time.Minute), err)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	return burst, time.Since(start)
}

// TestFleetTwelveHostsOnThreeNodes: more hosts than nodes, none evicts
// another, every mirror current after a burst.
func TestFleetTwelveHostsOnThreeNodes(t *testing.T) {
	testutil.SkipInShort(t, "runs a three-node fleet cluster")
	burst, after := fleetBurst(t, 12, 100)
	t.Logf("12 hosts × 100 events: burst %v, every mirror current %v after it", burst, after)
}

// BenchmarkFleetCurrentAfterBurst: time for N hosts' mirrors to be
// current after a burst of 1,000 events each.
func BenchmarkFleetCurrentAfterBurst(b *testing.B) {
	for _, hosts := range []int{3, 12} {
		b.Run(fmt.Sprintf("hosts=%d", hosts), func(b *testing.B) {
			for range b.N {
				burst, after := fleetBurst(b, hosts, 1000)
				b.ReportMetric(burst.Seconds(), "s-burst")
				b.ReportMetric(after.Seconds(), "s-current-after")
			}
		})
	}
}
