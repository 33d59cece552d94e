package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/nexus-sandbox/nexus/host/disk"
	"github.com/nexus-sandbox/nexus/internal/testutil"
)

// openedBy returns the descriptor flags with which process pid holds
// path open (fdinfo's flags, octal), and whether it does.
func openedBy(t *testing.T, pid int, path string) (int, bool) {
	t.Helper()
	want, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	fds, _ := os.ReadDir("/proc/" + strconv.Itoa(pid) + "/fd")
	for _, fd := range fds {
		fi, err := os.Stat("/proc/" + strconv.Itoa(pid) + "/fd/" + fd.Name())
		if err != nil || !os.SameFile(fi, want) {
			continue
		}
		info, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/fdinfo/" + fd.Name())
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(info), "\n") {
			if v, ok := strings.CutPrefix(line, "flags:"); ok {
				flags, err := strconv.ParseInt(strings.TrimSpace(v), 8, 64)
				if err != nil {
					t.Fatalf("fdinfo flags %q: %v", v, err)
				}
				return int(flags), true
			}
		}
	}
	return 0, false
}

// TestOverlayRootSharesTheCacheEntry: on the process driver, whose guest
// runs nexus's agent, two sandboxes of one image boot on one OS disk
// file, the image cache entry itself, each VMM holding it read-only; a
// create writes no image bytes of its own (its disks are the empty
// overlay's, and a hit leaves the entry as it was); inspect says the root
// is an overlay; prune keeps the entry while any sandbox boots on it,
// stopped ones included, and removes it once none does. Fork and snapshot
// copy the workspace, never the OS disk.
func TestOverlayRootSharesTheCacheEntry(t *testing.T) {
	testutil.StartsSandboxes(t)
	t.Parallel()
	root := shortRoot(t)
	image := makeImage(t)
	run := func(args ...string) result {
		t.Helper()
		return nexusEnv(t, root, sharedRootEnv, append([]string{"--driver", "process"}, args...)...)
	}
	create := func() jsonSandbox {
		t.Helper()
		var sb jsonSandbox
		r := mustOK(t, run("create", "--json", "--image", image), "create")
		if err := json.Unmarshal([]byte(r.stdout), &sb); err != nil {
			t.Fatalf("create --json: %v\n%s", err, r.stdout)
		}
		return sb
	}
	a := create()
	rows := cacheList(t, root)
	if len(rows) != 1 {
		t.Fatalf("cache entries after create: %+v", rows)
	}
	entry := filepath.Join(root, "images", rows[0].CacheID, "disk.raw")
	if !sameBytes(t, entry, image) {
		t.Fatal("the cache entry differs from the image")
	}
	before, err := os.Stat(entry)
	if err != nil {
		t.Fatal(err)
	}
	b := create()
	after, err := os.Stat(entry)
	if err != nil {
		t.Fatal(err)
	}
	if !os.SameFile(before, after) || !after.ModTime().Equal(before.ModTime()) {
		t.Fatal("a create on a cache hit rewrote the entry")
	}
	tmpls, _ := filepath.Glob(filepath.Join(root, "images", "*.template", "disk.raw"))
	if len(tmpls) != 1 {
		t.Fatalf("overlay templates %v, want one", tmpls)
	}
	empty, err := disk.Stat(tmpls[0])
	if err != nil {
		t.Fatal(err)
	}
	for _, sb := range []jsonSandbox{a, b} {
		got := inspectJSON(t, root, sb.ID)
		if got.Root != "overlay" {
			t.Fatalf("inspect of %s: root %q, want overlay", sb.ID, got.Root)
		}
		if got.VMM == nil {
			t.Fatalf("inspect of %s shows no VMM", sb.ID)
		}
		// Both VMMs hold the one entry file open, read-only.
		flags, ok := openedBy(t, got.VMM.Pid, entry)
		if !ok {
			t.Fatalf("the VMM of %s (pid %d) does not hold the cache entry %s open", sb.ID, got.VMM.Pid, entry)
		}
		if flags&syscall.O_ACCMODE != syscall.O_RDONLY {
			t.Fatalf("the VMM of %s holds the cache entry open with flags %o: not read-only", sb.ID, flags)
		}
		// The sandbox's own disks are the empty overlay alone: no copy of
		// the image.
		mine, _ := filepath.Glob(filepath.Join(root, "disks", sb.ID+"*"))
		var allocated int64
		for _, p := range mine {
			if strings.HasSuffix(p, ".raw") {
				t.Errorf("%s has an OS disk of its own: %s", sb.ID, p)
			}
			if s, err := disk.Stat(p); err == nil {
				allocated += s.Allocated
			}
		}
		if allocated > empty.Allocated {
			t.Errorf("the disks of %s allocate %d bytes, more than the empty overlay's %d: %v", sb.ID, allocated, empty.Allocated, mine)
		}
		for _, r := range got.Resources {
			if r.Kind == "raw-disk" || strings.HasPrefix(r.Path, "images/") {
				t.Errorf("%s owns %s (%s): the shared entry is no sandbox's", sb.ID, r.Path, r.Kind)
			}
		}
	}
	// The entry is the cache's, read-only on disk too, so a writer that is
	// not root cannot change it through the file's mode either.
	var st unix.Stat_t
	if err := unix.Stat(entry, &st); err != nil || st.Mode&0o222 != 0 {
		t.Errorf("the cache entry's mode is %o (%v): want no write bits", st.Mode&0o777, err)
	}

	// Fork and snapshot copy the overlay, not the OS disk.
	snap := strings.TrimSpace(mustOK(t, run("snapshot", a.ID), "snapshot").stdout)
	if raws, _ := filepath.Glob(filepath.Join(root, "snapshots", a.ID, snap, "*.raw")); len(raws) != 0 {
		t.Errorf("the snapshot holds a copy of the OS disk: %v", raws)
	}
	r := mustOK(t, run("fork", a.ID, "--json"), "fork")
	var kids []jsonSandbox
	if err := json.Unmarshal([]byte(r.stdout), &kids); err != nil || len(kids) != 1 {
		t.Fatalf("fork --json: %v %s", err, r.stdout)
	}
	var restored jsonSandbox
	if err := json.Unmarshal([]byte(mustOK(t, run("restore", snap, "--json"), "restore").stdout), &restored); err != nil {
		t.Fatal(err)
	}
	for _, child := range []string{kids[0].ID, restored.ID} {
		got := inspectJSON(t, root, child)
		if got.Root != "overlay" {
			t.Errorf("child %s: root %q, want overlay", child, got.Root)
		}
		if raws, _ := filepath.Glob(filepath.Join(root, "disks", child+"*.raw")); len(raws) != 0 {
			t.Errorf("child %s has an OS disk of its own: %v", child, raws)
		}
		if got.VMM == nil {
			t.Fatalf("child %s shows no VMM", child)
		}
		if _, ok := openedBy(t, got.VMM.Pid, entry); !ok {
			t.Errorf("the VMM of child %s does not boot on the cache entry", child)
		}
	}

	// Prune keeps the entry while any sandbox boots on it, a stopped one
	// included.
	mustOK(t, run("rm", "-f", "--with-snapshots", b.ID, kids[0].ID, restored.ID), "rm")
	mustOK(t, run("stop", a.ID), "stop")
	rep := pruneJSON(t, root)
	if len(rep.Removed) != 0 || len(rep.Kept) != 1 || !strings.Contains(rep.Kept[0].Reason, "the OS disk of "+a.ID) {
		t.Fatalf("prune with a stopped sandbox booting on the entry: %+v", rep)
	}
	if !sameBytes(t, entry, image) {
		t.Fatal("the entry changed under its sandboxes")
	}
	mustOK(t, run("rm", "-f", "--with-snapshots", a.ID), "rm")
	if rep := pruneJSON(t, root); len(rep.Removed) != 1 || rep.Removed[0].CacheID != rows[0].CacheID {
		t.Fatalf("prune once no sandbox boots on the entry: %+v", rep)
	}
	if left := untracked(t, root); len(left) > 0 {
		t.Errorf("left untracked: %v", left)
	}
}
