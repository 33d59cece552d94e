package main

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/nexus-sandbox/nexus/agentproto"
	"github.com/nexus-sandbox/nexus/host/disk"
	"github.com/nexus-sandbox/nexus/host/vmm"
	"github.com/nexus-sandbox/nexus/internal/testutil"
	"github.com/nexus-sandbox/nexus/projections"
)

// Cloud Hypervisor's rules, end to end on the process driver, whose VMM
// enforces them as CH does (host/vmm/standin/chrules.go).

func readJSON(t *testing.T, path string) map[string]any {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(data, &m); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	return m
}

func diskList(cfg map[string]any) []map[string]any {
	var out []map[string]any
	for _, d := range cfg["disks"].([]any) {
		out = append(out, d.(map[string]any))
	}
	return out
}

// TestRestoreCarriesWhatCHWrote: the restore of a running sandbox's
// snapshot stages every file the VMM wrote, memory-ranges included, with
// config.json changed only where it names the source's files, so the
// restored guest keeps its device ids, image types and serial port.
func TestRestoreCarriesWhatCHWrote(t *testing.T) {
	testutil.StartsSandboxes(t)
	t.Parallel()
	root := shortRoot(t)
	sb := createJSON(t, root, "--image", makeImage(t))
	snap := strings.TrimSpace(mustOK(t, proc(t, root, "snapshot", sb.ID), "snapshot").stdout)
	snapDir := filepath.Join(root, "snapshots", sb.ID, snap)

	// The snapshot's size counts the guest memory CH wrote.
	mem, err := disk.Stat(filepath.Join(snapDir, "memory-ranges"))
	if err != nil {
		t.Fatalf("snapshot without memory-ranges: %v", err)
	}
	var taken struct {
		Data struct {
			Allocated int64 `json:"allocated"`
		} `json:"data"`
	}
	r := mustOK(t, nexus(t, root, "events", "--type", "snapshot.taken", "--json"), "events")
	json.Unmarshal([]byte(r.stdout), &taken)
	var disksAllocated int64
	for _, name := range []string{sb.ID + ".raw", sb.ID + "-workspace.ext4"} {
		s, _ := disk.Stat(filepath.Join(snapDir, name))
		disksAllocated += s.Allocated
	}
	if taken.Data.Allocated < disksAllocated+mem.Allocated {
		t.Fatalf("snapshot.taken allocated %d, want at least disks %d + memory-ranges %d", taken.Data.Allocated, disksAllocated, mem.Allocated)
	}

	var child jsonSandbox
	json.Unmarshal([]byte(mustOK(t, proc(t, root, "restore", snap, "--json"), "restore").stdout), &child)
	stage := filepath.Join(root, "snapshots", child.ID, "restore")
	for _, name := range []string{"config.json", "state.json", "memory-ranges"} {
		if _, err := os.Stat(filepath.Join(stage, name)); err != nil {
			t.Fatalf("staged restore lacks %s: %v", name, err)
		}
	}
	parentCfg, childCfg := readJSON(t, filepath.Join(snapDir, "config.json")), readJSON(t, filepath.Join(stage, "config.json"))
	pd, cd := diskList(parentCfg), diskList(childCfg)
	if len(pd) != len(cd) || len(cd) != 2 {
		t.Fatalf("disks: parent %v, child %v", pd, cd)
	}
	// The child boots on the parent's image cache entry, shared read-only
	// (an overlay root), and on its own copy of the workspace.
	entry, _ := pd[0]["path"].(string)
	if !strings.HasPrefix(entry, filepath.Join(root, "images")+"/") || pd[0]["readonly"] != true || cd[0]["readonly"] != true {
		t.Fatalf("the parent's OS disk %v and the child's %v: want the cache entry, read-only", pd[0], cd[0])
	}
	wantPaths := []string{entry, filepath.Join(root, "disks", child.ID+"-workspace.ext4")}
	for i := range cd {
		if cd[i]["id"] == nil || cd[i]["id"] != pd[i]["id"] || cd[i]["image_type"] != "Raw" || cd[i]["path"] != wantPaths[i] {
			t.Fatalf("disk %d: parent %v, child %v", i, pd[i], cd[i])
		}
	}
	cv, pv := childCfg["vsock"].(map[string]any), parentCfg["vsock"].(map[string]any)
	if cv["id"] == nil || cv["id"] != pv["id"] || cv["socket"] != filepath.Join(root, "run", "sb-"+child.ID+".vsock") {
		t.Fatalf("vsock: parent %v, child %v", pv, cv)
	}
	serial := childCfg["serial"].(map[string]any)
	if serial["mode"] != "File" || serial["file"] != filepath.Join(root, "logs", child.ID+".console.log") {
		t.Fatalf("child serial %v", serial)
	}

	// The restored VM runs on the child's disks, logs to the child's
	// serial log, and its guest's superblock writes (typed disks) succeed.
	info, err := vmm.NewClient(filepath.Join(root, "run", "sb-"+child.ID+".sock")).Info(context.Background())
	if err != nil || info.State != vmm.StateRunning || info.Config.Disks[0].Path != wantPaths[0] {
		t.Fatalf("restored VM: %+v, %v", info, err)
	}
	if log, _ := os.ReadFile(filepath.Join(root, "logs", child.ID+".console.log")); !strings.Contains(string(log), "restored") {
		t.Fatalf("child serial log %q", log)
	}
	if log, _ := os.ReadFile(filepath.Join(root, "logs", sb.ID+".console.log")); !strings.Contains(string(log), "booted") {
		t.Fatalf("parent serial log %q (truncated by the child?)", log)
	}
	mustOK(t, proc(t, root, "stop", child.ID), "stop restored")
	if r := nexus(t, root, "events", "--type", "flush.acknowledged", "--sandbox", child.ID); strings.Count(r.stdout, "\n") != 1 {
		t.Fatalf("restored guest's flush not acknowledged: %q", r.stdout)
	}
	assertClean(t, root)
}

// TestRestoreRefusesRunningSnapshotWithVolumes: the saved guest expects
// its volume's disk, which a restored sandbox never takes over; refused up
// front, nothing made.
func TestRestoreRefusesRunningSnapshotWithVolumes(t *testing.T) {
	testutil.StartsSandboxes(t)
	t.Parallel()
	root := shortRoot(t)
	mustOK(t, proc(t, root, "volume", "create", "data", "--size", "16M"), "volume create")
	sb := createJSON(t, root, "--image", makeImage(t), "--volume", "data:/data")
	snap := strings.TrimSpace(mustOK(t, proc(t, root, "snapshot", sb.ID), "snapshot").stdout)
	wantFailure(t, proc(t, root, "restore", snap), 1, "named volume(s) data")
	if list := sandboxes(t, root); len(list) != 1 {
		t.Fatalf("a refused restore left %d sandboxes", len(list))
	}
	assertClean(t, root)
	// Stopped, the snapshot is disks only and restores (cold, no volume).
	mustOK(t, proc(t, root, "stop", sb.ID), "stop")
	snap = strings.TrimSpace(mustOK(t, proc(t, root, "snapshot", sb.ID), "snapshot").stdout)
	var child jsonSandbox
	json.Unmarshal([]byte(mustOK(t, proc(t, root, "restore", snap, "--json"), "restore stopped").stdout), &child)
	if child.State != projections.StateRunning || len(child.Volumes) != 0 {
		t.Fatalf("restored child %+v", child)
	}
}

// TestForkReadonlyVolumesOfRunningParent: CH's disk locks keep a child
// from opening a volume its running parent holds read-write; the fork is
// refused before anything is copied, and works from a stopped parent.
func TestForkReadonlyVolumesOfRunningParent(t *testing.T) {
	testutil.StartsSandboxes(t)
	t.Parallel()
	root := shortRoot(t)
	mustOK(t, proc(t, root, "volume", "create", "data", "--size", "16M"), "volume create")
	sb := createJSON(t, root, "--image", makeImage(t), "--volume", "data:/data")
	wantFailure(t, proc(t, root, "fork", sb.ID, "--readonly-volumes"), 1, "fork it stopped")
	if list := sandboxes(t, root); len(list) != 1 {
		t.Fatalf("a refused fork left %d sandboxes", len(list))
	}
	assertClean(t, root)
	mustOK(t, proc(t, root, "stop", sb.ID), "stop")
	var children []jsonSandbox
	json.Unmarshal([]byte(mustOK(t, proc(t, root, "fork", sb.ID, "--readonly-volumes", "--json"), "fork stopped").stdout), &children)
	if len(children) != 1 || children[0].State != projections.StateRunning || len(children[0].Volumes) != 1 || !children[0].Volumes[0].ReadOnly {
		t.Fatalf("children %+v", children)
	}
	// While the child holds the volume read-only, the parent's write lock
	// would fail its boot: refused up front.
	wantFailure(t, proc(t, root, "start", sb.ID), 1, "stop those first")
	mustOK(t, proc(t, root, "stop", children[0].ID), "stop child")
	mustOK(t, proc(t, root, "start", sb.ID), "start parent")
}

// TestConsoleLogUnderLogs: the guest's console goes to logs/<id>.console.log,
// and a symlink planted there is refused, not followed.
func TestConsoleLogUnderLogs(t *testing.T) {
	testutil.StartsSandboxes(t)
	t.Parallel()
	root := shortRoot(t)
	sb := createJSON(t, root, "--image", makeImage(t))
	log := filepath.Join(root, "logs", sb.ID+".console.log")
	if data, err := os.ReadFile(log); err != nil || !strings.Contains(string(data), "console=ttyS0") {
		t.Fatalf("serial log: %q, %v", data, err)
	}
	mustOK(t, proc(t, root, "stop", sb.ID), "stop")
	outside := filepath.Join(t.TempDir(), "precious")
	os.WriteFile(outside, []byte("precious"), 0o600)
	os.Remove(log)
	if err := os.Symlink(outside, log); err != nil {
		t.Fatal(err)
	}
	wantFailure(t, proc(t, root, "start", sb.ID), 1, "symbolic link")
	if data, _ := os.ReadFile(outside); string(data) != "precious" {
		t.Fatalf("the file behind the planted link changed: %q", data)
	}
}

// TestAPISocketLockIsReclaimed: CH v53+ leaves run/sb-<id>.sock.lock; the
// sandbox owns it while its VMM runs, stop, recover and rm reclaim it,
// and the reaper knows its name.
func TestAPISocketLockIsReclaimed(t *testing.T) {
	testutil.StartsSandboxes(t)
	t.Parallel()
	root := shortRoot(t)
	sb := createJSON(t, root, "--image", makeImage(t))
	lock := filepath.Join(root, "run", "sb-"+sb.ID+".sock.lock")
	rel := "run/sb-" + sb.ID + ".sock.lock"
	if _, err := os.Lstat(lock); err != nil || !owns(sb, rel) {
		t.Fatalf("lock file %v, owned %v: %+v", err, owns(sb, rel), sb.Resources)
	}
	assertClean(t, root)
	mustOK(t, proc(t, root, "stop", sb.ID), "stop")
	if _, err := os.Lstat(lock); !os.IsNotExist(err) {
		t.Fatalf("stop left %s: %v", rel, err)
	}
	mustOK(t, proc(t, root, "start", sb.ID), "start")
	var cur jsonSandbox
	for _, s := range sandboxes(t, root) {
		if s.ID == sb.ID {
			cur = s
		}
	}
	if cur.VMM == nil {
		t.Fatalf("no VMM after start: %+v", cur)
	}
	killAndAwait(t, cur.VMM)
	mustOK(t, nexus(t, root, "recover"), "recover")
	if _, err := os.Lstat(lock); !os.IsNotExist(err) {
		t.Fatalf("recover left %s: %v", rel, err)
	}
	mustOK(t, proc(t, root, "start", sb.ID), "start again")
	mustOK(t, proc(t, root, "rm", "-f", "--with-snapshots", sb.ID), "rm")
	if _, err := os.Lstat(lock); !os.IsNotExist(err) {
		t.Fatalf("rm left %s: %v", rel, err)
	}

	// One left by a VMM nexus no longer knows is an orphan by its name.
	stray := "run/sb-01JDQ4Z6X1M9A3Y0C5TB2R8NKW.sock.lock"
	os.WriteFile(filepath.Join(root, stray), nil, 0o600)
	// reapRun: a /proc scan that met an exiting process would keep the
	// stray as ambiguous, as it must; the orphan verdict is asserted on a
	// conclusive run.
	rep, r := reapRun(t, root)
	if r.code != 0 {
		t.Fatalf("reap: exit %d: %s", r.code, r.stderr)
	}
	found := false
	for _, o := range rep.Orphans {
		if o.Path == filepath.Join(root, stray) && o.Kind == "api-socket-lock" {
			found = true
		}
	}
	if !found {
		t.Fatalf("reap does not call %s an orphan api-socket-lock: %+v", stray, rep)
	}
}

// TestDisksCarrySerials: every disk a sandbox boots with says what it is
// (docs/guest-agent.md), its own and a fork child's alike, and a volume
// name too long for a virtio-blk serial gets the hashed form CH accepts.
func TestDisksCarrySerials(t *testing.T) {
	testutil.StartsSandboxes(t)
	root := shortRoot(t)
	long := "a-volume-name-longer-than-a-serial"
	mustOK(t, proc(t, root, "volume", "create", long, "--size", "16M"), "volume create")
	src := t.TempDir()
	os.WriteFile(filepath.Join(src, "f"), []byte("x"), 0o600)
	sb := createJSON(t, root, "--image", makeImage(t), "--handle", "dev/serials", "--shadow", "cfg="+src, "--volume", long+":/data")
	serials := func(id string) map[string]bool {
		t.Helper()
		info, err := vmm.NewClient(filepath.Join(root, "run", "sb-"+id+".sock")).Info(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		got := map[string]bool{}
		for _, d := range info.Config.Disks {
			if d.Serial == "" || got[d.Serial] {
				t.Fatalf("disk %s: serial %q (missing or repeated)", d.Path, d.Serial)
			}
			got[d.Serial] = true
		}
		return got
	}
	hashed := agentproto.DiskSerial(agentproto.SerialVolume, long)
	got := serials(sb.ID)
	for _, want := range []string{"nexus-os", "nexus-workspace", "nexus-shadow-cfg", hashed} {
		if !got[want] {
			t.Fatalf("serials %v lack %s", got, want)
		}
	}
	if len(hashed) != vmm.SerialMax {
		t.Fatalf("hashed serial %q", hashed)
	}
	mustOK(t, proc(t, root, "stop", sb.ID), "stop")
	var children []jsonSandbox
	json.Unmarshal([]byte(mustOK(t, proc(t, root, "fork", sb.ID, "--readonly-volumes", "--json"), "fork").stdout), &children)
	if len(children) != 1 {
		t.Fatalf("children %+v", children)
	}
	got = serials(children[0].ID)
	for _, want := range []string{"nexus-os", "nexus-workspace", "nexus-shadow-cfg", hashed} {
		if !got[want] {
			t.Fatalf("child serials %v lack %s", got, want)
		}
	}
}
