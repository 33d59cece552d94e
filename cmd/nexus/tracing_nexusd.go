//go:build nexusd

package main

import (
	"context"
	"fmt"
	"os"

	"github.com/nexus-sandbox/nexus/config"
	"github.com/nexus-sandbox/nexus/session/tracing"
)

// startTracing exports the sagas' spans when the environment asks for it
// and returns what sends them at exit.
func startTracing(ctx context.Context) (flush func()) {
	if !config.TracingRequested() {
		return func() {}
	}
	flush, err := tracing.Start(ctx)
	if err != nil {
		fmt.Fprintf(os.Stderr, "nexus: traces not exported: %v\n", err)
		return func() {}
	}
	return flush
}
