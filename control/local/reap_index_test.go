package local

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/oklog/ulid/v2"

	"github.com/nexus-sandbox/nexus/events"
	"github.com/nexus-sandbox/nexus/layout"
	"github.com/nexus-sandbox/nexus/lifecycle"
	"github.com/nexus-sandbox/nexus/store"
)

// A reap costs what it scans: on a root of 1,200 sandboxes whose disks are
// all on disk, a dry run judges every disk owned by point lookups in the
// store's ownership index and decodes no sandbox record (a reap that read
// the sandbox list would decode 1,200); the one orphan costs one lookup of
// its sandbox, which does not exist.
func TestReapDecodesNoSandboxList(t *testing.T) {
	ctx := context.Background()
	root := t.TempDir()
	st, err := store.Open(ctx, root, store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	r := layout.Root(root)
	if err := os.MkdirAll(r.Disks(), 0o700); err != nil {
		t.Fatal(err)
	}
	touch := func(p string) {
		if err := os.WriteFile(p, nil, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	const n = 1200
	var evs []events.Event
	for range n {
		id := ulid.Make().String()
		touch(r.RawDisk(id))
		evs = append(evs, events.New(ulid.Make(), time.Now(), id, events.SandboxCreatedEvent{Image: "i", Driver: "process",
			Resources: []events.Resource{{Kind: events.KindRawDisk, Path: r.Rel(r.RawDisk(id))}}}))
	}
	if _, err := st.Append(ctx, evs...); err != nil {
		t.Fatal(err)
	}
	// Through a fresh store, as a command opens it: its records at rest.
	if err := st.Close(); err != nil {
		t.Fatal(err)
	}
	if st, err = store.Open(ctx, root, store.Options{Lazy: true}); err != nil {
		t.Fatal(err)
	}
	orphan := ulid.Make().String()
	touch(r.RawDisk(orphan))
	m := &lifecycle.Manager{Root: r, B: Backend{st}}
	if err := st.Load(ctx); err != nil {
		t.Fatal(err)
	}
	if got := st.Decoded(); got >= n {
		t.Fatalf("opening decoded %d: the records are not at rest", got)
	}
	before := st.Decoded()
	rep, err := m.Reap(ctx, lifecycle.ReapOptions{SocketTimeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if got := st.Decoded() - before; got != 0 {
		t.Fatalf("a reap of %d sandboxes' disks decoded %d sandbox records, want none", n, got)
	}
	if rep.Scanned != n+1 || len(rep.Orphans) != 1 || filepath.Base(rep.Orphans[0].Path) != orphan+".raw" {
		t.Fatalf("reap scanned %d, orphans %+v; want %d scanned and %s alone", rep.Scanned, rep.Orphans, n+1, orphan)
	}
	for _, it := range rep.Kept {
		if !it.Owned() {
			t.Fatalf("kept %+v, want every sandbox's disk owned", it)
		}
	}
}
