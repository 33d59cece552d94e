package control_test

// BenchmarkAppendGroupCommit measures concurrent appends through the daemon
// against the rate a group commit reaches on the same disk in the same run:
//
//	raw:    g writers hand ~215-byte records to one committer, which writes
//	        every record queued so far to one append-only file, fsyncs once,
//	        and only then acknowledges each of them (a database's group commit)
//	daemon: g writers, each its own client connection (a separate command),
//	        each appending one event and waiting for its acknowledgement
//	ratio:  daemon events/s ÷ raw records/s (issue 21 target: ≥ 0.8)
//
// See docs/benchmarks.md for the figures.

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/oklog/ulid/v2"

	"github.com/nexus-sandbox/nexus/control"
	"github.com/nexus-sandbox/nexus/events"
)

func BenchmarkAppendGroupCommit(b *testing.B) {
	for _, g := range []int{8, 32} {
		b.Run(fmt.Sprintf("g=%d", g), func(b *testing.B) {
			dir := b.TempDir()
			n := max(b.N, 2*g)
			evs := benchEvents(b, g, n)
			data, err := events.Encode(evs[0][0])
			if err != nil {
				b.Fatal(err)
			}

			// Raw first, then the daemon, so both see the same disk within
			// seconds of each other.
			b.ResetTimer()
			rawRate, rawBatches := rawGroupCommit(b, filepath.Join(dir, "raw.log"), g, n, data)
			rate := daemonAppends(b, filepath.Join(dir, "root"), evs)
			b.StopTimer()
			b.ReportMetric(rawRate, "raw-events/s")
			b.ReportMetric(float64(n)/float64(rawBatches), "raw-per-fsync")
			b.ReportMetric(rate, "events/s")
			b.ReportMetric(rate/rawRate, "ratio")
		})
	}
}

// benchEvents is n events split over g writers; writer w's events are
// about its own sandbox, so no two writers contend for one entity.
func benchEvents(b *testing.B, g, n int) [][]events.Event {
	b.Helper()
	t0 := time.Date(2026, 12, 4, 9, 0, 0, 0, time.UTC)
	out := make([][]events.Event, g)
	for w := range out {
		sandbox := ulid.Make().String()
		for i := w; i < n; i += g {
			at := t0.Add(time.Duration(i) * time.Millisecond)
			out[w] = append(out[w], events.New(ulid.Make(), at, sandbox, events.DiskMaterialisedEvent{
				Resource:       events.Resource{Kind: events.KindRawDisk, Path: "disks/" + sandbox + ".raw"},
				Method:         "reflink",
				AllocatedBytes: 1 << 20,
				ApparentBytes:  8 << 30,
			}))
		}
	}
	return out
}

// rawGroupCommit runs g writers appending n records in all through one
// committer, and returns records/s and the number of fsyncs.
func rawGroupCommit(b *testing.B, path string, g, n int, rec []byte) (float64, int) {
	b.Helper()
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	type req struct{ done chan error }
	var (
		mu      sync.Mutex
		queue   []req
		wake    = make(chan struct{}, 1)
		stop    = make(chan struct{})
		batches int
		buf     []byte
	)
	go func() {
		for {
			select {
			case <-wake:
			case <-stop:
				return
			}
			mu.Lock()
			group := queue
			queue = nil
			mu.Unlock()
			if len(group) == 0 {
				continue
			}
			buf = buf[:0]
			for range group {
				buf = append(buf, rec...)
			}
			_, err := f.Write(buf)
			if err == nil {
				err = f.Sync()
			}
			batches++
			for _, r := range group {
				r.done <- err
			}
		}
	}()
	defer close(stop)
	var next atomic.Int64
	var wg sync.WaitGroup
	t0 := time.Now()
	for w := 0; w < g; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := req{done: make(chan error, 1)}
			for next.Add(1) <= int64(n) {
				mu.Lock()
				queue = append(queue, r)
				mu.Unlock()
				select {
				case wake <- struct{}{}:
				default:
				}
				if err := <-r.done; err != nil {
					b.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	return float64(n) / time.Since(t0).Seconds(), batches
}

// daemonAppends starts a daemon on root and has each writer append its
// events through its own connection; it returns events/s.
func daemonAppends(b *testing.B, root string, evs [][]events.Event) float64 {
	b.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	ready := make(chan struct{})
	go func() {
		done <- control.RunDaemon(ctx, root, control.DaemonOptions{Ready: func(control.Status) { close(ready) }})
	}()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			b.Errorf("daemon: %v", err)
		}
	}()
	select {
	case <-ready:
	case err := <-done:
		done <- err
		b.Fatalf("daemon exited before it was ready: %v", err)
	}
	clients := make([]control.Backend, len(evs))
	for w := range clients {
		c, err := control.Connect(ctx, root, 5*time.Second)
		if err != nil {
			b.Fatal(err)
		}
		defer c.Close()
		clients[w] = c
	}
	total := 0
	for _, w := range evs {
		total += len(w)
	}
	var wg sync.WaitGroup
	t0 := time.Now()
	for w := range evs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for _, e := range evs[w] {
				if _, err := clients[w].Append(ctx, e); err != nil {
					b.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	return float64(total) / time.Since(t0).Seconds()
}
