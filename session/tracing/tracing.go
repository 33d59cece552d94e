// Package tracing exports a span per saga and per step over OTLP/HTTP,
// with the OpenTelemetry SDK. Only nexusd links it: the CLI runs a command
// that is to be traced in nexusd (config.TracingRequested).
package tracing

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

// flushTimeout bounds the export of a command's spans at its exit.
const flushTimeout = 5 * time.Second

// Start makes this process export a span per saga and per step over
// OTLP/HTTP; the exporter reads the standard OTEL_* settings itself. It
// returns what sends the spans, at the process's exit.
func Start(ctx context.Context) (flush func(), err error) {
	exp, err := otlptracehttp.New(ctx)
	if err != nil {
		return nil, err
	}
	res := resource.NewSchemaless(attribute.String("service.name", "nexus"))
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp), sdktrace.WithResource(res))
	sagas.SetTracer(sagaTracer{tp.Tracer("github.com/nexus-sandbox/nexus/sagas")})
	return func() {
		fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), flushTimeout)
		defer cancel()
		if err := tp.Shutdown(fctx); err != nil {
			fmt.Fprintf(os.Stderr, "nexus: exporting traces: %v\n", err)
		}
	}, nil
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
