package local

import (
	"context"
	"testing"
	"time"

	"github.com/oklog/ulid/v2"

	"github.com/nexus-sandbox/nexus/events"
	"github.com/nexus-sandbox/nexus/layout"
	"github.com/nexus-sandbox/nexus/lifecycle"
	"github.com/nexus-sandbox/nexus/store"
)

// stoppedRoot journals n committed, stopped sandboxes into a new root and
// returns a store over it, opened as a command opens one.
func stoppedRoot(b *testing.B, n int) *store.Store {
	b.Helper()
	ctx := context.Background()
	root := b.TempDir()
	st, err := store.Open(ctx, root, store.Options{})
	if err != nil {
		b.Fatal(err)
	}
	for from := 0; from < n; from += 1000 {
		var evs []events.Event
		for range min(1000, n-from) {
			id := ulid.Make().String()
			evs = append(evs, events.New(ulid.Make(), time.Now(), id, events.SandboxCreatedEvent{Image: "i", Driver: "process",
				Resources: []events.Resource{{Kind: events.KindRawDisk, Path: "disks/" + id + ".raw"}}}))
		}
		if _, err := st.Append(ctx, evs...); err != nil {
			b.Fatal(err)
		}
	}
	if err := st.Close(); err != nil {
		b.Fatal(err)
	}
	st, err = store.Open(ctx, root, store.Options{Lazy: true})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { st.Close() })
	return st
}

// BenchmarkRecoverStopped runs recover on a root of 10 stopped sandboxes
// and on one of 1,000, alternately in one run, and reports the ratio: a
// recover that costs what is in flight (nothing here) stays near 1x; one
// that visits every sandbox grows with them. A figure, never an assertion.
func BenchmarkRecoverStopped(b *testing.B) {
	ctx := context.Background()
	small, large := stoppedRoot(b, 10), stoppedRoot(b, 1000)
	run := func(st *store.Store) time.Duration {
		m := &lifecycle.Manager{Root: layout.Root(st.Root()), B: Backend{st}}
		t0 := time.Now()
		rep, err := m.Recover(ctx)
		if err != nil {
			b.Fatal(err)
		}
		if rep.Checked != 0 {
			b.Fatalf("recover checked %d stopped sandboxes", rep.Checked)
		}
		return time.Since(t0)
	}
	run(small) // each store loads its projections on first use
	run(large)
	var smallT, largeT time.Duration
	b.ResetTimer()
	for range b.N {
		smallT += run(small)
		largeT += run(large)
	}
	b.ReportMetric(float64(smallT.Nanoseconds())/float64(b.N), "10-ns/op")
	b.ReportMetric(float64(largeT.Nanoseconds())/float64(b.N), "1k-ns/op")
	b.ReportMetric(float64(largeT)/float64(smallT), "1k/10")
}
