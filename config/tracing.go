package config

import "os"

// TracingRequested says whether the environment asks for the sagas' spans
// to be exported: the standard OTEL_EXPORTER_OTLP_ENDPOINT, or its
// traces-only variant, is set.
func TracingRequested() bool {
	return os.Getenv("OTEL_EXPORTER_OTLP_ENDPOINT") != "" || os.Getenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") != ""
}
