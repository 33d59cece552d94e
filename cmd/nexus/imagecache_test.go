package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/oklog/ulid/v2"

	"github.com/nexus-sandbox/nexus/events"
	"github.com/nexus-sandbox/nexus/host/imagecache"
	"github.com/nexus-sandbox/nexus/internal/testutil"
	"github.com/nexus-sandbox/nexus/layout"
	"github.com/nexus-sandbox/nexus/lifecycle"
	"github.com/nexus-sandbox/nexus/store"
)

// cacheRowFormat prints a list row as tab-separated fields, "-" for an
// unknown or empty one: --format over the Go fields, pointers included.
const cacheRowFormat = `{{.CacheID}}	{{with .Ref}}{{.}}{{else}}-{{end}}	{{.Allocated}}	{{.Apparent}}	` +
	`{{with .LastUsedAt}}{{.}}{{else}}-{{end}}	{{with .Layout}}{{.}}{{else}}-{{end}}	{{with .Sandboxes}}{{join . ","}}{{else}}-{{end}}`

func cacheList(t *testing.T, root string) []lifecycle.CacheListing {
	t.Helper()
	r := mustOK(t, nexus(t, root, "image-cache", "list", "--json"), "image-cache list")
	var rows []lifecycle.CacheListing
	if err := json.Unmarshal([]byte(r.stdout), &rows); err != nil {
		t.Fatalf("list --json: %v\n%s", err, r.stdout)
	}
	return rows
}

func pruneJSON(t *testing.T, root string, args ...string) lifecycle.CachePruneReport {
	t.Helper()
	r := mustOK(t, nexus(t, root, append([]string{"image-cache", "prune", "--unused", "--json"}, args...)...), "prune")
	var rep lifecycle.CachePruneReport
	if err := json.Unmarshal([]byte(r.stdout), &rep); err != nil {
		t.Fatalf("prune --json: %v\n%s", err, r.stdout)
	}
	return rep
}

// appendEvents journals events straight into root (no daemon may run),
// as an older nexus or a hand-written fixture would have left them.
func appendEvents(t *testing.T, root string, evs ...events.Event) {
	t.Helper()
	stopDaemons(root) // one started on demand by an earlier command
	n, err := store.Open(context.Background(), root, store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	if _, err := n.Append(context.Background(), evs...); err != nil {
		t.Fatal(err)
	}
}

func sameBytes(t *testing.T, a, b string) bool {
	t.Helper()
	x, err := os.ReadFile(a)
	if err != nil {
		t.Fatal(err)
	}
	y, err := os.ReadFile(b)
	if err != nil {
		t.Fatal(err)
	}
	return bytes.Equal(x, y)
}

// TestImageCacheReferencesProtectStoppedSandboxes: create prepares the
// image into the cache and records the entry; a stopped sandbox still
// protects it; once the sandbox is removed a dry run reports it, a real
// prune removes it, reports its allocated bytes and journals the removal.
func TestImageCacheReferencesProtectStoppedSandboxes(t *testing.T) {
	testutil.StartsSandboxes(t)
	t.Parallel()
	root := shortRoot(t)
	image := makeImage(t)
	sb := createJSON(t, root, "--image", image)
	rows := cacheList(t, root)
	if len(rows) != 1 {
		t.Fatalf("want one cache entry after create, got %+v", rows)
	}
	e := rows[0]
	if e.Ref == nil || *e.Ref != image || e.LastUsedAt == nil || e.Layout == nil || *e.Layout != 1 ||
		len(e.Sandboxes) != 1 || e.Sandboxes[0] != sb.ID || e.Allocated <= 0 || e.Apparent != 64<<20 {
		t.Fatalf("entry = %+v", e)
	}
	disk := filepath.Join(root, "images", e.CacheID, "disk.raw")
	if !sameBytes(t, disk, image) {
		t.Fatal("cache entry differs from the image")
	}
	var ident map[string]any
	data, _ := os.ReadFile(filepath.Join(root, "images", e.CacheID, "identity.json"))
	if err := json.Unmarshal(data, &ident); err != nil || ident["cache_id"] != e.CacheID || ident["image_ref"] != image {
		t.Fatalf("identity.json = %s (%v)", data, err)
	}
	line := mustOK(t, nexus(t, root, "image-cache", "list", "--format", cacheRowFormat), "list").stdout
	if cols := strings.Split(strings.TrimSpace(line), "\t"); len(cols) != 7 || cols[0] != e.CacheID || cols[1] != image || cols[6] != sb.ID {
		t.Fatalf("list line %q", line)
	}

	// A second create of the same image reuses the entry.
	sb2 := createJSON(t, root, "--image", image)
	if rows := cacheList(t, root); len(rows) != 1 || len(rows[0].Sandboxes) != 2 || rows[0].LastUsedAt.Before(*e.LastUsedAt) {
		t.Fatalf("second create: %+v", rows)
	}
	mustOK(t, proc(t, root, "rm", "-f", "--with-snapshots", sb2.ID), "rm")

	mustOK(t, proc(t, root, "stop", sb.ID), "stop")
	for _, dry := range []bool{true, false} {
		args := []string{}
		if dry {
			args = append(args, "--dry-run")
		}
		if rep := pruneJSON(t, root, args...); len(rep.Removed) != 0 || len(rep.Kept) != 1 || !strings.Contains(rep.Kept[0].Reason, sb.ID) {
			t.Fatalf("prune (dry=%v) with a stopped sandbox: %+v", dry, rep)
		}
	}
	if _, err := os.Stat(disk); err != nil {
		t.Fatal("prune removed the disk of a stopped sandbox:", err)
	}

	mustOK(t, proc(t, root, "rm", "-f", "--with-snapshots", sb.ID), "rm")
	r := mustOK(t, nexus(t, root, "image-cache", "prune", "--unused", "--dry-run"), "dry run")
	if want := "would remove 1 entry, " + formatSize(e.Allocated) + " allocated"; !strings.Contains(r.stdout, want) {
		t.Fatalf("dry run said %q, want %q", r.stdout, want)
	}
	if _, err := os.Stat(disk); err != nil {
		t.Fatal("dry run deleted:", err)
	}
	r = mustOK(t, nexus(t, root, "image-cache", "prune", "--unused"), "prune")
	if want := "removed 1 entry, " + formatSize(e.Allocated) + " allocated"; !strings.Contains(r.stdout, want) {
		t.Fatalf("prune said %q, want %q", r.stdout, want)
	}
	if _, err := os.Lstat(filepath.Join(root, "images", e.CacheID)); !os.IsNotExist(err) {
		t.Fatal("pruned entry still on disk:", err)
	}
	if rows := cacheList(t, root); len(rows) != 0 {
		t.Fatalf("list after prune: %+v", rows)
	}
	ev := mustOK(t, nexus(t, root, "events", "--type", "imagecache.pruned"), "events").stdout
	if !strings.Contains(ev, "imagecache.pruned") {
		t.Fatalf("no imagecache.pruned event: %q", ev)
	}
	// The next create prepares the entry again.
	sb3 := createJSON(t, root, "--image", image)
	if rows := cacheList(t, root); len(rows) != 1 || rows[0].Sandboxes[0] != sb3.ID {
		t.Fatalf("create after prune: %+v", rows)
	}
}

// writeLegacyEntry makes images/<name>/disk.raw with no identity and no
// journal record, as a cache filled before the metadata existed.
func writeLegacyEntry(t *testing.T, root, name string, data []byte) string {
	t.Helper()
	dir := filepath.Join(root, "images", name)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(dir, "disk.raw")
	if err := os.WriteFile(p, data, 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestImageCacheLegacyEntriesAndSandboxes: an entry without metadata is
// listed with "-" and is prunable; a sandbox without bootstrap identity
// (journaled before the cache existed) protects every entry until it is
// removed.
func TestImageCacheLegacyEntriesAndSandboxes(t *testing.T) {
	t.Parallel()
	root := shortRoot(t)
	os.MkdirAll(filepath.Join(root, "images"), 0o700)
	disk := writeLegacyEntry(t, root, "legacy-entry", bytes.Repeat([]byte{1}, 8192))
	line := strings.TrimSpace(mustOK(t, nexus(t, root, "image-cache", "list", "--format", cacheRowFormat), "list").stdout)
	if line != "legacy-entry\t-\t8192\t8192\t-\t-\t-" {
		t.Fatalf("legacy list line %q", line)
	}
	old := ulid.Make().String()
	appendEvents(t, root, events.New(ulid.Make(), time.Now(), old, events.SandboxCreatedEvent{Image: "/old/base.raw", Driver: "process"}))
	rep := pruneJSON(t, root)
	if len(rep.Removed) != 0 || len(rep.Kept) != 1 || !strings.Contains(rep.Kept[0].Reason, "no bootstrap identity") {
		t.Fatalf("prune with a pre-cache sandbox: %+v", rep)
	}
	if rows := cacheList(t, root); len(rows) != 1 || len(rows[0].Sandboxes) != 1 || rows[0].Sandboxes[0] != old {
		t.Fatalf("a pre-cache sandbox is not listed as a possible user: %+v", rows)
	}
	if _, err := os.Stat(disk); err != nil {
		t.Fatal(err)
	}
	appendEvents(t, root, events.New(ulid.Make(), time.Now(), old, events.SandboxRemovedEvent{}))
	rep = pruneJSON(t, root)
	if len(rep.Removed) != 1 || rep.Removed[0].CacheID != "legacy-entry" || rep.AllocatedBytes != 8192 {
		t.Fatalf("prune of a legacy entry: %+v", rep)
	}
	if _, err := os.Stat(disk); !os.IsNotExist(err) {
		t.Fatal("legacy entry not removed:", err)
	}
}

// TestImageCacheIncompleteCreateBlocksPrune: a create killed mid-saga
// leaves an open saga; prune refuses until recover closes it. The entry
// that create prepared but never journaled is adopted from its identity.
func TestImageCacheIncompleteCreateBlocksPrune(t *testing.T) {
	testutil.StartsSandboxes(t)
	t.Parallel()
	root := shortRoot(t)
	image := makeImage(t)
	crashAt(t, root, "create.image-cache:before", "create", "--image", image)
	for _, args := range [][]string{{"--dry-run"}, {}} {
		r := nexus(t, root, append([]string{"image-cache", "prune", "--unused"}, args...)...)
		wantFailure(t, r, 1, "incomplete sandbox state")
	}
	rows := cacheList(t, root)
	if len(rows) != 1 || rows[0].Ref == nil || *rows[0].Ref != image || rows[0].LastUsedAt != nil {
		t.Fatalf("entry prepared before the crash, from its identity file: %+v", rows)
	}
	mustOK(t, proc(t, root, "recover"), "recover")
	if rep := pruneJSON(t, root); len(rep.Removed) != 1 {
		t.Fatalf("prune after recover: %+v", rep)
	}
	entries, _ := os.ReadDir(filepath.Join(root, "images"))
	for _, e := range entries {
		if e.Name() != ".lease" {
			t.Fatalf("images/ still holds %s", e.Name())
		}
	}
}

// TestImageCacheSymlinksAndScope: an entry that is a symlink, an entry
// whose disk is a symlink, a journal entry whose id climbs out of images/,
// overlay templates and preparation dirs are never followed or deleted.
func TestImageCacheSymlinksAndScope(t *testing.T) {
	t.Parallel()
	root := shortRoot(t)
	images := filepath.Join(root, "images")
	os.MkdirAll(images, 0o700)
	outside := t.TempDir()
	victimDir := filepath.Join(outside, "victim")
	os.MkdirAll(victimDir, 0o700)
	victim := filepath.Join(victimDir, "disk.raw")
	os.WriteFile(victim, []byte("precious"), 0o600)
	if err := os.Symlink(victimDir, filepath.Join(images, "linked-entry")); err != nil {
		t.Fatal(err)
	}
	os.MkdirAll(filepath.Join(images, "linked-disk"), 0o700)
	os.Symlink(victim, filepath.Join(images, "linked-disk", "disk.raw"))
	writeLegacyEntry(t, root, "base.template", []byte("tmpl"))
	prep := filepath.Join(images, ".prepare-img-x-01")
	os.MkdirAll(prep, 0o700)
	os.WriteFile(filepath.Join(prep, "disk.raw"), []byte("half"), 0o600)
	os.MkdirAll(filepath.Join(root, "disks"), 0o700)
	sibling := filepath.Join(root, "disks", "keep.raw")
	os.WriteFile(sibling, []byte("keep"), 0o600)
	appendEvents(t, root, events.New(ulid.Make(), time.Now(), "", events.ImageCachePreparedEvent{
		CacheID: "../disks", Ref: "evil", Identity: "x", Layout: 1, Path: "../disks"}))

	if rows := cacheList(t, root); len(rows) != 0 {
		t.Fatalf("list shows non-entries: %+v", rows)
	}
	rep := pruneJSON(t, root)
	if len(rep.Removed) != 0 || len(rep.Skipped) != 2 {
		t.Fatalf("prune: %+v", rep)
	}
	for _, s := range rep.Skipped {
		if !strings.Contains(s.Reason, "symbolic link") && !strings.Contains(s.Reason, "not a regular file") {
			t.Fatalf("skip reason %+v", s)
		}
	}
	for _, p := range []string{victim, filepath.Join(images, "linked-entry"), filepath.Join(images, "linked-disk", "disk.raw"),
		filepath.Join(images, "base.template", "disk.raw"), filepath.Join(prep, "disk.raw"), sibling} {
		if _, err := os.Lstat(p); err != nil {
			t.Fatalf("%s was touched: %v", p, err)
		}
	}
	if data, _ := os.ReadFile(victim); string(data) != "precious" {
		t.Fatal("symlink target changed")
	}
}

// holdShared makes a real process outside nexus hold the cache lease
// shared (as a create does) and returns its pid once it holds it.
func holdShared(t *testing.T, root string) int {
	t.Helper()
	flock, err := exec.LookPath("flock")
	if err != nil {
		t.Fatal("flock(1) is needed (util-linux):", err)
	}
	cmd := exec.Command(flock, "--shared", "--no-fork", filepath.Join(root, "images", ".lease"), "sh", "-c", "echo ready; exec sleep 600")
	out, _ := cmd.StdoutPipe()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	if line, err := bufio.NewReader(out).ReadString('\n'); err != nil || line != "ready\n" {
		t.Fatalf("lease holder: %q %v", line, err)
	}
	return cmd.Process.Pid
}

// TestImageCacheLeaseRefusal: while another process holds the cache lease
// a real prune refuses, naming it, and deletes nothing; list and dry run
// still work; when the holder dies the prune goes through.
func TestImageCacheLeaseRefusal(t *testing.T) {
	t.Parallel()
	root := shortRoot(t)
	os.MkdirAll(filepath.Join(root, "images"), 0o700)
	disk := writeLegacyEntry(t, root, "unused", []byte("x"))
	pid := holdShared(t, root)
	wantFailure(t, nexus(t, root, "image-cache", "prune", "--unused"), 1, "pid "+strconv.Itoa(pid))
	if _, err := os.Stat(disk); err != nil {
		t.Fatal("refused prune deleted:", err)
	}
	if rows := cacheList(t, root); len(rows) != 1 {
		t.Fatalf("list under the lease: %+v", rows)
	}
	if rep := pruneJSON(t, root, "--dry-run"); len(rep.Removed) != 1 {
		t.Fatalf("dry run under the lease: %+v", rep)
	}
	syscall.Kill(pid, syscall.SIGKILL)
	deadline := time.Now().Add(testutil.Scale(10 * time.Second))
	for {
		r := nexus(t, root, "image-cache", "prune", "--unused")
		if r.code == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("prune after the holder died: %+v", r)
		}
	}
	if _, err := os.Stat(disk); !os.IsNotExist(err) {
		t.Fatal("entry survived the prune:", err)
	}
}

// A cache lease that cannot be opened (an I/O error, or here a directory
// planted at its name) is no prune: the create says what failed, naming
// the path, instead of "being pruned", and leaves nothing behind.
func TestImageCacheLeaseFailureIsNotAPrune(t *testing.T) {
	t.Parallel()
	root := shortRoot(t)
	lease := filepath.Join(root, "images", ".lease")
	if err := os.MkdirAll(lease, 0o700); err != nil {
		t.Fatal(err)
	}
	r := proc(t, root, "create", "--image", makeImage(t))
	wantFailure(t, r, 1, lease)
	if strings.Contains(r.stderr, "pruned") {
		t.Fatalf("a lease that cannot be opened read as a prune: %q", r.stderr)
	}
	if left := untracked(t, root); len(left) > 0 {
		t.Fatalf("the refused create left %v", left)
	}
}

func TestImageCacheCLIParsing(t *testing.T) {
	t.Parallel()
	root := t.TempDir()
	for _, c := range []struct {
		args    []string
		mention string
	}{
		{[]string{"image-cache"}, "want a subcommand"},
		{[]string{"image-cache", "prune"}, "--unused"},
		{[]string{"image-cache", "prune", "--unused", "--older-than", "soon"}, "--older-than"},
		{[]string{"image-cache", "prune", "--unused", "--older-than", "-5m"}, "--older-than"},
		{[]string{"image-cache", "prune", "--unused", "--max-bytes", "lots"}, "--max-bytes"},
		{[]string{"image-cache", "prune", "--unused", "--max-bytes", "-1"}, "--max-bytes"},
		{[]string{"image-cache", "prune", "--unused", "--bogus"}, "unknown flag"},
		{[]string{"image-cache", "list", "extra"}, "extra"},
		{[]string{"image-cache", "frob"}, "frob"},
	} {
		wantFailure(t, nexus(t, root, c.args...), 2, c.mention)
	}
	for _, c := range []struct {
		older, max string
		want       lifecycle.CachePruneOptions
	}{
		{"", "", lifecycle.CachePruneOptions{MaxBytes: -1}},
		{"36h", "0", lifecycle.CachePruneOptions{OlderThan: 36 * time.Hour, MaxBytes: 0}},
		{"7d", "2G", lifecycle.CachePruneOptions{OlderThan: 7 * 24 * time.Hour, MaxBytes: 2 << 30}},
		{"90m", "4096", lifecycle.CachePruneOptions{OlderThan: 90 * time.Minute, MaxBytes: 4096}},
	} {
		got, err := pruneOptions(true, false, c.older, c.max)
		if err != nil || got != c.want {
			t.Fatalf("pruneOptions(%q, %q) = %+v, %v; want %+v", c.older, c.max, got, err, c.want)
		}
	}
	// An empty state root lists nothing and prunes nothing.
	if r := mustOK(t, nexus(t, root, "image-cache", "list", "-q"), "list"); r.stdout != "" {
		t.Fatalf("empty list printed %q", r.stdout)
	}
	if r := mustOK(t, nexus(t, root, "image-cache", "list", "--json"), "list"); strings.TrimSpace(r.stdout) != "[]" {
		t.Fatalf("empty list --json printed %q", r.stdout)
	}
	mustOK(t, nexus(t, root, "image-cache", "prune", "--unused"), "prune of an empty cache")
}

// TestImageCachePruneRacesCreate: with the daemon running, real `nexus
// create` processes of one image race real `nexus image-cache prune`
// processes over an entry that starts each round unreferenced. Every
// create must succeed with a disk equal to the image, every prune must
// finish or refuse cleanly, and after each round every sandbox's entry
// must exist. Rounds start both sides together, so both orders occur.
func TestImageCachePruneRacesCreate(t *testing.T) {
	testutil.StartsSandboxes(t)
	t.Parallel()
	root := shortRoot(t)
	image := makeImage(t)
	startDaemon(t, root)
	var removed, clean, refused int
	for round := 0; round < 4; round++ {
		first := createJSON(t, root, "--image", image)
		mustOK(t, proc(t, root, "rm", "-f", "--with-snapshots", first.ID), "rm") // the entry is now unused

		const creates, prunes = 2, 2
		start := make(chan struct{})
		var wg sync.WaitGroup
		createRes := make([]result, creates)
		pruneRes := make([]result, prunes)
		for i := 0; i < creates; i++ {
			wg.Add(1)
			go func(i int) {
				defer wg.Done()
				<-start
				createRes[i] = proc(t, root, "create", "--json", "--image", image)
			}(i)
		}
		for i := 0; i < prunes; i++ {
			wg.Add(1)
			go func(i int) {
				defer wg.Done()
				<-start
				pruneRes[i] = nexus(t, root, "image-cache", "prune", "--unused", "--json")
			}(i)
		}
		close(start)
		wg.Wait()
		for _, r := range pruneRes {
			switch {
			case r.code == 0:
				var rep lifecycle.CachePruneReport
				if err := json.Unmarshal([]byte(r.stdout), &rep); err != nil {
					t.Fatal(err)
				}
				if len(rep.Removed) > 0 {
					removed++
				} else {
					clean++
				}
			case r.code == 1 && (strings.Contains(r.stderr, "in use") || strings.Contains(r.stderr, "incomplete sandbox state")):
				refused++
			default:
				t.Fatalf("prune: exit %d: %s", r.code, r.stderr)
			}
		}
		rows := cacheList(t, root)
		present := map[string]bool{}
		for _, r := range rows {
			present[r.CacheID] = true
		}
		for i, r := range createRes {
			if r.code != 0 {
				t.Fatalf("round %d create %d: exit %d: %s", round, i, r.code, r.stderr)
			}
			var sb struct{ ID string }
			json.Unmarshal([]byte(r.stdout), &sb)
			referenced := false
			for _, row := range rows {
				for _, s := range row.Sandboxes {
					if s == sb.ID && present[row.CacheID] {
						referenced = true
						// The sandbox boots on the entry itself.
						if !sameBytes(t, filepath.Join(root, "images", row.CacheID, "disk.raw"), image) {
							t.Fatalf("round %d create %d: its entry differs from the image", round, i)
						}
					}
				}
			}
			if !referenced {
				t.Fatalf("sandbox %s references no entry on disk: %+v", sb.ID, rows)
			}
		}
		// Nothing in flight now: the referenced entry survives a prune.
		if rep := pruneJSON(t, root); len(rep.Removed) != 0 {
			t.Fatalf("prune removed a referenced entry: %+v", rep)
		}
		for _, s := range sandboxes(t, root) {
			mustOK(t, proc(t, root, "rm", "-f", "--with-snapshots", s.ID), "rm")
		}
	}
	t.Logf("prunes: %d removed the unused entry, %d found nothing to remove, %d refused", removed, clean, refused)
}

// TestImageCacheDamagedEntryStopsCreate: an entry under the image's cache
// ID that lacks its identity is not reused; create fails and leaves no
// sandbox behind.
func TestImageCacheDamagedEntryStopsCreate(t *testing.T) {
	testutil.StartsSandboxes(t)
	t.Parallel()
	root := shortRoot(t)
	image := makeImage(t)
	_, id, err := imagecache.IdentityOf(image)
	if err != nil {
		t.Fatal(err)
	}
	writeLegacyEntry(t, root, id, []byte("not the image"))
	wantFailure(t, proc(t, root, "create", "--image", image), 1, "damaged image cache entry")
	assertNothingLeft(t, root)
}

// TestImageCachePruneAgeAndSize: --older-than keeps recently used entries,
// --max-bytes evicts the least recently used until the cache fits.
func TestImageCachePruneAgeAndSize(t *testing.T) {
	t.Parallel()
	root := shortRoot(t)
	os.MkdirAll(filepath.Join(root, "images"), 0o700)
	now := time.Now()
	for i, name := range []string{"e-old", "e-mid", "e-new"} {
		p := writeLegacyEntry(t, root, name, bytes.Repeat([]byte{9}, 4096))
		at := now.Add(-time.Duration(3-i) * 24 * time.Hour) // 3d, 2d, 1d ago
		os.Chtimes(p, at, at)
	}
	if rep := pruneJSON(t, root, "--dry-run", "--older-than", "36h"); len(rep.Removed) != 2 {
		t.Fatalf("older than 36h: %+v", rep)
	}
	rep := pruneJSON(t, root, "--max-bytes", "8192")
	if len(rep.Removed) != 1 || rep.Removed[0].CacheID != "e-old" || rep.CacheBytes != 8192 {
		t.Fatalf("max-bytes 8192: %+v", rep)
	}
	rep = pruneJSON(t, root, "--older-than", "36h", "--max-bytes", "0")
	if len(rep.Removed) != 1 || rep.Removed[0].CacheID != "e-mid" {
		t.Fatalf("older than 36h and max 0: %+v", rep)
	}
	if rows := cacheList(t, root); len(rows) != 1 || rows[0].CacheID != "e-new" {
		t.Fatalf("left: %+v", rows)
	}
}

// TestImageCacheRefusesSymlinkedImagesDir: when images/ itself is a
// symlink, list and prune refuse and nothing behind it is touched.
func TestImageCacheRefusesSymlinkedImagesDir(t *testing.T) {
	t.Parallel()
	root := shortRoot(t)
	outside := t.TempDir()
	target := filepath.Join(outside, "unused", "disk.raw")
	os.MkdirAll(filepath.Dir(target), 0o700)
	os.WriteFile(target, []byte("precious"), 0o600)
	if err := os.Symlink(outside, filepath.Join(root, "images")); err != nil {
		t.Fatal(err)
	}
	wantFailure(t, nexus(t, root, "image-cache", "list"), 1, "symbolic link")
	wantFailure(t, nexus(t, root, "image-cache", "prune", "--unused"), 1, "symbolic link")
	if _, err := os.Stat(target); err != nil {
		t.Fatal("entry behind a symlinked images/ was touched:", err)
	}
	if _, err := os.Lstat(filepath.Join(outside, ".lease")); !os.IsNotExist(err) {
		t.Fatal("the lease was opened through the symlink")
	}
}

// TestImageCacheForkAndRestoreKeepTheReference: a fork inherits its
// parent's entry and a restore takes it from the snapshot's manifest, so
// each protects that entry (and only it) after the original is gone.
func TestImageCacheForkAndRestoreKeepTheReference(t *testing.T) {
	testutil.StartsSandboxes(t)
	t.Parallel()
	root := shortRoot(t)
	image := makeImage(t)
	sb := createJSON(t, root, "--image", image)
	snap := strings.TrimSpace(mustOK(t, proc(t, root, "snapshot", sb.ID), "snapshot").stdout)
	r := mustOK(t, proc(t, root, "fork", sb.ID, "--json"), "fork")
	var kids []struct{ ID string }
	if err := json.Unmarshal([]byte(r.stdout), &kids); err != nil || len(kids) != 1 {
		t.Fatalf("fork --json: %v %s", err, r.stdout)
	}
	var restored struct{ ID string }
	json.Unmarshal([]byte(mustOK(t, proc(t, root, "restore", snap, "--json"), "restore").stdout), &restored)
	os.MkdirAll(filepath.Join(root, "images"), 0o700)
	writeLegacyEntry(t, root, "other-entry", []byte("x"))
	mustOK(t, proc(t, root, "rm", "-f", "--with-snapshots", sb.ID), "rm")

	rows := cacheList(t, root)
	if len(rows) != 2 {
		t.Fatalf("list: %+v", rows)
	}
	var imageRow lifecycle.CacheListing
	for _, row := range rows {
		if row.CacheID != "other-entry" {
			imageRow = row
		}
	}
	want := []string{kids[0].ID, restored.ID}
	if want[0] > want[1] {
		want[0], want[1] = want[1], want[0]
	}
	if fmt.Sprint(imageRow.Sandboxes) != fmt.Sprint(want) {
		t.Fatalf("entry referenced by %v, want the fork and the restore %v", imageRow.Sandboxes, want)
	}
	rep := pruneJSON(t, root)
	if len(rep.Removed) != 1 || rep.Removed[0].CacheID != "other-entry" {
		t.Fatalf("prune: %+v", rep)
	}
	for _, s := range sandboxes(t, root) {
		mustOK(t, proc(t, root, "rm", "-f", "--with-snapshots", s.ID), "rm")
	}
	if rep := pruneJSON(t, root); len(rep.Removed) != 1 || rep.Removed[0].CacheID != imageRow.CacheID {
		t.Fatalf("prune after the fork and restore are gone: %+v", rep)
	}
}

// TestCreateMissCopiesOnce: on a cache miss the OS disk is written in the
// same pass over the image as the cache entry (the image-cache step), so
// when that step is journaled the disk is already there, equal to the
// entry; the os-disk step only takes it over. On a hit nothing is written
// before os-disk, which clones the entry. Only a copy root has an OS disk
// of its own to write (an overlay root's is the entry itself).
func TestCreateMissCopiesOnce(t *testing.T) {
	testutil.StartsSandboxes(t)
	image := makeImage(t)
	root := shortRoot(t)
	copyRoot(t, root)
	rawDisks := func() []string {
		m, _ := filepath.Glob(filepath.Join(root, "disks", "*.raw"))
		return m
	}
	for _, c := range []struct {
		name      string
		teedDisks int // disks present when image-cache is journaled
	}{{"miss", 1}, {"hit", 1}} {
		creator, out := pausedCreate(t, root, "create.image-cache", "--image", image)
		disks := rawDisks()
		if len(disks) != c.teedDisks {
			creator.Process.Signal(syscall.SIGCONT)
			creator.Wait()
			t.Fatalf("%s: %d OS disks after image-cache was journaled (%v), want %d", c.name, len(disks), disks, c.teedDisks)
		}
		if c.name == "miss" && !sameBytes(t, disks[0], image) {
			t.Fatalf("the teed OS disk %s differs from the image", disks[0])
		}
		creator.Process.Signal(syscall.SIGCONT)
		if err := creator.Wait(); err != nil {
			t.Fatalf("%s: create: %v", c.name, err)
		}
		var sb struct{ ID string }
		if err := json.Unmarshal([]byte(out.String()), &sb); err != nil {
			t.Fatalf("%s: create printed %q", c.name, out.String())
		}
		raw := filepath.Join(root, "disks", sb.ID+".raw")
		if !sameBytes(t, raw, image) {
			t.Fatalf("%s: %s differs from the image", c.name, raw)
		}
		var methods []string
		for _, line := range strings.Split(mustOK(t, nexus(t, root, "events", "--all", "--json", "--sandbox", sb.ID), "events").stdout, "\n") {
			if strings.Contains(line, `"disk.materialised"`) && strings.Contains(line, `"raw-disk"`) {
				methods = append(methods, line)
			}
		}
		if len(methods) != 1 {
			t.Fatalf("%s: %d raw-disk materialised events, want 1: %v", c.name, len(methods), methods)
		}
	}
	if n := len(cacheList(t, root)); n != 1 {
		t.Fatalf("%d cache entries, want 1", n)
	}
}

// TestWorkspaceFromTemplate: an empty workspace disk is a clone of the
// overlay template of its size, made by the first create and reused by
// the next (not rewritten), each a clean empty ext4 (e2fsck -fn); the
// template is out of the image cache's scope (not listed, not pruned).
func TestWorkspaceFromTemplate(t *testing.T) {
	testutil.StartsSandboxes(t)
	image := makeImage(t)
	root := shortRoot(t)
	a := createJSON(t, root, "--image", image)
	tmpls, _ := filepath.Glob(filepath.Join(root, "images", "*.template", "disk.raw"))
	if len(tmpls) != 1 {
		t.Fatalf("templates %v, want one", tmpls)
	}
	before, err := os.Stat(tmpls[0])
	if err != nil {
		t.Fatal(err)
	}
	b := createJSON(t, root, "--image", image)
	if after, _ := os.Stat(tmpls[0]); !os.SameFile(before, after) || !after.ModTime().Equal(before.ModTime()) {
		t.Fatal("the second create remade the template")
	}
	for _, sb := range []string{a.ID, b.ID} {
		ws := layout.Root(root).WorkspaceDisk(sb)
		if out, err := exec.Command("e2fsck", "-fn", ws).CombinedOutput(); err != nil {
			t.Fatalf("e2fsck -fn %s: %v\n%s", ws, err, out)
		}
		events := mustOK(t, nexus(t, root, "events", "--all", "--json", "--sandbox", sb), "events").stdout
		if !strings.Contains(events, `"workspace-disk"`) || strings.Contains(events, `"method":"mkfs"`) {
			t.Fatalf("workspace of %s not cloned from the template:\n%s", sb, events)
		}
	}
	mustOK(t, nexus(t, root, "image-cache", "prune", "--unused"), "prune")
	if !exists(tmpls[0]) {
		t.Fatal("prune removed the overlay template")
	}
	for _, l := range cacheList(t, root) {
		if strings.HasSuffix(l.CacheID, ".template") {
			t.Fatalf("image-cache list shows the template: %+v", l)
		}
	}
}
