package fleet

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/oklog/ulid/v2"

	"github.com/nexus-sandbox/nexus/events"
	"github.com/nexus-sandbox/nexus/host/journal"
	"github.com/nexus-sandbox/nexus/internal/testutil"
)

// appendEvents appends n real events (sandbox.created, each its own
// sandbox) to j, in batches.
func appendEvents(tb testing.TB, j *journal.Journal, n int) {
	tb.Helper()
	for n > 0 {
		batch := make([]journal.Message, 0, min(n, 500))
		for range cap(batch) {
			e := events.New(ulid.Make(), time.Now(), ulid.Make().String(), events.SandboxCreatedEvent{Image: "bench", Driver: "process"})
			data, err := events.Encode(e)
			if err != nil {
				tb.Fatal(err)
			}
			subject, err := events.Subject(e.Type, e.Sandbox)
			if err != nil {
				tb.Fatal(err)
			}
			batch = append(batch, journal.Message{Subject: subject, ID: e.ID.String(), Data: data})
		}
		if _, err := j.AppendBatch(context.Background(), batch); err != nil {
			tb.Fatal(err)
		}
		n -= len(batch)
	}
}

// aggregateReader is the auditor's JetStream at node 0 for the
// aggregate, which is in the auditors' own account (no API prefix).
func aggregateReader(tb testing.TB, c *templateFleet) jetstream.JetStream {
	tb.Helper()
	nc, js := connectJS(tb, c.auditorURL(0))
	tb.Cleanup(nc.Close)
	return js
}

// aggregateHolds waits until the aggregate, read by the auditor, holds n
// records, and returns when it did.
func aggregateHolds(tb testing.TB, a jetstream.JetStream, n uint64) time.Time {
	tb.Helper()
	deadline := time.Now().Add(testutil.Scale(5 * time.Minute))
	var last jetstream.StreamState
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		s, err := a.Stream(ctx, AggregateStream)
		cancel()
		if err == nil {
			last = s.CachedInfo().State
			if last.Msgs == n {
				return time.Now()
			}
			if last.Msgs > n {
				tb.Fatalf("the aggregate holds %d records, want %d", last.Msgs, n)
			}
		}
		if time.Now().After(deadline) {
			tb.Fatalf("the aggregate holds %d of %d records (%v)", last.Msgs, n, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// mirrorsHold waits until every mirror in ms holds n records, and returns
// when the last did.
func mirrorsHold(tb testing.TB, a jetstream.JetStream, ms []*Mirror, n uint64) time.Time {
	tb.Helper()
	deadline := time.Now().Add(testutil.Scale(5 * time.Minute))
	for _, m := range ms {
		for {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			s, err := a.Stream(ctx, m.StreamName())
			cancel()
			if err == nil && s.CachedInfo().State.Msgs == n {
				break
			}
			if time.Now().After(deadline) {
				tb.Fatalf("%s never held %d records (%v)", m.StreamName(), n, err)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	return time.Now()
}

// BenchmarkFleetAggregateAfterOutage: 4 hosts on a 3-node cluster from
// the template, their mirrors and the aggregate current; every node is
// shut down, each host journals 1,000 events meanwhile, and the nodes
// start again. Reported: how long after the restart every mirror held
// its journal, how long the aggregate took to hold every host event,
// and their ratio, which is to stay within 2. "alone" leaves the
// aggregate's sources to the server's retries; "kept" has the
// aggregator keep the aggregate throughout (KeepAggregate, as `nexus
// fleet aggregate --keep` does), which steps its leader down when
// sources stall behind their mirrors.
func BenchmarkFleetAggregateAfterOutage(b *testing.B) {
	for _, keep := range []bool{false, true} {
		name := "alone"
		if keep {
			name = "kept"
		}
		b.Run(name, func(b *testing.B) {
			for range b.N {
				mirrors, aggregate := aggregateAfterOutage(b, keep)
				b.ReportMetric(mirrors.Seconds(), "s-mirrors")
				b.ReportMetric(aggregate.Seconds(), "s-aggregate")
				b.ReportMetric(aggregate.Seconds()/mirrors.Seconds(), "aggregate/mirrors")
			}
		})
	}
}

// aggregateAfterOutage runs one outage and returns how long after the
// nodes were back every mirror and the aggregate were current.
func aggregateAfterOutage(b *testing.B, keep bool) (mirrors, aggregate time.Duration) {
	const hosts, before, during = 4, 200, 1000
	names := make([]string, hosts)
	for i := range names {
		names[i] = fmt.Sprintf("host-%d", i)
	}
	c := startTemplateFleet(b, names, nil)
	js, ms := c.openHosts(b, 0)
	for _, j := range js {
		appendEvents(b, j, before)
	}
	ensure := func() {
		agg, err := Dial(c.userURL("aggregator", 0), "")
		if err != nil {
			b.Fatal(err)
		}
		defer agg.Close()
		ctx, cancel := context.WithTimeout(context.Background(), testutil.Scale(time.Minute))
		defer cancel()
		if _, err := agg.EnsureAggregate(ctx, names, 0); err != nil {
			b.Fatal(err)
		}
	}
	ensure()
	aggregateHolds(b, aggregateReader(b, c), hosts*before)
	if keep {
		agg, err := DialAggregator(c.userURL("aggregator", 0), "")
		if err != nil {
			b.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		kept := make(chan struct{})
		go func() {
			defer close(kept)
			agg.KeepAggregate(ctx, names, 0, KeepInterval, KeepResumeEvery, func(s string) { b.Logf("%s keep: %s", time.Now().Format("15:04:05.000"), s) })
		}()
		b.Cleanup(func() {
			cancel()
			<-kept
			agg.Close()
		})
	}

	for _, n := range c.nodes {
		n.Shutdown()
		n.WaitForShutdown()
	}
	for _, j := range js {
		appendEvents(b, j, during)
	}
	for i := range c.nodes {
		c.start(b, i)
	}
	back := time.Now()
	b.Logf("%s the nodes are back", back.Format("15:04:05.000"))
	for _, n := range c.nodes {
		if !n.ReadyForConnections(testutil.Scale(30 * time.Second)) {
			b.Fatal("a fleet node not ready after the outage")
		}
	}
	mirrors = mirrorsHold(b, c.auditor(b, 0), ms, before+during).Sub(back)
	aggregate = aggregateHolds(b, aggregateReader(b, c), hosts*(before+during)).Sub(back)
	return mirrors, aggregate
}

// BenchmarkFleetEventsVsOrderedConsumer: an aggregate of 50,000 events
// (2 hosts) on a 3-node cluster from the template, read whole by
// `nexus fleet events` (the binary, its output to a pipe that is
// drained) and, in the same op, by a raw ordered consumer of the
// aggregate with the auditor's identity, connected beforehand, pulling
// 1,024 at a time as the command's read does, each message's data only
// touched. The two run in turn, the first of them alternating op by op,
// so neither always meets the machine as the other left it. Each op logs
// both in events/s, their ratio and the load average; reported are the
// medians over the ops. The ratio is to stay at 0.5 or more.
// NEXUS_BENCH_OTHER_NEXUS names another nexus (an older build, its
// nexusd beside it) whose `fleet events` runs in the same ops. Each
// `fleet events` also reports the CPU time its processes used, which a
// loaded machine changes less than their wall time. The binaries are
// built as `make build` builds them (the CLI and nexus-fleet static, no
// test hooks): what a user runs.
func BenchmarkFleetEventsVsOrderedConsumer(b *testing.B) {
	const hosts, each = 2, 25_000
	dir := b.TempDir()
	if err := testutil.BuildReleaseIn(dir); err != nil {
		b.Fatal(err)
	}
	other := os.Getenv("NEXUS_BENCH_OTHER_NEXUS")
	names := []string{"host-a", "host-b"}
	c := startTemplateFleet(b, names, nil)
	js, _ := c.openHosts(b, 0)
	for _, j := range js {
		appendEvents(b, j, each)
	}
	agg, err := Dial(c.userURL("aggregator", 0), "")
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), testutil.Scale(time.Minute))
	defer cancel()
	if _, err := agg.EnsureAggregate(ctx, names, 0); err != nil {
		b.Fatal(err)
	}
	agg.Close()
	a := aggregateReader(b, c)
	aggregateHolds(b, a, hosts*each)

	// raw reads the whole aggregate through an ordered consumer.
	raw := func() time.Duration {
		ctx, cancel := context.WithTimeout(context.Background(), testutil.Scale(time.Minute))
		defer cancel()
		began := time.Now()
		s, err := a.Stream(ctx, AggregateStream)
		if err != nil {
			b.Fatal(err)
		}
		oc, err := s.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{})
		if err != nil {
			b.Fatal(err)
		}
		it, err := oc.Messages(jetstream.PullMaxMessages(1024))
		if err != nil {
			b.Fatal(err)
		}
		var size int
		for range hosts * each {
			m, err := it.Next()
			if err != nil {
				b.Fatal(err)
			}
			size += len(m.Data())
		}
		it.Stop()
		return time.Since(began)
	}
	// rawProcess is the same read by a program of its own (testdata/rawread),
	// which starts and connects as the command does: the gap between the
	// two baselines is what a reader's start and connection cost.
	rawread := filepath.Join(dir, "rawread")
	build := exec.Command("go", "build", "-o", rawread, "./testdata/rawread")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		b.Fatalf("build rawread: %v\n%s", err, out)
	}
	rawProcess := func() time.Duration {
		cmd := exec.Command(rawread, c.auditorURL(0), AggregateStream, strconv.Itoa(hosts*each))
		began := time.Now()
		if out, err := cmd.CombinedOutput(); err != nil {
			b.Fatalf("rawread: %v: %s", err, out)
		}
		return time.Since(began)
	}
	perSec := func(d time.Duration) float64 { return float64(hosts*each) / d.Seconds() }
	m := map[string][]float64{}
	b.ResetTimer()
	for op := range b.N {
		load, _ := os.ReadFile("/proc/loadavg")
		var rawTook, procTook time.Duration
		var run fleetEventsTimes
		// The three reads in a rotating order, so none always runs on
		// the caches (or the load) another left.
		reads := []func(){
			func() { rawTook = raw() },
			func() { run = fleetEventsRun(b, filepath.Join(dir, "nexus"), c.auditorURL(0), hosts*each) },
			func() { procTook = rawProcess() },
		}
		for i := range reads {
			reads[(op+i)%len(reads)]()
		}

		// The read `fleet events` makes, in this process, records
		// counted only: what the command spends beyond it is starting,
		// decoding and printing.
		ctx, cancel := context.WithTimeout(context.Background(), testutil.Scale(time.Minute))
		f, err := Dial(c.auditorURL(0), "")
		if err != nil {
			b.Fatal(err)
		}
		began := time.Now()
		scanned := 0
		if err := f.Scan(ctx, journal.Range{}, func(Record) error { scanned++; return nil }); err != nil || scanned != hosts*each {
			b.Fatalf("the auditor's scan read %d of %d records (%v)", scanned, hosts*each, err)
		}
		scan := time.Since(began)
		f.Close()
		cancel()

		ratio := rawTook.Seconds() / run.took.Seconds()
		procRatio := procTook.Seconds() / run.took.Seconds()
		b.Logf("op %d, load %s: raw %.0f/s; fleet events %.0f/s, %.2fx, first line after %v, CPU %v; raw in its own process %.0f/s, %.2fx; scan %.0f/s",
			op, strings.Join(strings.Fields(string(load))[:3], " "), perSec(rawTook), perSec(run.took), ratio, run.first.Round(time.Millisecond), run.cpu.Round(time.Millisecond), perSec(procTook), procRatio, perSec(scan))
		m["events/s-raw-process"] = append(m["events/s-raw-process"], perSec(procTook))
		m["fleet-events/raw-process"] = append(m["fleet-events/raw-process"], procRatio)
		m["events/s-raw"] = append(m["events/s-raw"], perSec(rawTook))
		m["events/s-fleet-events"] = append(m["events/s-fleet-events"], perSec(run.took))
		m["events/s-scan"] = append(m["events/s-scan"], perSec(scan))
		m["cpu-ms-fleet-events"] = append(m["cpu-ms-fleet-events"], run.cpu.Seconds()*1000)
		m["first-line-ms"] = append(m["first-line-ms"], run.first.Seconds()*1000)
		m["fleet-events/raw"] = append(m["fleet-events/raw"], ratio)
		if other != "" {
			o := fleetEventsRun(b, other, c.auditorURL(0), hosts*each)
			b.Logf("op %d: other fleet events %.0f/s, %.2fx, CPU %v", op, perSec(o.took), rawTook.Seconds()/o.took.Seconds(), o.cpu.Round(time.Millisecond))
			m["events/s-other"] = append(m["events/s-other"], perSec(o.took))
			m["other/raw"] = append(m["other/raw"], rawTook.Seconds()/o.took.Seconds())
			m["cpu-ms-other"] = append(m["cpu-ms-other"], o.cpu.Seconds()*1000)
		}
	}
	for unit, vs := range m {
		slices.Sort(vs)
		b.ReportMetric(vs[len(vs)/2], unit)
	}
}

// fleetEventsTimes are a `fleet events` run's wall time, the time to its
// first line, and the CPU time its processes used.
type fleetEventsTimes struct {
	took, first, cpu time.Duration
}

// fleetEventsRun runs `nexus fleet events` of the binary bin over the
// whole aggregate, its output drained; it fails unless every one of n
// events was printed.
func fleetEventsRun(b *testing.B, bin, url string, n int) fleetEventsTimes {
	b.Helper()
	cmd := exec.Command(bin, "fleet", "events")
	cmd.Env = append(os.Environ(), "NEXUS_FLEET_URL="+url, "NEXUS_STATE_DIR="+b.TempDir())
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		b.Fatal(err)
	}
	began := time.Now()
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	lines, first := countLines(b, out)
	if err := cmd.Wait(); err != nil {
		b.Fatalf("%s fleet events: %v: %s", bin, err, stderr.String())
	}
	took := time.Since(began)
	if lines < n {
		b.Fatalf("%s fleet events printed %d lines for %d events: %s", bin, lines, n, stderr.String())
	}
	return fleetEventsTimes{took: took, first: first.Sub(began), cpu: cmd.ProcessState.UserTime() + cmd.ProcessState.SystemTime()}
}

// countLines drains r and counts its lines, and says when the first
// bytes came.
func countLines(tb testing.TB, r io.Reader) (n int, first time.Time) {
	tb.Helper()
	buf := make([]byte, 1<<16)
	for {
		k, err := r.Read(buf)
		if k > 0 && first.IsZero() {
			first = time.Now()
		}
		n += bytes.Count(buf[:k], []byte("\n"))
		if err == io.EOF {
			return n, first
		}
		if err != nil {
			tb.Fatal(err)
		}
	}
}
