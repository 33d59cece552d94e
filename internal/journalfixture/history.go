// Package journalfixture builds journals for benchmarks: roots whose
// history is long while the sandboxes are few, written through node.Append
// like a command's records. Tests and benchmarks only.
package journalfixture

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/oklog/ulid/v2"

	"github.com/nexus-sandbox/nexus/events"
	"github.com/nexus-sandbox/nexus/store"
)

// History journals into root 10 live sandboxes and n events in all: nine
// started and stopped over and over (the long history), then a tenth
// created last, whose own history is one event. Appends go 1,000 at a time,
// one group commit per batch. It returns the IDs, the tenth last.
func History(tb testing.TB, root string, n int) []string {
	tb.Helper()
	ctx := context.Background()
	nd, err := store.Open(ctx, root, store.Options{})
	if err != nil {
		tb.Fatal(err)
	}
	created := func(i int) (string, events.Event) {
		id := ulid.Make().String()
		return id, events.New(ulid.Make(), time.Now(), id, events.SandboxCreatedEvent{
			Handle: fmt.Sprintf("sb-%d", i), Image: "ghcr.io/nexus/base:24.04", Driver: "process",
			Resources: []events.Resource{{Kind: events.KindRawDisk, Path: "disks/" + id + ".raw"}},
		})
	}
	var ids []string
	var first []events.Event
	for i := range 9 {
		id, e := created(i)
		ids, first = append(ids, id), append(first, e)
	}
	if _, err := nd.Append(ctx, first...); err != nil {
		tb.Fatal(err)
	}
	for done := len(first); done < n-1; {
		evs := make([]events.Event, min(1000, n-1-done))
		for i := range evs {
			k := done + i
			var p events.Payload = events.SandboxStartedEvent{Driver: "process", VMMPid: 100 + k%9}
			if (k/9)%2 == 1 {
				p = events.SandboxStoppedEvent{Reason: "bench"}
			}
			evs[i] = events.New(ulid.Make(), time.Now(), ids[k%9], p)
		}
		if _, err := nd.Append(ctx, evs...); err != nil {
			tb.Fatal(err)
		}
		done += len(evs)
	}
	id, e := created(9)
	if _, err := nd.Append(ctx, e); err != nil {
		tb.Fatal(err)
	}
	if err := nd.Close(); err != nil {
		tb.Fatal(err)
	}
	return append(ids, id)
}
