package standin

import (
	"encoding/json"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/nexus-sandbox/nexus/agentproto"
	"github.com/nexus-sandbox/nexus/host/vmm"
)

// snapshotVM boots cfg in a fresh stand-in VMM, snapshots it into a new
// directory and shuts the VMM down, returning the directory.
func snapshotVM(t *testing.T, dir string, cfg vmm.Config) string {
	t.Helper()
	ctx := ctxT(t)
	snap := filepath.Join(dir, "snap")
	if err := os.Mkdir(snap, 0o700); err != nil {
		t.Fatal(err)
	}
	a := startVMM(t, filepath.Join(dir, "a.sock"))
	for _, step := range []func() error{
		func() error { return a.client.Create(ctx, cfg) },
		func() error { return a.client.Boot(ctx) },
		func() error { return a.client.Pause(ctx) },
		func() error { return a.client.Snapshot(ctx, snap) },
		func() error { return a.client.ShutdownVMM(ctx) },
	} {
		if err := step(); err != nil {
			t.Fatal(err)
		}
	}
	if err := a.wait(t); err != nil {
		t.Fatal(err)
	}
	return snap
}

// copySnapshot copies snap's files except those named in skip.
func copySnapshot(t *testing.T, snap, dst string, skip ...string) {
	t.Helper()
	if err := os.Mkdir(dst, 0o700); err != nil {
		t.Fatal(err)
	}
	ents, _ := os.ReadDir(snap)
	for _, e := range ents {
		if contains(skip, e.Name()) {
			continue
		}
		in, err := os.Open(filepath.Join(snap, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		out, err := os.Create(filepath.Join(dst, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := io.Copy(out, in); err != nil {
			t.Fatal(err)
		}
		in.Close()
		out.Close()
	}
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// TestRestoreNeedsWhatCHNeeds: a restore reads memory-ranges and matches
// saved device state by device id; a staging that drops either fails.
func TestRestoreNeedsWhatCHNeeds(t *testing.T) {
	dir := t.TempDir()
	ctx := ctxT(t)
	os1, ws := makeDisk(t, dir, "os.img"), makeDisk(t, dir, "ws.img")
	vol := makeDisk(t, dir, "vol.img")
	snap := snapshotVM(t, dir, vmm.Config{
		Payload: vmm.Payload{Kernel: "k"},
		Disks:   []vmm.Disk{{Path: os1, ImageType: vmm.ImageRaw}, {Path: ws, ImageType: vmm.ImageRaw}, {Path: vol, ImageType: vmm.ImageRaw}},
		Memory:  vmm.Memory{Size: 64 << 20},
		Vsock:   &vmm.Vsock{Cid: 3, Socket: filepath.Join(dir, "v.sock")},
	})
	var cfg map[string]any
	data, _ := os.ReadFile(filepath.Join(snap, vmm.SnapshotConfigFile))
	if err := json.Unmarshal(data, &cfg); err != nil {
		t.Fatal(err)
	}
	if v := cfg["vsock"].(map[string]any)["id"]; v != "_vsock3" {
		t.Fatalf("config.json vsock id %v, want _vsock3 (one counter, disks first)", v)
	}

	b := startVMM(t, filepath.Join(dir, "b.sock"))
	// Without memory-ranges.
	noMem := filepath.Join(dir, "nomem")
	copySnapshot(t, snap, noMem, vmm.SnapshotMemoryFile)
	err := b.client.Restore(ctx, noMem)
	wantStatus(t, err, http.StatusInternalServerError)
	if !strings.Contains(err.Error(), "memory-ranges") {
		t.Fatalf("restore without memory-ranges: %v", err)
	}
	// With a short memory-ranges.
	short := filepath.Join(dir, "short")
	copySnapshot(t, snap, short)
	os.Truncate(filepath.Join(short, vmm.SnapshotMemoryFile), 4096)
	wantStatus(t, b.client.Restore(ctx, short), http.StatusInternalServerError)

	// A config.json that lost a disk (a volume dropped from a restored
	// child): the ids CH assigns again no longer match the saved state.
	for name, edit := range map[string]func(map[string]any){
		"dropped-volume": func(c map[string]any) {
			disks := c["disks"].([]any)
			for _, d := range disks {
				delete(d.(map[string]any), "id")
			}
			delete(c["vsock"].(map[string]any), "id")
			c["disks"] = disks[:2]
		},
		"renamed-id": func(c map[string]any) {
			c["disks"].([]any)[0].(map[string]any)["id"] = "os"
		},
	} {
		d := filepath.Join(dir, name)
		copySnapshot(t, snap, d, vmm.SnapshotConfigFile)
		var c map[string]any
		json.Unmarshal(data, &c)
		edit(c)
		out, _ := json.Marshal(c)
		os.WriteFile(filepath.Join(d, vmm.SnapshotConfigFile), out, 0o600)
		err := b.client.Restore(ctx, d)
		wantStatus(t, err, http.StatusInternalServerError)
		if !strings.Contains(err.Error(), "device ids") {
			t.Fatalf("%s: %v", name, err)
		}
	}
	if _, err := b.client.Info(ctx); err == nil {
		t.Fatal("a refused restore left a VM")
	}
	if err := b.client.Restore(ctx, snap); err != nil {
		t.Fatalf("restore of the snapshot as CH wrote it: %v", err)
	}
}

// TestSectorZeroAndImageType: CH v51+ refuses the guest's sector-0 writes
// on a disk whose raw type it probed; a given type lifts that, and a given
// type the probe contradicts fails the VM.
func TestSectorZeroAndImageType(t *testing.T) {
	dir := t.TempDir()
	ctx := ctxT(t)
	typed, untyped := makeDisk(t, dir, "typed.img"), makeDisk(t, dir, "untyped.img")
	vsock := filepath.Join(dir, "v.sock")
	for _, tc := range []struct {
		disk vmm.Disk
		want string
	}{
		{vmm.Disk{Path: typed, ImageType: vmm.ImageRaw}, agentproto.TOK},
		{vmm.Disk{Path: untyped}, "error"},
		{vmm.Disk{Path: untyped, ImageType: vmm.ImageUnknown}, "error"},
	} {
		p := startVMM(t, filepath.Join(dir, "api.sock"))
		if err := p.client.Create(ctx, vmm.Config{Payload: vmm.Payload{Kernel: "k"}, Disks: []vmm.Disk{tc.disk}, Vsock: &vmm.Vsock{Cid: 3, Socket: vsock}}); err != nil {
			t.Fatal(err)
		}
		if err := p.client.Boot(ctx); err != nil {
			t.Fatal(err)
		}
		if got := dialAgent(t, vsock).ask(t, agentproto.TFlush); !strings.HasPrefix(got, tc.want) {
			t.Fatalf("%+v: flush -> %q, want %s", tc.disk, got, tc.want)
		}
		// The host's client, as stop uses it, agrees.
		if err := vmm.GuestFlush(ctx, vsock, 0); (err == nil) != (tc.want == agentproto.TOK) {
			t.Fatalf("%+v: GuestFlush: %v", tc.disk, err)
		}
		p.client.ShutdownVMM(ctx)
		p.wait(t)
	}

	qcow := filepath.Join(dir, "q.img")
	os.WriteFile(qcow, append([]byte("QFI\xfb"), make([]byte, 4096)...), 0o600)
	p := startVMM(t, filepath.Join(dir, "api.sock"))
	err := p.client.Create(ctx, vmm.Config{Payload: vmm.Payload{Kernel: "k"}, Disks: []vmm.Disk{{Path: qcow, ImageType: vmm.ImageRaw}}})
	wantStatus(t, err, http.StatusInternalServerError)
	if !strings.Contains(err.Error(), "Qcow2 detected") {
		t.Fatalf("Raw given for a qcow2 image: %v", err)
	}
}

// lockOf is the OFD lock another process would conflict with on path.
func lockOf(t *testing.T, path string) int16 {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	lk := unix.Flock_t{Type: unix.F_WRLCK, Whence: 0}
	if err := unix.FcntlFlock(f.Fd(), unix.F_OFD_GETLK, &lk); err != nil {
		t.Fatal(err)
	}
	return lk.Type
}

// TestDiskLocks: CH v46+ holds a write lock on each read-write image and a
// read lock on each read-only one, so a second VM cannot open a disk a
// running VM holds read-write, even read-only.
func TestDiskLocks(t *testing.T) {
	dir := t.TempDir()
	ctx := ctxT(t)
	vol := makeDisk(t, dir, "vol.img")
	a := startVMM(t, filepath.Join(dir, "a.sock"))
	b := startVMM(t, filepath.Join(dir, "b.sock"))
	cfg := func(ro bool) vmm.Config {
		return vmm.Config{Payload: vmm.Payload{Kernel: "k"}, Disks: []vmm.Disk{{Path: vol, Readonly: ro, ImageType: vmm.ImageRaw}}}
	}
	if err := a.client.Create(ctx, cfg(false)); err != nil {
		t.Fatal(err)
	}
	if got := lockOf(t, vol); got != unix.F_WRLCK {
		t.Fatalf("read-write disk: lock type %d, want a write lock", got)
	}
	err := b.client.Create(ctx, cfg(true))
	wantStatus(t, err, http.StatusInternalServerError)
	if !strings.Contains(err.Error(), "locked") {
		t.Fatalf("read-only open of a disk held read-write: %v", err)
	}
	if err := a.client.Delete(ctx); err != nil {
		t.Fatal(err)
	}
	if got := lockOf(t, vol); got != unix.F_UNLCK {
		t.Fatalf("after vm.delete: lock type %d", got)
	}
	// Two readers share.
	if err := a.client.Create(ctx, cfg(true)); err != nil {
		t.Fatal(err)
	}
	if err := b.client.Create(ctx, cfg(true)); err != nil {
		t.Fatalf("second read-only VM: %v", err)
	}
	if got := lockOf(t, vol); got != unix.F_RDLCK {
		t.Fatalf("read-only disk: lock type %d, want a read lock", got)
	}
}

// TestSerialFile: serial mode File gets the guest's console output, the
// file created (or truncated) at vm.create as CH's File::create does.
func TestSerialFile(t *testing.T) {
	dir := t.TempDir()
	ctx := ctxT(t)
	log := filepath.Join(dir, "serial.log")
	os.WriteFile(log, []byte("previous run\n"), 0o600)
	p := startVMM(t, filepath.Join(dir, "api.sock"))
	if err := p.client.Create(ctx, vmm.Config{Payload: vmm.Payload{Kernel: "k", Cmdline: "console=ttyS0"}, Serial: &vmm.Console{Mode: vmm.ConsoleFile, File: log}}); err != nil {
		t.Fatal(err)
	}
	if err := p.client.Boot(ctx); err != nil {
		t.Fatal(err)
	}
	data, _ := os.ReadFile(log)
	if strings.Contains(string(data), "previous run") || !strings.Contains(string(data), "console=ttyS0") {
		t.Fatalf("serial log %q", data)
	}
}

// TestAPISocketLock: as CH v53+, the VMM locks <socket>.lock before it
// binds, refuses a second VMM on the same path, and leaves the file.
func TestAPISocketLock(t *testing.T) {
	dir := t.TempDir()
	ctx := ctxT(t)
	sock := filepath.Join(dir, "api.sock")
	p := startVMM(t, sock)
	if got := lockOf(t, sock+".lock"); got != unix.F_WRLCK {
		t.Fatalf("%s.lock: lock type %d, want a write lock", sock, got)
	}
	if held, err := vmm.APISocketLockHeld(sock + ".lock"); err != nil || !held {
		t.Fatalf("APISocketLockHeld while serving: %v, %v", held, err)
	}
	err := serve(ctx, sock, nil, nil)
	if err == nil || !strings.Contains(err.Error(), "in use") {
		t.Fatalf("second VMM on a locked socket: %v", err)
	}
	if _, err := p.client.Ping(ctx); err != nil {
		t.Fatalf("the refused second VMM disturbed the first: %v", err)
	}
	if err := p.client.ShutdownVMM(ctx); err != nil {
		t.Fatal(err)
	}
	p.wait(t)
	if _, err := os.Lstat(sock); !os.IsNotExist(err) {
		t.Fatalf("socket after exit: %v", err)
	}
	if fi, err := os.Lstat(sock + ".lock"); err != nil || !fi.Mode().IsRegular() {
		t.Fatalf("lock file after exit (CH leaves it): %v, %v", fi, err)
	}
	if got := lockOf(t, sock+".lock"); got != unix.F_UNLCK {
		t.Fatalf("lock still held after exit: %d", got)
	}
	if held, err := vmm.APISocketLockHeld(sock + ".lock"); err != nil || held {
		t.Fatalf("APISocketLockHeld after exit: %v, %v", held, err)
	}
	if _, err := vmm.APISocketLockHeld(filepath.Join(dir, "none.lock")); !os.IsNotExist(err) {
		t.Fatalf("missing lock file: %v", err)
	}
}

// TestDiskSerial: CH keeps a disk's serial in its configuration and, from
// v47, refuses one longer than a virtio-blk serial holds.
func TestDiskSerial(t *testing.T) {
	dir := t.TempDir()
	ctx := ctxT(t)
	img := makeDisk(t, dir, "d.img")
	p := startVMM(t, filepath.Join(dir, "api.sock"))
	err := p.client.Create(ctx, vmm.Config{Payload: vmm.Payload{Kernel: "k"}, Disks: []vmm.Disk{{Path: img, ImageType: vmm.ImageRaw, Serial: strings.Repeat("s", vmm.SerialMax+1)}}})
	wantStatus(t, err, http.StatusInternalServerError)
	if err == nil || !strings.Contains(err.Error(), "serial length (21)") {
		t.Fatalf("long serial: %v", err)
	}
	if err := p.client.Create(ctx, vmm.Config{Payload: vmm.Payload{Kernel: "k"}, Disks: []vmm.Disk{{Path: img, ImageType: vmm.ImageRaw, Serial: agentproto.SerialWorkspace}}}); err != nil {
		t.Fatal(err)
	}
	info, err := p.client.Info(ctx)
	if err != nil || len(info.Config.Disks) != 1 || info.Config.Disks[0].Serial != agentproto.SerialWorkspace {
		t.Fatalf("Info = %+v, %v", info, err)
	}
	if agentproto.SerialBytes != vmm.SerialMax {
		t.Fatalf("the protocol's serial bound %d is not CH's %d", agentproto.SerialBytes, vmm.SerialMax)
	}
	p.client.ShutdownVMM(ctx)
	p.wait(t)
}
