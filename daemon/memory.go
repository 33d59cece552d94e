package daemon

import (
	"context"
	"os"
	"runtime"
	"runtime/debug"
	rmetrics "runtime/metrics"
	"time"
)

// The daemon's memory is mostly what it must hold: the journal server's
// index of every subject, about 1 KB per sandbox. Go's default collector
// lets the heap grow to twice that before it collects, so a command that
// makes garbage (a reap's owner lookups, the journal's open itself) left
// the daemon holding as much again. A soft limit a little above the live
// heap keeps it near what it holds; it follows the live heap as the
// journal grows, so a larger journal does not keep the collector running.
// GOMEMLIMIT or GOGC, Go's own settings, replace it.
const (
	memoryHeadroomMin = 32 << 20
	memoryFollowEvery = 10 * time.Second
)

// memoryLimit is the soft limit for a live heap of live bytes: half as
// much again, and at least memoryHeadroomMin more.
func memoryLimit(live uint64) int64 {
	return int64(live + max(memoryHeadroomMin, live/2))
}

// holdMemory sets the soft memory limit from the live heap once the
// journal is open, again after a collection (so the open's transient
// buffers are not counted), then follows the live heap until ctx is done.
// The returned func stops it and restores the limit found. Without effect
// when GOMEMLIMIT or GOGC is set.
func holdMemory(ctx context.Context) (stop func()) {
	if os.Getenv("GOMEMLIMIT") != "" || os.Getenv("GOGC") != "" {
		return func() {}
	}
	prev := debug.SetMemoryLimit(-1)
	sample := []rmetrics.Sample{{Name: "/gc/heap/live:bytes"}}
	follow := func() {
		rmetrics.Read(sample)
		if sample[0].Value.Kind() == rmetrics.KindUint64 {
			debug.SetMemoryLimit(memoryLimit(sample[0].Value.Uint64()))
		}
	}
	follow()
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		runtime.GC()
		for {
			follow()
			select {
			case <-ctx.Done():
				return
			case <-time.After(memoryFollowEvery):
			}
		}
	}()
	return func() {
		cancel()
		<-done
		debug.SetMemoryLimit(prev)
	}
}
