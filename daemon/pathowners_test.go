package daemon

import (
	"bytes"
	"context"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
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
// of serving one path, plus a few, where copying each path and each owner
// out of the request and the store makes tens of thousands. The answers are each path's owner, in order.
func TestPathOwnersAllocatePerBatch(t *testing.T) {
	ctx := context.Background()
	root := t.TempDir()
	n, err := store.Open(ctx, root, store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	var evs []events.Event
	var paths, want []string
	for i := range wire.PathOwnersBatch {
		id := ulid.Make().String()
		disk := "disks/" + id + ".raw"
		evs = append(evs, events.New(ulid.Make(), time.Now(), id, events.SandboxCreatedEvent{Image: "i", Driver: "process",
			Resources: []events.Resource{{Kind: events.KindRawDisk, Path: disk}}}))
		if i%4 == 3 {
			paths, want = append(paths, "disks/"+id+"-gone.raw"), append(want, "")
			continue
		}
		paths, want = append(paths, disk), append(want, id)
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
	// A few more for the larger buffers, and a few for -race, whose
	// sync.Pool drops what it holds at random.
	if batch-one > 32 {
		t.Fatalf("serving %d paths made %v allocations, one path %v: more than a batch's few", len(paths), batch, one)
	}
	// A batch answered leaves the index pages it read unmapped, so a
	// reap's lookups do not stay in the daemon's resident size: what stays
	// is a few pages (the kernel maps a page's neighbours with it), not
	// the index.
	db := filepath.Join(root, "projections", "sandboxes.db")
	serve(batchBody)
	st, err := os.Stat(db)
	if err != nil {
		t.Fatal(err)
	}
	if kb := mappedKB(t, db); kb > 128 {
		t.Fatalf("after a batch of lookups, %d kB of %s (%d kB) stay mapped, want at most 128", kb, db, st.Size()>>10)
	}
}

// mappedKB is the resident size of this process's mappings of file, from
// /proc/self/smaps; it fails the test if file is not mapped.
func mappedKB(t *testing.T, file string) int {
	t.Helper()
	data, err := os.ReadFile("/proc/self/smaps")
	if err != nil {
		t.Fatal(err)
	}
	kb, found, in := 0, false, false
	for _, line := range strings.Split(string(data), "\n") {
		f := strings.Fields(line)
		switch {
		case len(f) >= 5 && strings.Contains(f[0], "-") && !strings.HasSuffix(f[0], ":"):
			// A mapping's first line: range, perms, offset, dev, inode, path.
			in = len(f) == 6 && f[5] == file
			found = found || in
		case in && len(f) == 3 && f[0] == "Rss:":
			n, err := strconv.Atoi(f[1])
			if err != nil {
				t.Fatal(err)
			}
			kb += n
		}
	}
	if !found {
		t.Fatalf("%s is not mapped", file)
	}
	return kb
}
