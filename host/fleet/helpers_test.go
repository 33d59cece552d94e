package fleet

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/nexus-sandbox/nexus/host/journal"
	"github.com/nexus-sandbox/nexus/internal/testutil"
)

// appendN appends n events, numbered from, to j: ids m-<i>, data "event <i>".
func appendN(t testing.TB, j *journal.Journal, from, n int) {
	t.Helper()
	// Bounded: an append that waited on something gone (the fleet, in an
	// outage) fails the test instead of hanging it.
	ctx, cancel := context.WithTimeout(context.Background(), testutil.Scale(time.Minute))
	defer cancel()
	for i := from; i < from+n; i++ {
		if _, err := j.Append(ctx, journal.Message{
			Subject: fmt.Sprintf("nexus.events.sandbox.created.s%d", i%3),
			ID:      fmt.Sprintf("m-%d", i),
			Data:    []byte(fmt.Sprintf("event %d", i)),
		}); err != nil {
			t.Fatal(err)
		}
	}
}

// readAll reads j's records from from on that match filter.
func readAll(t *testing.T, j *journal.Journal, from uint64, filter string) []journal.Record {
	t.Helper()
	var out []journal.Record
	if err := j.Read(context.Background(), from, filter, func(r journal.Record) error {
		out = append(out, r)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return out
}

// errStop ends a read early.
var errStop = errors.New("stop")
