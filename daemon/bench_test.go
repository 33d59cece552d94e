package daemon_test

// BenchmarkAppendGroupCommit measures concurrent appends through the daemon
// against the rate a group commit reaches on the same disk in the same run:
//
//	raw:    g writers hand ~215-byte records to one committer, which writes
//	        every record queued so far to one append-only file, fsyncs once,
//	        and only then acknowledges each of them (a database's group commit)
//	daemon: g writers, each its own client connection (a separate command),
//	        each appending one event and waiting for its acknowledgement
//	ratio:  daemon events/s ÷ raw records/s (target: ≥ 0.8)
//
// cpu-us/event and raw-cpu-us/event are this process's CPU per event
// while each side ran (whether a rate is bound by CPU or by waiting);
// per-fsync is the in-process store's events per journal fsync.
//
// See docs/benchmarks.md for the figures.

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/oklog/ulid/v2"

	"github.com/nexus-sandbox/nexus/control"
	"github.com/nexus-sandbox/nexus/control/local"
	"github.com/nexus-sandbox/nexus/control/wire"
	"github.com/nexus-sandbox/nexus/daemon"
	"github.com/nexus-sandbox/nexus/events"
	"github.com/nexus-sandbox/nexus/store"
)

func BenchmarkAppendGroupCommit(b *testing.B) {
	for _, c := range []struct {
		g       int
		through string
	}{{1, "daemon"}, {8, "daemon"}, {32, "daemon"}, {1, "node"}, {8, "node"}, {32, "node"}} {
		g := c.g
		b.Run(fmt.Sprintf("%s/g=%d", c.through, g), func(b *testing.B) {
			dir := b.TempDir()
			n := max(b.N, 2*g)
			evs := benchEvents(b, g, n)
			data, err := events.Encode(evs[0][0])
			if err != nil {
				b.Fatal(err)
			}
			var d appender
			if c.through == "daemon" {
				d = startBenchDaemon(b, filepath.Join(dir, "root"), g)
			} else {
				d = openBenchNode(b, filepath.Join(dir, "root"), g)
			}
			raw := openRaw(b, filepath.Join(dir, "raw.log"))

			// Raw and daemon alternate in rounds of roundEvents each, so
			// both see the disk (and this shared machine) in the same state.
			const roundEvents = 128
			var rawTime, daemonTime, daemonCPU, rawCPU time.Duration
			rawBatches := 0
			syncs0 := 0
			if bd, ok := d.(*benchDaemon); ok && bd.syncs != nil {
				syncs0 = bd.syncs()
			}
			b.ResetTimer()
			for from := 0; from < n; from += roundEvents {
				k := min(roundEvents, n-from)
				t0 := time.Now()
				c0 := cpuNow()
				rawBatches += raw.run(b, g, k, data)
				rawCPU += cpuNow() - c0
				rawTime += time.Since(t0)
				t0 = time.Now()
				c0 = cpuNow()
				d.run(b, evs, from, k)
				daemonCPU += cpuNow() - c0
				daemonTime += time.Since(t0)
			}
			b.StopTimer()
			if bd, ok := d.(*benchDaemon); ok && bd.syncs != nil {
				b.ReportMetric(float64(n)/float64(bd.syncs()-syncs0), "per-fsync")
			}
			rawRate := float64(n) / rawTime.Seconds()
			rate := float64(n) / daemonTime.Seconds()
			b.ReportMetric(rawRate, "raw-events/s")
			b.ReportMetric(float64(n)/float64(rawBatches), "raw-per-fsync")
			b.ReportMetric(rate, "events/s")
			b.ReportMetric(rate/rawRate, "ratio")
			// The process's CPU per event while the writers ran: whether a
			// rate is bound by the CPU or by waiting.
			b.ReportMetric(float64(daemonCPU.Microseconds())/float64(n), "cpu-us/event")
			b.ReportMetric(float64(rawCPU.Microseconds())/float64(n), "raw-cpu-us/event")
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

type rawLog struct{ f *os.File }

func openRaw(b *testing.B, path string) *rawLog {
	b.Helper()
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { f.Close() })
	return &rawLog{f: f}
}

// run has g writers append k records in all through one committer, and
// returns the number of fsyncs.
func (r *rawLog) run(b *testing.B, g, k int, rec []byte) int {
	b.Helper()
	type req struct{ done chan error }
	var (
		mu      sync.Mutex
		queue   []req
		wake    = make(chan struct{}, 1)
		stop    = make(chan struct{})
		batches int
		buf     []byte
	)
	committed := make(chan struct{})
	go func() {
		defer close(committed)
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
			_, err := r.f.Write(buf)
			if err == nil {
				err = r.f.Sync()
			}
			batches++
			for _, q := range group {
				q.done <- err
			}
		}
	}()
	var next atomic.Int64
	var wg sync.WaitGroup
	for w := 0; w < g; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			q := req{done: make(chan error, 1)}
			for next.Add(1) <= int64(k) {
				mu.Lock()
				queue = append(queue, q)
				mu.Unlock()
				select {
				case wake <- struct{}{}:
				default:
				}
				if err := <-q.done; err != nil {
					b.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(stop)
	<-committed
	return batches
}

type benchDaemon struct {
	clients []control.Backend
	syncs   func() int // the journal's fsyncs, when in process
}

// startBenchDaemon runs a daemon on root until the benchmark ends and
// connects g clients to it, each its own connection (a separate command).
func startBenchDaemon(b *testing.B, root string, g int) *benchDaemon {
	b.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	ready := make(chan struct{})
	go func() {
		done <- daemon.Run(ctx, root, daemon.Options{Ready: func(wire.Status) { close(ready) }})
	}()
	d := &benchDaemon{}
	b.Cleanup(func() {
		for _, c := range d.clients {
			c.Close()
		}
		cancel()
		if err := <-done; err != nil {
			b.Errorf("daemon: %v", err)
		}
	})
	select {
	case <-ready:
	case err := <-done:
		done <- err
		b.Fatalf("daemon exited before it was ready: %v", err)
	}
	for w := 0; w < g; w++ {
		c, err := local.Connect(ctx, root, 5*time.Second)
		if err != nil {
			b.Fatal(err)
		}
		d.clients = append(d.clients, c)
	}
	return d
}

type appender interface {
	run(b *testing.B, evs [][]events.Event, from, k int)
}

// openBenchNode opens a store on root in this process, without a daemon:
// the group commit alone, for comparison with the daemon's figure.
func openBenchNode(b *testing.B, root string, g int) *benchDaemon {
	b.Helper()
	n, err := store.Open(context.Background(), root, store.Options{})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { n.Close() })
	d := &benchDaemon{syncs: n.Journal().Syncs}
	for w := 0; w < g; w++ {
		d.clients = append(d.clients, local.Backend{Store: n})
	}
	return d
}

// run appends k events in all, the writers taking turns from event index
// from on; each writer appends its own sandbox's events and waits for each
// acknowledgement before the next.
func (d *benchDaemon) run(b *testing.B, evs [][]events.Event, from, k int) {
	b.Helper()
	g := len(evs)
	var wg sync.WaitGroup
	for w := range evs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			// Event i overall is writer i%g's (i/g)-th event.
			for i := from + (w-from%g+g)%g; i < from+k; i += g {
				if _, err := d.clients[w].Append(context.Background(), evs[w][i/g]); err != nil {
					b.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
}

// cpuNow is this process's CPU time so far (the daemon, its clients and
// the store all run in it).
func cpuNow() time.Duration {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
