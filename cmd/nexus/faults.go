package main

import (
	"context"
	"fmt"
	"os"

	"github.com/nexus-sandbox/nexus/control"
	"github.com/nexus-sandbox/nexus/events"
	"github.com/nexus-sandbox/nexus/guard"
)

// failAppends wraps b for the failure-injection tests: with
// NEXUS_FAIL_APPEND=<event type> set, every append carrying an event of that
// type fails before reaching the journal, as a journal write error would.
func failAppends(b control.Backend) control.Backend {
	t := os.Getenv("NEXUS_FAIL_APPEND")
	if t == "" {
		return b
	}
	return failingBackend{Backend: b, fail: events.Type(t)}
}

type failingBackend struct {
	control.Backend
	fail events.Type
}

func (f failingBackend) Append(ctx context.Context, evs ...events.Event) ([]uint64, error) {
	return f.AppendExpect(ctx, nil, evs...)
}

func (f failingBackend) AppendExpect(ctx context.Context, expect []guard.Expect, evs ...events.Event) ([]uint64, error) {
	for _, e := range evs {
		if e.Type == f.fail {
			return nil, fmt.Errorf("injected failure appending %s (NEXUS_FAIL_APPEND)", f.fail)
		}
	}
	return f.Backend.AppendExpect(ctx, expect, evs...)
}
