package lifecycle

import (
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/oklog/ulid/v2"

	"github.com/nexus-sandbox/nexus/events"
	"github.com/nexus-sandbox/nexus/host/driver"
	"github.com/nexus-sandbox/nexus/host/intent"
	"github.com/nexus-sandbox/nexus/internal/testutil"
	"github.com/nexus-sandbox/nexus/projections"
	"github.com/nexus-sandbox/nexus/sagas"
)

// bootSteps are the events of a cold boot, as they follow a commit or an
// overlay preparation: the three logs and the console's index claimed,
// the run marked, the supervisor, then the VMM.
var bootTypes = []string{"resource.created", "resource.created", "resource.created", "resource.created", "flush.pending", "supervisor.started", "sandbox.started"}

func TestCreateJournalsEveryStepAndBoots(t *testing.T) {
	t.Parallel()
	f := newFlow(t)
	sb := f.create(CreateSpec{Handle: "web/app"})
	want := append([]string{"saga.started",
		"intent.written", "intent.written", // the shadow intent (a handle), then the create intent
		"imagecache.prepared", "imagecache.used", // a miss: the entry is made, and used
		"disk.materialised", "disk.materialised", // OS disk (written with the entry), workspace
		"resource.created", "resource.created", // supervisor state, record dir
		"sandbox.created", "handle.claimed", // one append: the commit claims its handle
		"intent.retired", "intent.retired"}, bootTypes...)
	want = append(want, "saga.finished")
	if got := types(f.j.since(0)); !reflect.DeepEqual(got, want) {
		t.Fatalf("create journaled\n%v\nwant\n%v", got, want)
	}
	if sb.State != projections.StateRunning || sb.Handle != "web/app" || !alive(sb.VMM) || !alive(sb.Supervisor) {
		t.Fatalf("created %+v: want running, with its handle and a live VMM and supervisor", sb)
	}
	for _, rel := range []string{"disks/" + sb.ID + ".raw", "disks/" + sb.ID + "-workspace.ext4", "supervisors/" + sb.ID + "/mitm-ca.pem",
		"sandboxes/" + sb.ID + "/record.json", "logs/" + sb.ID + ".console.log", "logs/" + sb.ID + ".console.idx", "run/sb-" + sb.ID + ".sock", "run/sb-" + sb.ID + ".vsock"} {
		if !f.exists(rel) || !sb.Owns(rel) && !strings.HasSuffix(rel, "record.json") && !strings.HasSuffix(rel, ".pem") {
			t.Errorf("%s: exists %v, owned %v; want both", rel, f.exists(rel), sb.Owns(rel))
		}
	}
	// The markers are gone once the commit is journaled.
	for _, rel := range f.files("disks") {
		if strings.Contains(rel, "intent") {
			t.Errorf("intent %s left after the commit", rel)
		}
	}
	// The second create of the same image is a hit: the one entry serves
	// both, and each sandbox's bootstrap names it.
	second := f.create(CreateSpec{Image: sb.Image})
	st, _ := f.j.ImageCache(f.ctx)
	b1, _ := f.j.Bootstrap(f.ctx, sb.ID)
	b2, _ := f.j.Bootstrap(f.ctx, second.ID)
	if len(st.Entries) != 1 || b1.CacheID == "" || b1 != b2 {
		t.Fatalf("cache %+v, bootstraps %+v and %+v: want one entry both came from", st.Entries, b1, b2)
	}
}

func TestCreateRefusesBeforeWritingAnything(t *testing.T) {
	t.Parallel()
	f := newFlow(t)
	img := f.image()
	taken := f.create(CreateSpec{Image: img, Handle: "taken"})
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "file"), []byte("x"), 0o600)
	fork := ulid.Make().String() + "-x"
	cases := []struct {
		name   string
		spec   CreateSpec
		driver string
		is     error
		says   string
	}{
		{"no image", CreateSpec{}, "", ErrRefused, "--image is required"},
		{"image is a directory", CreateSpec{Image: dir}, "", ErrRefused, "is not a regular file"},
		{"id not a ULID", CreateSpec{Image: img, ID: "nope"}, "", ErrRefused, `id "nope" is not a canonical ULID`},
		{"id in use", CreateSpec{Image: img, ID: taken.ID}, "", ErrRefused, "is already in use"},
		{"bad handle", CreateSpec{Image: img, Handle: "../up"}, "", ErrRefused, "use letters, digits"},
		{"handle in use", CreateSpec{Image: img, Handle: "taken"}, "", ErrRefused, `handle "taken" is already in use`},
		{"handle in the fork namespace", CreateSpec{Image: img, Handle: fork}, "", ErrRefused, "names fork copies"},
		{"shadow without a handle", CreateSpec{Image: img, Shadows: []Shadow{{"a", dir}}}, "", ErrRefused, "--shadow needs --handle"},
		{"bad shadow name", CreateSpec{Image: img, Handle: "h", Shadows: []Shadow{{"A!", dir}}}, "", ErrRefused, `shadow name "A!"`},
		{"shadow twice", CreateSpec{Image: img, Handle: "h", Shadows: []Shadow{{"a", dir}, {"a", dir}}}, "", ErrRefused, `shadow name "a"`},
		{"shadow source missing", CreateSpec{Image: img, Handle: "h", Shadows: []Shadow{{"a", dir + "/none"}}}, "", ErrRefused, "shadow a:"},
		{"shadow source a FIFO", CreateSpec{Image: img, Handle: "h", Shadows: []Shadow{{"a", "/dev/null"}}}, "", ErrRefused, "neither a regular file nor a directory"},
		{"workspace missing", CreateSpec{Image: img, Workspace: dir + "/none"}, "", ErrRefused, "--workspace:"},
		{"workspace a file", CreateSpec{Image: img, Workspace: filepath.Join(dir, "file")}, "", ErrRefused, "is not a directory"},
		{"unknown volume", CreateSpec{Image: img, Volumes: []Mount{{"data", "/data"}}}, "", ErrNotFound, `no volume "data"`},
		{"unknown driver", CreateSpec{Image: img}, "nope", ErrRefused, `unknown driver "nope"`},
		{"cloud-hypervisor without a kernel", CreateSpec{Image: img}, driver.CloudHypervisor, ErrRefused, "NEXUS_KERNEL_PATH is not set"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			f.m.Driver.Name = driver.Process
			if c.driver != "" {
				f.m.Driver.Name = c.driver
			}
			mark, disks := f.j.mark(), f.files("disks")
			_, err := f.m.Create(f.ctx, c.spec)
			wantErr(t, err, c.is, c.says)
			if got := f.j.since(mark); len(got) > 0 {
				t.Errorf("a refused create journaled %v", types(got))
			}
			if got := f.files("disks"); !reflect.DeepEqual(got, disks) {
				t.Errorf("a refused create changed disks/: %v, was %v", got, disks)
			}
		})
	}
}

// Every step of a create that fails is undone newest first, and what the
// undo reclaims is journaled: before the commit nothing of the sandbox is
// left, not a file and not a view; after it (the pivot) the sandbox stays,
// stopped, with its disks, and no process of it runs.
func TestCreateUndoesAFailedStep(t *testing.T) {
	t.Parallel()
	boom := errors.New("injected")
	cases := []struct {
		name      string
		journal   events.Type // the journal refuses this event
		launcher  string      // the launcher refuses this start
		dies      string      // this process dies before it answers
		committed bool
		says      string
	}{
		{name: "intents journaled", journal: events.IntentWritten, says: "intents: injected"},
		{name: "image cache entry", journal: events.ImageCachePrepared, says: "image-cache: injected"},
		// The disks and the supervisor state are journaled with the record
		// dir, in one append: a refusal names every step in it.
		{name: "OS disk", journal: events.DiskMaterialised, says: "os-disk+workspace-disk+supervisor-state+record-dir: injected"},
		{name: "supervisor state", journal: events.ResourceCreated, says: "os-disk+workspace-disk+supervisor-state+record-dir: injected"},
		{name: "commit", journal: events.SandboxCreated, says: "commit: injected"},
		{name: "run marker", journal: events.FlushPending, committed: true, says: "run-mark: injected"},
		{name: "supervisor start", launcher: "supervisor", committed: true, says: "supervisor: injected"},
		{name: "supervisor recorded", journal: events.SupervisorStarted, committed: true, says: "supervisor+vmm: injected"},
		{name: "VMM start", launcher: "VMM", committed: true, says: "vmm: injected"},
		{name: "VMM dies before answering", dies: "VMM", committed: true, says: "VMM exited before answering"},
		{name: "VMM recorded", journal: events.SandboxStarted, committed: true, says: "vmm: injected"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			testutil.ShortSample(t, c.name == "intents journaled" || c.name == "commit" || c.name == "VMM dies before answering")
			f := newFlow(t)
			if c.journal != "" {
				f.j.failType(c.journal, boom)
			}
			if c.launcher != "" {
				f.l.refuse[c.launcher] = boom
			}
			if c.dies != "" {
				f.l.die[c.dies] = true
			}
			id := ulid.Make().String()
			_, err := f.m.Create(f.ctx, CreateSpec{Image: f.image(), Handle: "h", ID: id})
			wantErr(t, err, sagas.ErrCompensated, c.says)
			f.j.fail = nil
			evs := f.j.since(0)
			if got := types(evs); got[len(got)-1] != "saga.compensated" {
				t.Fatalf("journal ends %v: want saga.compensated", got)
			}
			if left := testutil.ProcessesUnder(f.root); len(left) > 0 {
				t.Fatalf("processes left running: %v", left)
			}
			for _, rel := range f.files("disks", "run", "supervisors") {
				if strings.Contains(rel, "intent") {
					t.Errorf("intent %s left after compensation", rel)
				}
			}
			sb, found := f.find(id)
			if !c.committed {
				if found {
					t.Fatalf("an uncommitted create left sandbox %+v in the view", sb)
				}
				for _, rel := range f.files("disks", "supervisors", "sandboxes", "run") {
					t.Errorf("%s left by an undone create", rel)
				}
				for _, e := range ofType(evs, events.DiskMaterialised) {
					p := e.Payload.(events.DiskMaterialisedEvent)
					if !slices.ContainsFunc(ofType(evs, events.ResourceReclaimed), func(r events.Event) bool {
						return r.Payload.(events.ResourceReclaimedEvent).Resource.Path == p.Resource.Path
					}) {
						t.Errorf("disk %s materialised but its reclaim not journaled", p.Resource.Path)
					}
				}
				return
			}
			if !found || sb.State != projections.StateStopped {
				t.Fatalf("a create that failed after its commit left %+v: want the sandbox, stopped", sb)
			}
			if !f.exists("disks/"+id+".raw") || !f.exists("disks/"+id+"-workspace.ext4") {
				t.Fatalf("the committed disks are gone: %v", f.files("disks"))
			}
			if sb.VMM != nil || sb.Supervisor != nil {
				t.Fatalf("processes still recorded: VMM %+v, supervisor %+v", sb.VMM, sb.Supervisor)
			}
			if f.exists("run/sb-" + id + ".sock") {
				t.Fatalf("the API socket outlived an undone boot")
			}
		})
	}
}

// A disk path that exists before the create is someone
// else's file; the create fails on it and its undo leaves it alone.
func TestCreateLeavesAFileItFoundAtItsDiskPath(t *testing.T) {
	t.Parallel()
	f := newFlow(t)
	id := ulid.Make().String()
	ws := filepath.Join(f.root, "disks", id+"-workspace.ext4")
	os.MkdirAll(filepath.Dir(ws), 0o700)
	os.WriteFile(ws, []byte("not yours"), 0o600)
	_, err := f.m.Create(f.ctx, CreateSpec{Image: f.image(), ID: id})
	wantErr(t, err, sagas.ErrCompensated, "exists and is not this saga's")
	if data, _ := os.ReadFile(ws); string(data) != "not yours" {
		t.Fatalf("the undo touched a file it did not make: %q", data)
	}
	if f.exists("disks/" + id + ".raw") {
		t.Fatal("the OS disk it did make was left")
	}
}

// A marker another create left (in flight or crashed) refuses a create of
// the same handle before the journal hears of it.
func TestCreateRefusesWhileAnotherIntentOfItsHandleExists(t *testing.T) {
	t.Parallel()
	f := newFlow(t)
	if err := os.MkdirAll(f.m.Root.Disks(), 0o700); err != nil {
		t.Fatal(err)
	}
	h, err := intent.Publish(f.m.Root.ShadowIntent("h"), intent.Intent{Kind: string(events.KindShadowIntent), Sandbox: ulid.Make().String(), Handle: "h"})
	if err != nil {
		t.Fatal(err)
	}
	h.Release()
	_, err = f.m.Create(f.ctx, CreateSpec{Image: f.image(), Handle: "h"})
	wantErr(t, err, ErrRefused, "another create of this handle is in flight or crashed")
	if f.j.mark() != 0 {
		t.Fatalf("journaled %v", types(f.j.since(0)))
	}
}

// A manager without a Launcher refuses the boot; its create is undone back
// to the commit like any boot that failed.
func TestCreateWithoutALauncherIsRefusedAtItsBoot(t *testing.T) {
	t.Parallel()
	f := newFlow(t)
	f.m.Launcher = nil
	_, err := f.m.Create(f.ctx, CreateSpec{Image: f.image()})
	wantErr(t, err, ErrNoLauncher)
}

// A workspace directory becomes an ext4 image holding its files, and each
// shadow (a directory or an image) a disk keyed by the handle.
func TestCreateWithWorkspaceAndShadows(t *testing.T) {
	t.Parallel()
	f := newFlow(t)
	ws, shadowDir := t.TempDir(), t.TempDir()
	os.WriteFile(filepath.Join(ws, "main.go"), []byte("package main"), 0o600)
	os.WriteFile(filepath.Join(shadowDir, "dep"), []byte("dep"), 0o600)
	sb := f.create(CreateSpec{Handle: "proj", Workspace: ws, Shadows: []Shadow{{"deps", shadowDir}, {"img", f.image()}}})
	var methods []string
	for _, e := range ofType(f.j.since(0), events.DiskMaterialised) {
		p := e.Payload.(events.DiskMaterialisedEvent)
		methods = append(methods, string(p.Resource.Kind)+"="+p.Method)
	}
	if !slices.Contains(methods, "workspace-disk=mkfs") || !slices.Contains(methods, "shadow-disk=mkfs") || len(methods) != 4 {
		t.Fatalf("disks materialised: %v; want OS, workspace (mkfs), two shadows", methods)
	}
	for _, name := range []string{"deps", "img"} {
		if rel := f.m.rel(f.m.Root.ShadowDisk("proj", name)); !f.exists(rel) || !sb.Owns(rel) {
			t.Errorf("shadow %s: %s exists %v, owned %v", name, rel, f.exists(rel), sb.Owns(rel))
		}
	}
}

// The production Spawner says which process it could not spawn, and the
// boot is undone back to the commit.
func TestSpawnerNamesWhatItCouldNotSpawn(t *testing.T) {
	t.Parallel()
	f := newFlow(t)
	f.m.Launcher = Spawner{}
	f.m.Driver.Exe = filepath.Join(t.TempDir(), "no-nexus-here")
	_, err := f.m.Create(f.ctx, CreateSpec{Image: f.image(), Handle: "h"})
	wantErr(t, err, sagas.ErrCompensated, "spawn supervisor:", "no-nexus-here")
	if sb, found := f.find("h"); !found || sb.State != projections.StateStopped {
		t.Fatalf("%+v: want the committed sandbox, stopped", sb)
	}
}

// TestCreateOverlayRootWritesNoOSDisk: a sandbox whose guest runs the
// agent as init (the process driver's) boots on the cache entry: its
// create journals no OS disk step and owns no raw disk, its boot
// configuration says overlay, and its VM is given the entry read-only,
// first, with nexus.root=overlay on the command line. Its fork child boots
// on the same entry and copies only the workspace.
func TestCreateOverlayRootWritesNoOSDisk(t *testing.T) {
	t.Parallel()
	f := overlayFlow(t)
	sb := f.create(CreateSpec{})
	if sb.BootConfig.Root != events.RootOverlay {
		t.Fatalf("boot configuration %+v: want root overlay", sb.BootConfig)
	}
	for _, e := range f.j.since(0) {
		if d, ok := e.Payload.(events.DiskMaterialisedEvent); ok && d.Resource.Kind == events.KindRawDisk {
			t.Fatalf("an overlay root's create materialised an OS disk: %+v", d)
		}
	}
	if f.exists("disks/" + sb.ID + ".raw") {
		t.Fatal("an OS disk of the sandbox's own was written")
	}
	entry := f.m.Root.ImageDisk(sb.Bootstrap.CacheID)
	disks := f.m.vmDisks(f.ctx, sb)
	if len(disks) == 0 || disks[0].Path != entry || !disks[0].Readonly || disks[0].Serial != "nexus-os" {
		t.Fatalf("VM disks %+v: want the cache entry %s first, read-only, as nexus-os", disks, entry)
	}
	if m := guestMounts(sb); !slices.Contains(m, "nexus.root=overlay") {
		t.Fatalf("guest command line additions %v lack nexus.root=overlay", m)
	}
	kids, err := f.m.Fork(f.ctx, ForkSpec{Parent: sb.ID, Count: 1})
	if err != nil {
		t.Fatal(err)
	}
	kid := kids[0]
	if kid.BootConfig.Root != events.RootOverlay || kid.Bootstrap != sb.Bootstrap || f.exists("disks/"+kid.ID+".raw") {
		t.Fatalf("fork child %+v: want an overlay root on the parent's entry, no OS disk copy", kid)
	}
	if d := f.m.vmDisks(f.ctx, kid); d[0].Path != entry || !d[0].Readonly {
		t.Fatalf("fork child's VM disks %+v", d)
	}
}
