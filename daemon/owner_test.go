package daemon_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/oklog/ulid/v2"

	"github.com/nexus-sandbox/nexus/control"
	"github.com/nexus-sandbox/nexus/control/local"
	"github.com/nexus-sandbox/nexus/control/wire"
	"github.com/nexus-sandbox/nexus/events"
	"github.com/nexus-sandbox/nexus/host/unixsock"
	"github.com/nexus-sandbox/nexus/projections"
	"github.com/nexus-sandbox/nexus/store"
)

// rawGet fetches path from the daemon's socket and returns the body bytes.
func rawGet(t *testing.T, root, path string) []byte {
	t.Helper()
	hc := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return unixsock.Dial(ctx, filepath.Join(root, wire.SocketName))
	}}}
	resp, err := hc.Get("http://nexus" + path)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %s, %v", path, resp.Status, err)
	}
	return body
}

// "Is this path taken?" is answered by the daemon with one answer: the
// reply's size does not grow with the number of sandboxes, as a fetched
// list would.
func TestOwnerOfAnswersWithoutTheList(t *testing.T) {
	d := startDaemon(t, "")
	b := connect(t, d.root)
	ctx := context.Background()
	const sandboxes = 300
	var evs []events.Event
	var ids []string
	for i := 0; i < sandboxes; i++ {
		id := ulid.Make().String()
		ids = append(ids, id)
		evs = append(evs, events.New(ulid.Make(), time.Now(), id, events.SandboxCreatedEvent{
			Image: "i", Driver: "process", Resources: []events.Resource{{Kind: events.KindRawDisk, Path: "disks/" + id + ".raw"}},
		}))
	}
	if _, err := b.Append(ctx, evs...); err != nil {
		t.Fatal(err)
	}
	target := ids[sandboxes/2]
	owner, path, found, err := b.OwnerOf(ctx, []string{"disks/none", "disks/" + target + ".raw"}, "")
	if err != nil || !found || owner != target || path != "disks/"+target+".raw" {
		t.Fatalf("OwnerOf = %q, %q, %v, %v; want %s", owner, path, found, err, target)
	}
	if owner, _, found, err := b.OwnerOf(ctx, []string{"disks/" + target + ".raw"}, target); err != nil || found {
		t.Fatalf("OwnerOf except its owner = %q, %v, %v; want none", owner, found, err)
	}
	one := rawGet(t, d.root, "/v1/owner?path=disks/"+target+".raw")
	list := rawGet(t, d.root, "/v1/sandboxes")
	if len(one) > 200 || len(list) < sandboxes*100 {
		t.Fatalf("owner reply %d bytes, list %d bytes; want the owner reply under 200 bytes whatever the count", len(one), len(list))
	}
}

// "Which sandbox holds this snapshot?" is one answer too, from the daemon
// and from a store this process owns alike, and so is "which snapshots
// could this prefix name?": restore and snapshot rm ask them instead of
// fetching every sandbox to search their snapshot lists.
func TestSnapshotOwnerAnswersWithoutTheList(t *testing.T) {
	ctx := context.Background()
	local := func(t *testing.T) control.Backend {
		n, err := store.Open(ctx, t.TempDir(), store.Options{Lazy: true})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { n.Close() })
		return local.Backend{Store: n}
	}
	viaDaemon := func(t *testing.T) control.Backend { return connect(t, startDaemon(t, "").root) }
	for name, open := range map[string]func(*testing.T) control.Backend{"daemon": viaDaemon, "local": local} {
		t.Run(name, func(t *testing.T) {
			b := open(t)
			var evs []events.Event
			var ids []string
			for range 50 {
				id := ulid.Make().String()
				ids = append(ids, id)
				evs = append(evs, events.New(ulid.Make(), time.Now(), id, events.SandboxCreatedEvent{Image: "i", Driver: "process"}))
			}
			holder, snap := ids[25], ulid.Make().String()
			evs = append(evs, events.New(ulid.Make(), time.Now(), holder, events.SnapshotTakenEvent{SnapshotID: snap,
				Dir: events.Resource{Kind: events.KindSnapshot, Path: "snapshots/" + holder + "/" + snap}}))
			if _, err := b.Append(ctx, evs...); err != nil {
				t.Fatal(err)
			}
			sb, found, err := b.SnapshotOwner(ctx, snap)
			if err != nil || !found || sb.ID != holder || len(sb.Snapshots) != 1 || sb.Snapshots[0] != snap {
				t.Fatalf("SnapshotOwner(%s) = %s %v %v %v; want %s", snap, sb.ID, sb.Snapshots, found, err, holder)
			}
			if sb, found, err := b.SnapshotOwner(ctx, ulid.Make().String()); err != nil || found {
				t.Fatalf("SnapshotOwner of no snapshot = %s %v %v", sb.ID, found, err)
			}
			// A prefix of its ID or of its short ID names it and its holder.
			for _, ref := range []string{strings.ToLower(snap[:len(snap)-3]), projections.ShortID(snap)[:8]} {
				refs, err := b.SnapshotsNamed(ctx, ref)
				if got, merr := projections.MatchSnapshot(refs, ref); err != nil || merr != nil || got != snap || refs[0].Sandbox != holder {
					t.Fatalf("SnapshotsNamed(%q) = %v, %v; MatchSnapshot %s, %v; want %s of %s", ref, refs, err, got, merr, snap, holder)
				}
			}
			if _, err := b.Append(ctx, events.New(ulid.Make(), time.Now(), holder, events.ResourceReclaimedEvent{
				Resource: events.Resource{Kind: events.KindSnapshot, Path: "snapshots/" + holder + "/" + snap}})); err != nil {
				t.Fatal(err)
			}
			if sb, found, err := b.SnapshotOwner(ctx, snap); err != nil || found {
				t.Fatalf("SnapshotOwner of a removed snapshot = %s %v %v", sb.ID, found, err)
			}
			if refs, err := b.SnapshotsNamed(ctx, projections.ShortID(snap)[:8]); err != nil || len(refs) != 0 {
				t.Fatalf("SnapshotsNamed of a removed snapshot = %v, %v", refs, err)
			}
		})
	}
}

// The reaper asks who owns each scanned path in a POST body, the paths as
// they are: names with a newline, a percent sign, a query's separators or
// bytes that are not UTF-8 reach the store unchanged, and the answers
// come back one per path, in order, a full batch and more. A client that
// still asks in the URL's query (an older nexus) is refused in the
// answer it decodes.
func TestPathOwnersTakesPathsAsTheyAre(t *testing.T) {
	d := startDaemon(t, "")
	b := connect(t, d.root)
	ctx := context.Background()
	odd := []string{"disks/a\nb.raw", "disks/50%.raw", "disks/x&path=y?z#w.raw", "disks/\xff\xfe.raw", "disks/ spaced .raw"}
	var evs []events.Event
	var paths, want []string
	for i := range wire.PathOwnersBatch + 10 {
		id := ulid.Make().String()
		p := "disks/" + id + ".raw"
		if i < len(odd) {
			p = odd[i]
		}
		evs = append(evs, events.New(ulid.Make(), time.Now(), id, events.SandboxCreatedEvent{Image: "i", Driver: "process",
			Resources: []events.Resource{{Kind: events.KindRawDisk, Path: p}}}))
		paths, want = append(paths, p, p+".none"), append(want, id, "")
	}
	if _, err := b.Append(ctx, evs...); err != nil {
		t.Fatal(err)
	}
	got, err := b.PathOwners(ctx, paths)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != len(want) {
		t.Fatalf("%d answers for %d paths", len(got), len(want))
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("owner of %q = %q, want %q", paths[i], got[i], want[i])
		}
	}
	if _, err := b.PathOwners(ctx, []string{"disks/a\x00b"}); !errors.Is(err, wire.ErrPathHasNUL) {
		t.Fatalf("a path with a NUL byte: %v, want ErrPathHasNUL", err)
	}
	hc := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return unixsock.Dial(ctx, filepath.Join(d.root, wire.SocketName))
	}}}
	resp, err := hc.Get("http://nexus" + wire.PathPathOwners + "?path=disks/x")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var refusal wire.ErrorAnswer
	if err := json.NewDecoder(resp.Body).Decode(&refusal); err != nil || resp.StatusCode != http.StatusUpgradeRequired || refusal.Error != wire.PathOwnersOverGETRefusal {
		t.Fatalf("GET %s: %s %+v %v; want 426 and the refusal", wire.PathPathOwners, resp.Status, refusal, err)
	}
}
