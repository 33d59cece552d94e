package daemon

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/nexus-sandbox/nexus/control/wire"
	"github.com/nexus-sandbox/nexus/events"
	"github.com/nexus-sandbox/nexus/host/fleet"
	"github.com/nexus-sandbox/nexus/store"
)

// metrics are the daemon's Prometheus metrics (docs/metrics.md). The
// counters come from the events the store admits (the sagas run in the
// commands' processes, and their events are what reaches the daemon); the
// gauges are read from the store at each scrape.
type metrics struct {
	reg *prometheus.Registry

	sagas      *prometheus.CounterVec   // kind, outcome
	sagaTime   *prometheus.HistogramVec // kind, outcome
	steps      *prometheus.CounterVec   // kind, step
	stepTime   *prometheus.HistogramVec // kind, step
	appendTime *prometheus.HistogramVec // result
	groupReqs  prometheus.Histogram
	groupEvs   prometheus.Histogram
	reap       *prometheus.CounterVec // verdict
	reapDone   *prometheus.CounterVec // result
	ledger     *prometheus.CounterVec // verdict

	// open is each saga started since the daemon started, by ID: when it
	// started and when it last recorded a step, both as its events say.
	mu   sync.Mutex
	open map[string]*sagaClock
}

type sagaClock struct{ started, last time.Time }

// sagaOutcomes are the values of the outcome label: finished, or
// compensated (undone after a failure).
const (
	outcomeFinished    = "finished"
	outcomeCompensated = "compensated"
)

func newMetrics() *metrics {
	durations := prometheus.ExponentialBuckets(0.005, 2, 16) // 5ms .. ~164s
	m := &metrics{
		reg: prometheus.NewRegistry(),
		sagas: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "nexus_sagas_total", Help: "Sagas that ended, by kind and outcome (finished or compensated).",
		}, []string{"kind", "outcome"}),
		sagaTime: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "nexus_saga_duration_seconds", Help: "Time from a saga's saga.started to its end, by kind and outcome.", Buckets: durations,
		}, []string{"kind", "outcome"}),
		steps: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "nexus_saga_steps_total", Help: "Saga steps journaled, by saga kind and step (undo.<step> for a compensation).",
		}, []string{"kind", "step"}),
		stepTime: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "nexus_saga_step_duration_seconds", Help: "Time from a saga's previous record to a step's record, by saga kind and step.", Buckets: durations,
		}, []string{"kind", "step"}),
		appendTime: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "nexus_append_duration_seconds", Help: "Time an append waited for its answer (admitted, synced), by result (ok or refused).",
			Buckets: prometheus.ExponentialBuckets(0.0001, 2, 18), // 0.1ms .. ~13s
		}, []string{"result"}),
		groupReqs: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "nexus_append_group_requests", Help: "Append requests committed together in one group commit.", Buckets: prometheus.ExponentialBuckets(1, 2, 10),
		}),
		groupEvs: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "nexus_append_group_events", Help: "Events committed together in one group commit.", Buckets: prometheus.ExponentialBuckets(1, 2, 10),
		}),
		reap: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "nexus_reap_verdicts_total", Help: "Reap verdicts journaled (reap.decided), by verdict.",
		}, []string{"verdict"}),
		reapDone: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "nexus_reap_applied_total", Help: "Orphans a reap --apply deleted or failed to delete (reap.applied), by result.",
		}, []string{"result"}),
		ledger: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "nexus_ledger_runs_total", Help: "Client runs judged by a ledger sweep (run.swept, run.kept), by verdict.",
		}, []string{"verdict"}),
		open: map[string]*sagaClock{},
	}
	m.reg.MustRegister(m.sagas, m.sagaTime, m.steps, m.stepTime, m.appendTime, m.groupReqs, m.groupEvs, m.reap, m.reapDone, m.ledger)
	return m
}

// Stored counts what an event the store admitted says: a saga's start,
// steps and end, a reap's verdicts, a ledger sweep's.
func (m *metrics) Stored(e events.Event, kind events.SagaKind) {
	switch p := e.Payload.(type) {
	case events.ReapDecidedEvent:
		for _, x := range p.Entries {
			m.reap.WithLabelValues(x.Verdict).Inc()
		}
		if p.Owned > 0 {
			m.reap.WithLabelValues("owned").Add(float64(p.Owned))
		}
	case events.ReapAppliedEvent:
		m.reapDone.WithLabelValues("deleted").Add(float64(len(p.Deleted)))
		m.reapDone.WithLabelValues("failed").Add(float64(len(p.Failed)))
	case events.RunSweptEvent:
		m.ledger.WithLabelValues("swept").Inc()
	case events.RunKeptEvent:
		for _, k := range p.Kept {
			m.ledger.WithLabelValues("kept").Add(float64(len(k.Runs)))
		}
	}
	if e.Saga == "" {
		return
	}
	k := string(kind)
	if k == "" {
		k = "unknown"
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	switch e.Payload.(type) {
	case events.SagaStartedEvent:
		m.open[e.Saga] = &sagaClock{started: e.Time, last: e.Time}
	case events.SagaFinishedEvent:
		m.ended(e, k, outcomeFinished)
	case events.SagaCompensatedEvent:
		m.ended(e, k, outcomeCompensated)
	default:
		// A step's second and later events (step#2, ...) are the same step.
		if e.Step == "" || strings.Contains(e.Step, "#") {
			return
		}
		m.steps.WithLabelValues(k, e.Step).Inc()
		if c := m.open[e.Saga]; c != nil {
			m.stepTime.WithLabelValues(k, e.Step).Observe(seconds(e.Time.Sub(c.last)))
			c.last = e.Time
		}
	}
}

// ended counts a saga's end; its duration is known for a saga whose start
// this daemon saw.
func (m *metrics) ended(e events.Event, kind, outcome string) {
	m.sagas.WithLabelValues(kind, outcome).Inc()
	if c := m.open[e.Saga]; c != nil {
		m.sagaTime.WithLabelValues(kind, outcome).Observe(seconds(e.Time.Sub(c.started)))
		delete(m.open, e.Saga)
	}
}

func seconds(d time.Duration) float64 { return max(d, 0).Seconds() }

func (m *metrics) Appended(took time.Duration, err error) {
	result := "ok"
	if err != nil {
		result = "refused"
	}
	m.appendTime.WithLabelValues(result).Observe(took.Seconds())
}

func (m *metrics) Grouped(requests, evs int) {
	m.groupReqs.Observe(float64(requests))
	m.groupEvs.Observe(float64(evs))
}

// mirrorTimeout bounds a scrape's question to the fleet about the mirror.
const mirrorTimeout = 2 * time.Second

// storeCollector reads the store's gauges at each scrape: the sandboxes
// by state (the store's counts, not its records), the journal's and the
// sandbox store's size, free space against the reserve, and the mirror's
// lag.
type storeCollector struct {
	n      *store.Store
	mirror *fleet.Mirror

	sandboxes, journalBytes, journalRecords, storeBytes *prometheus.Desc
	free, reserve, floor, mirrorLag, mirrorUp           *prometheus.Desc
	scrapeErr                                           *prometheus.Desc
}

func newStoreCollector(n *store.Store, mirror *fleet.Mirror) *storeCollector {
	d := func(name, help string, labels ...string) *prometheus.Desc {
		return prometheus.NewDesc(name, help, labels, nil)
	}
	return &storeCollector{n: n, mirror: mirror,
		sandboxes:      d("nexus_sandboxes", "Sandboxes by state and Ready.", "state", "ready"),
		journalBytes:   d("nexus_journal_bytes", "Bytes the journal's stream holds."),
		journalRecords: d("nexus_journal_records", "Records the journal's stream holds."),
		storeBytes:     d("nexus_store_bytes", "Size of the sandbox store (projections/sandboxes.db)."),
		free:           d("nexus_journal_free_bytes", "Bytes free on the filesystem holding the journal."),
		reserve:        d("nexus_journal_reserve_bytes", "Free bytes below which only appends that free space are admitted."),
		floor:          d("nexus_journal_floor_bytes", "Free bytes below which every append is refused."),
		mirrorLag:      d("nexus_mirror_lag_events", "Journal events the fleet mirror lacks (only with a mirror configured)."),
		mirrorUp:       d("nexus_mirror_connected", "1 if the fleet mirror's link is up (only with a mirror configured)."),
		scrapeErr:      d("nexus_scrape_errors", "Store readings this scrape could not take, by what.", "what"),
	}
}

// Describe sends the descriptions without collecting: registering the
// collector must not wait for a journal still opening (store.Options.Early).
func (c *storeCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.sandboxes, c.journalBytes, c.journalRecords, c.storeBytes,
		c.free, c.reserve, c.floor, c.mirrorLag, c.mirrorUp, c.scrapeErr} {
		ch <- d
	}
}

func (c *storeCollector) Collect(ch chan<- prometheus.Metric) {
	ctx := context.Background()
	gauge := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
	}
	failed := func(what string) { gauge(c.scrapeErr, 1, what) }
	if states, err := c.n.SandboxStates(ctx); err == nil {
		for k, count := range states {
			gauge(c.sandboxes, float64(count), string(k.State), strconv.FormatBool(k.Ready))
		}
	} else {
		failed("sandboxes")
	}
	if u, err := c.n.Usage(ctx); err == nil {
		gauge(c.journalBytes, float64(u.Bytes))
		gauge(c.journalRecords, float64(u.Records))
		gauge(c.storeBytes, float64(u.StoreBytes))
		gauge(c.free, float64(u.Free))
		gauge(c.reserve, float64(u.Space.Reserve))
		gauge(c.floor, float64(u.Space.Floor))
	} else {
		failed("usage")
	}
	if c.mirror != nil {
		mctx, cancel := context.WithTimeout(ctx, mirrorTimeout)
		defer cancel()
		st := c.mirror.State(mctx)
		if st == nil {
			return
		}
		up := 0.0
		if st.Connected {
			up = 1
		}
		gauge(c.mirrorUp, up)
		if st.Exists {
			gauge(c.mirrorLag, float64(st.LagEvents))
		}
	}
}

// handler serves the registry in Prometheus's text format.
func (m *metrics) handler() http.Handler {
	return promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{})
}

// serveMetrics serves the metrics alone on a TCP address (port 0 picks
// one; bound is the address taken) until ctx is done or stop is called.
func serveMetrics(ctx context.Context, addr string, m *metrics) (bound string, stop func(), err error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return "", nil, fmt.Errorf("--metrics-listen %q: %w", addr, err)
	}
	mux := http.NewServeMux()
	mux.Handle("GET "+wire.PathMetrics, m.handler())
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go srv.Serve(ln)
	after := context.AfterFunc(ctx, func() { srv.Close() })
	return ln.Addr().String(), func() { after(); srv.Close() }, nil
}
