package store

import (
	"context"
	"testing"
	"time"

	"github.com/oklog/ulid/v2"

	"github.com/nexus-sandbox/nexus/events"
)

// BenchmarkAppendingCommand10k is what one appending command without a
// daemon costs on a root of 10,000 sandboxes: Open (snapshots plus the
// tail), one append, Close. Each op runs it twice, interleaved:
//
//	now:    Close as it is, which leaves the snapshots alone below a tail of closeSnapshotMin
//	before: Close that rewrites every snapshot after any append, as it did
//	ratio:  now ÷ before
func BenchmarkAppendingCommand10k(b *testing.B) {
	ctx := context.Background()
	root := b.TempDir()
	n, err := Open(ctx, root, Options{})
	if err != nil {
		b.Fatal(err)
	}
	const sandboxes = 10_000
	for from := 0; from < sandboxes; from += 1000 {
		evs := make([]events.Event, 1000)
		for i := range evs {
			id := ulid.Make().String()
			evs[i] = events.New(ulid.Make(), time.Now(), id, events.SandboxCreatedEvent{
				Image: "ghcr.io/nexus/base:24.04", Driver: "process",
				Resources: []events.Resource{{Kind: events.KindRawDisk, Path: "disks/" + id + ".raw"}, {Kind: events.KindRawDisk, Path: "disks/" + id + "-workspace.ext4"}},
			})
		}
		if _, err := n.Append(ctx, evs...); err != nil {
			b.Fatal(err)
		}
	}
	if err := n.Close(); err != nil { // writes the snapshots: the tail is 10,000
		b.Fatal(err)
	}
	command := func(rewrite bool) time.Duration {
		t0 := time.Now()
		n, err := Open(ctx, root, Options{})
		if err != nil {
			b.Fatal(err)
		}
		if _, err := n.Append(ctx, events.New(ulid.Make(), time.Now(), "", events.WarningRaisedEvent{Reason: "bench"})); err != nil {
			b.Fatal(err)
		}
		if rewrite {
			n.mu.Lock()
			err = n.writeSnapshots()
			n.mu.Unlock()
			if err != nil {
				b.Fatal(err)
			}
		}
		if err := n.Close(); err != nil {
			b.Fatal(err)
		}
		return time.Since(t0)
	}
	var now, before time.Duration
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		now += command(false)
		before += command(true)
	}
	b.ReportMetric(float64(now.Milliseconds())/float64(b.N), "now-ms/op")
	b.ReportMetric(float64(before.Milliseconds())/float64(b.N), "before-ms/op")
	b.ReportMetric(float64(now)/float64(before), "ratio")
}
