package main

import (
	"encoding/hex"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"

	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/protobuf/proto"
)

// otlpCollector stands in for an OpenTelemetry collector: it takes OTLP
// over HTTP (protobuf) and keeps every span it is sent.
type otlpCollector struct {
	mu    sync.Mutex
	spans []*tracepb.Span
	bad   []string // requests it could not read
}

func (c *otlpCollector) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(r.Body)
	var req coltracepb.ExportTraceServiceRequest
	if err == nil {
		err = proto.Unmarshal(body, &req)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if r.URL.Path != "/v1/traces" || err != nil {
		c.bad = append(c.bad, r.Method+" "+r.URL.Path+": "+r.Header.Get("Content-Type"))
		http.Error(w, "not OTLP traces", http.StatusBadRequest)
		return
	}
	for _, rs := range req.ResourceSpans {
		for _, ss := range rs.ScopeSpans {
			c.spans = append(c.spans, ss.Spans...)
		}
	}
	out, _ := proto.Marshal(&coltracepb.ExportTraceServiceResponse{})
	w.Header().Set("Content-Type", "application/x-protobuf")
	w.Write(out)
}

func spanAttr(s *tracepb.Span, key string) string {
	for _, kv := range s.Attributes {
		if kv.Key == key {
			return kv.Value.GetStringValue()
		}
	}
	return ""
}

// One create, run with OTEL_EXPORTER_OTLP_ENDPOINT set, sends one span for
// its saga and, under it, one span per step, named and ordered as the
// saga's saga.started event lists its steps.
func TestTracesOfOneCreate(t *testing.T) {
	t.Parallel()
	root := shortRoot(t)
	image := makeImage(t)
	col := &otlpCollector{}
	srv := httptest.NewServer(col)
	defer srv.Close()

	env := []string{"OTEL_EXPORTER_OTLP_ENDPOINT=" + srv.URL}
	mustOK(t, nexusEnv(t, root, env, "--driver", "process", "create", "--image", image, "-q"), "create")

	var started struct {
		Saga string `json:"saga"`
		Data struct {
			Kind  string   `json:"kind"`
			Steps []string `json:"steps"`
		} `json:"data"`
	}
	evs := mustOK(t, nexus(t, root, "events", "--type", "saga.started", "--json"), "events").stdout
	if lines := strings.Split(strings.TrimSpace(evs), "\n"); len(lines) != 1 || json.Unmarshal([]byte(lines[0]), &started) != nil {
		t.Fatalf("want one saga.started, got:\n%s", evs)
	}

	col.mu.Lock()
	defer col.mu.Unlock()
	if len(col.bad) > 0 {
		t.Fatalf("the collector could not read: %v", col.bad)
	}
	// The create's own process flushed its spans before it exited.
	var sagaSpan *tracepb.Span
	var steps []*tracepb.Span
	for _, s := range col.spans {
		if spanAttr(s, "nexus.saga.id") != started.Saga {
			continue
		}
		if spanAttr(s, "nexus.saga.step") == "" {
			if sagaSpan != nil {
				t.Fatalf("two spans for saga %s: %s and %s", started.Saga, sagaSpan.Name, s.Name)
			}
			sagaSpan = s
			continue
		}
		steps = append(steps, s)
	}
	if sagaSpan == nil || sagaSpan.Name != "saga.create" || len(sagaSpan.ParentSpanId) != 0 {
		t.Fatalf("saga span %v, want a root span saga.create (of %d spans)", sagaSpan, len(col.spans))
	}
	slices.SortFunc(steps, func(a, b *tracepb.Span) int {
		return int(int64(a.StartTimeUnixNano) - int64(b.StartTimeUnixNano))
	})
	var names []string
	for _, s := range steps {
		names = append(names, s.Name)
		if !slices.Equal(s.ParentSpanId, sagaSpan.SpanId) || !slices.Equal(s.TraceId, sagaSpan.TraceId) {
			t.Errorf("step span %s: parent %s in trace %s, want the saga's span %s in %s", s.Name,
				hex.EncodeToString(s.ParentSpanId), hex.EncodeToString(s.TraceId),
				hex.EncodeToString(sagaSpan.SpanId), hex.EncodeToString(sagaSpan.TraceId))
		}
	}
	if !slices.Equal(names, started.Data.Steps) {
		t.Fatalf("step spans %v, want the saga's steps %v", names, started.Data.Steps)
	}
}
