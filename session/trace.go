package session

import (
	"context"
	"fmt"
	"os"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"

	"github.com/nexus-sandbox/nexus/sagas"
)

// traceFlushTimeout bounds the export of a command's spans at its exit.
const traceFlushTimeout = 5 * time.Second

// StartTracing makes this process export a span per saga and per step
// over OTLP/HTTP when the standard OTEL_EXPORTER_OTLP_ENDPOINT (or its
// traces-only variant) is set; the exporter reads the other OTEL_*
// settings itself. It returns what sends the spans, at the process's
// exit. Without the variable nothing is set up.
func StartTracing(ctx context.Context) (flush func()) {
	if os.Getenv("OTEL_EXPORTER_OTLP_ENDPOINT") == "" && os.Getenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") == "" {
		return func() {}
	}
	exp, err := otlptracehttp.New(ctx)
	if err != nil {
		fmt.Fprintf(os.Stderr, "nexus: traces not exported: %v\n", err)
		return func() {}
	}
	res := resource.NewSchemaless(attribute.String("service.name", "nexus"))
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp), sdktrace.WithResource(res))
	sagas.SetTracer(sagaTracer{tp.Tracer("github.com/nexus-sandbox/nexus/sagas")})
	return func() {
		fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), traceFlushTimeout)
		defer cancel()
		if err := tp.Shutdown(fctx); err != nil {
			fmt.Fprintf(os.Stderr, "nexus: exporting traces: %v\n", err)
		}
	}
}

// sagaTracer makes a saga a span named saga.<kind> and each step a child
// span named for the step.
type sagaTracer struct{ t trace.Tracer }

func (st sagaTracer) Start(ctx context.Context, s sagas.Span) (context.Context, func(error)) {
	name := "saga." + string(s.Kind)
	attrs := []attribute.KeyValue{
		attribute.String("nexus.saga.kind", string(s.Kind)),
		attribute.String("nexus.saga.id", s.Saga),
	}
	if s.Step != "" {
		name = s.Step
		attrs = append(attrs, attribute.String("nexus.saga.step", s.Step))
	}
	if s.Sandbox != "" {
		attrs = append(attrs, attribute.String("nexus.sandbox", s.Sandbox))
	}
	ctx, span := st.t.Start(ctx, name, trace.WithAttributes(attrs...))
	return ctx, func(err error) {
		if err != nil {
			span.RecordError(err)
			span.SetStatus(codes.Error, err.Error())
		}
		span.End()
	}
}
