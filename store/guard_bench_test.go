package store_test

import (
	"context"
	"testing"
	"time"

	"github.com/oklog/ulid/v2"

	"github.com/nexus-sandbox/nexus/core"
	"github.com/nexus-sandbox/nexus/events"
	"github.com/nexus-sandbox/nexus/store"
)

// BenchmarkAppendGuardedVsPlain interleaves, per op, one plain append and
// one guarded append (an expectation on the sandbox, checked by the store
// and by the journal over nexus.events.*.*.<sandbox>) on a journal holding
// 2,000 sandboxes' events, and reports ratio = guarded ÷ plain. Target:
// ratio <= 1.10.
func BenchmarkAppendGuardedVsPlain(b *testing.B) {
	ctx := context.Background()
	n, err := store.Open(ctx, b.TempDir(), store.Options{})
	if err != nil {
		b.Fatal(err)
	}
	defer n.Close()
	ids := make([]string, 2000)
	for i := range ids {
		ids[i] = ulid.Make().String()
		e := events.New(ulid.Make(), time.Now(), ids[i], events.SagaStartedEvent{Kind: "create"})
		e.Saga = ulid.Make().String()
		if _, err := n.Append(ctx, e); err != nil {
			b.Fatal(err)
		}
	}
	warn := func(id string) events.Event {
		return events.New(ulid.Make(), time.Now(), id, events.WarningRaisedEvent{Reason: "bench"})
	}
	var plain, guarded time.Duration
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		a, c := ids[i%len(ids)], ids[(i+len(ids)/2)%len(ids)]
		t0 := time.Now()
		if _, err := n.Append(ctx, warn(a)); err != nil {
			b.Fatal(err)
		}
		t1 := time.Now()
		x := []core.Expect{{Entity: core.Sandbox(c), Seq: n.Rev(core.Sandbox(c))}}
		if _, err := n.AppendExpect(ctx, x, warn(c)); err != nil {
			b.Fatal(err)
		}
		guarded += time.Since(t1)
		plain += t1.Sub(t0)
	}
	b.StopTimer()
	b.ReportMetric(float64(plain.Nanoseconds())/float64(b.N), "plain-ns/op")
	b.ReportMetric(float64(guarded.Nanoseconds())/float64(b.N), "guarded-ns/op")
	b.ReportMetric(float64(guarded)/float64(plain), "ratio")
}
