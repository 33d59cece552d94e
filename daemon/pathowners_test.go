package daemon

import (
	"bytes"
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/oklog/ulid/v2"

	"github.com/nexus-sandbox/nexus/control/wire"
	"github.com/nexus-sandbox/nexus/events"
	"github.com/nexus-sandbox/nexus/store"
)

// A batch of path-owner lookups costs the daemon what a batch costs, not
// what each path does: the allocations of serving a full batch are those
// of serving one path, plus a few for the larger buffers, where copying
// each path and each owner out of the request and the store would make
// thousands. The answers are each path's owner, in order.
func TestPathOwnersAllocatePerBatch(t *testing.T) {
	ctx := context.Background()
	root := t.TempDir()
	n, err := store.Open(ctx, root, store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	var evs []events.Event
	var paths, want []string
	for range wire.PathOwnersBatch / 2 {
		id := ulid.Make().String()
		disk := "disks/" + id + ".raw"
		evs = append(evs, events.New(ulid.Make(), time.Now(), id, events.SandboxCreatedEvent{Image: "i", Driver: "process",
			Resources: []events.Resource{{Kind: events.KindRawDisk, Path: disk}}}))
		paths, want = append(paths, disk, "disks/"+id+"-gone.raw"), append(want, id, "")
	}
	if _, err := n.Append(ctx, evs...); err != nil {
		t.Fatal(err)
	}
	if err := n.Close(); err != nil { // the records at rest: the index answers
		t.Fatal(err)
	}
	if n, err = store.Open(ctx, root, store.Options{}); err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	serve := func(body []byte) string {
		rec := httptest.NewRecorder()
		rec.Body = bytes.NewBuffer(make([]byte, 0, 1<<20))
		servePathOwners(n, rec, httptest.NewRequest(http.MethodPost, wire.PathPathOwners, bytes.NewReader(body)))
		if rec.Code != http.StatusOK {
			t.Fatalf("%d: %s", rec.Code, rec.Body)
		}
		return rec.Body.String()
	}
	bodyOf := func(paths []string) []byte {
		body, err := wire.AppendPaths(nil, paths)
		if err != nil {
			t.Fatal(err)
		}
		return body
	}
	oneBody, batchBody := bodyOf(paths[:1]), bodyOf(paths)
	got, err := wire.SplitOwners(serve(batchBody), len(paths))
	if err != nil {
		t.Fatal(err)
	}
	if strings.Join(got, ",") != strings.Join(want, ",") {
		t.Fatalf("owners of %d paths: got %d answers, not the owners in order", len(paths), len(got))
	}
	one := testing.AllocsPerRun(3, func() { serve(oneBody) })
	batch := testing.AllocsPerRun(3, func() { serve(batchBody) })
	t.Logf("allocations: %v for one path, %v for %d", one, batch, len(paths))
	if batch-one > 4 {
		t.Fatalf("serving %d paths made %v allocations, one path %v: more than a batch's few", len(paths), batch, one)
	}
}
