package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/oklog/ulid/v2"

	"github.com/nexus-sandbox/nexus/events"
	"github.com/nexus-sandbox/nexus/internal/testutil"
	"github.com/nexus-sandbox/nexus/lifecycle"
	"github.com/nexus-sandbox/nexus/store"
)

// appendRaw writes events straight into a state root's journal, as an
// older nexus (one whose rm left stale attachments) would have left them.
func appendRaw(t *testing.T, root string, evs ...events.Event) {
	t.Helper()
	stopDaemons(root) // one started on demand by an earlier command
	ctx := context.Background()
	n, err := store.Open(ctx, root, store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	if _, err := n.Append(ctx, evs...); err != nil {
		t.Fatal(err)
	}
}

func volumeSum(t *testing.T, root, name string) string {
	t.Helper()
	out, err := exec.Command("sha256sum", filepath.Join(root, "volumes", name, "disk.ext4")).Output()
	if err != nil {
		t.Fatal(err)
	}
	return string(out)
}

func prune(t *testing.T, root string, args ...string) lifecycle.PruneReport {
	t.Helper()
	out := mustOK(t, proc(t, root, append([]string{"volume", "prune", "--json"}, args...)...), "volume prune").stdout
	var rep lifecycle.PruneReport
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatalf("volume prune --json: %v\n%s", err, out)
	}
	return rep
}

// TestVolumePruneClearsStaleAttachments covers journals that already hold
// stale attachments: an attachment naming a sandbox that no longer
// exists blocks `volume rm` until `volume prune --apply` clears it. A dry
// run changes nothing, a live sandbox's attachment is never cleared, and no
// volume byte changes until the user's explicit rm.
func TestVolumePruneClearsStaleAttachments(t *testing.T) {
	testutil.StartsSandboxes(t)
	t.Parallel()
	root := shortRoot(t)
	mustOK(t, proc(t, root, "volume", "create", "stale", "--size", "16M"), "volume create stale")
	mustOK(t, proc(t, root, "volume", "create", "inuse", "--size", "16M"), "volume create inuse")
	live := createJSON(t, root, "--image", makeImage(t), "--volume", "inuse:/data")
	gone := ulid.Make().String()
	appendRaw(t, root, events.New(ulid.Make(), time.Now().UTC(), gone, events.VolumeAttachedEvent{Name: "stale", GuestPath: "/data"}))
	staleSum, inuseSum := volumeSum(t, root, "stale"), volumeSum(t, root, "inuse")

	wantFailure(t, proc(t, root, "volume", "rm", "--yes", "stale"), 1, "attached")
	dry := prune(t, root)
	if dry.Apply || !slices.Equal(dry.Stale, []string{"stale@" + gone}) || len(dry.Removed) != 0 {
		t.Fatalf("dry run: %+v", dry)
	}
	wantFailure(t, proc(t, root, "volume", "rm", "--yes", "stale"), 1, "attached") // the dry run changed nothing

	applied := prune(t, root, "--apply", "--include-detached=false")
	if !slices.Equal(applied.Stale, []string{"stale@" + gone}) || !slices.Contains(applied.Detached, "stale") || slices.Contains(applied.Detached, "inuse") {
		t.Fatalf("apply: %+v", applied)
	}
	if again := prune(t, root, "--apply"); len(again.Stale) != 0 {
		t.Fatalf("second prune found stale attachments again: %+v", again)
	}
	if r := nexus(t, root, "events", "--type", "volume.detached", "--sandbox", gone); r.code != 0 || r.stdout == "" {
		t.Fatalf("the cleared attachment is not a journal event: %q %q", r.stdout, r.stderr)
	}
	if volumeSum(t, root, "stale") != staleSum || volumeSum(t, root, "inuse") != inuseSum {
		t.Fatal("prune changed a volume's bytes")
	}
	wantFailure(t, proc(t, root, "volume", "rm", "--yes", "inuse"), 1, "attached")
	mustOK(t, proc(t, root, "volume", "rm", "--yes", "stale"), "volume rm stale after prune")
	if _, err := os.Stat(filepath.Join(root, "volumes", "stale")); !os.IsNotExist(err) {
		t.Fatalf("volume rm left volumes/stale: %v", err)
	}
	if _, err := os.Stat(filepath.Join(root, "volumes", "inuse", "disk.ext4")); err != nil {
		t.Fatalf("the attached volume went missing: %v", err)
	}
	mustOK(t, proc(t, root, "rm", "-f", "--with-snapshots", live.ID), "rm")
}

// A volume size without a unit is bytes, so `--size 64` is refused with
// the hint; one larger than the free space is made (sparse) with a
// warning saying when the guest's writes will fail.
func TestVolumeSizesPeopleMistype(t *testing.T) {
	t.Parallel()
	root := shortRoot(t)
	wantFailure(t, nexus(t, root, "volume", "create", "tiny", "--size", "64"), 1, "a size takes a unit")
	var fs syscall.Statfs_t
	if err := syscall.Statfs(root, &fs); err != nil {
		t.Fatal(err)
	}
	past := fmt.Sprintf("%dG", 2*int64(fs.Bavail)*fs.Bsize>>30+1)
	r := mustOK(t, nexus(t, root, "volume", "create", "huge", "--size", past), "volume create "+past)
	if !strings.Contains(r.stderr, "nexus: warning: volume huge is ") || !strings.Contains(r.stderr, "free where it lives: it is sparse") {
		t.Fatalf("a volume past the free space made without a warning: %q", r.stderr)
	}
	if r := mustOK(t, nexus(t, root, "volume", "create", "small", "--size", "16M"), "volume create 16M"); r.stderr != "" {
		t.Fatalf("a volume that fits warned: %q", r.stderr)
	}
}
