package qemu

import (
	"bufio"
	"context"
	"errors"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nexus-sandbox/nexus/host/unixsock"
	"github.com/nexus-sandbox/nexus/host/vmm"
	"github.com/nexus-sandbox/nexus/internal/testutil"
)

// TestArgs: QEMU's command line carries what vm.create asked for, with
// commas in paths doubled (QEMU's option syntax), each disk's serial and
// read-only flag, the console appended to its file, and refuses what the
// adapter cannot honour.
func TestArgs(t *testing.T) {
	c := vmm.Config{
		Payload: vmm.Payload{Kernel: "/k", Initramfs: "/i", Cmdline: "console=ttyS0 quiet"},
		Disks: []vmm.Disk{{Path: "/d/a,b.raw", ImageType: vmm.ImageRaw, Serial: "nexus-os"},
			{Path: "/d/v.raw", Readonly: true, Serial: "nexus-vol-data"}},
		Memory: vmm.Memory{Size: 256 << 20}, Cpus: vmm.Cpus{BootVcpus: 2},
		Serial: &vmm.Console{Mode: vmm.ConsoleFile, File: "/l/c.log"},
	}
	a, err := Args(c, "tcg", "/p/q", "/p/a")
	if err != nil {
		t.Fatal(err)
	}
	line := strings.Join(a, " ")
	for _, want := range []string{
		"-accel tcg", "-m 256", "-smp 2", "-kernel /k", "-initrd /i", "-append console=ttyS0 quiet", "-no-reboot",
		"file=/d/a,,b.raw,format=raw,if=none,id=disk0 -device virtio-blk-pci,drive=disk0,serial=nexus-os",
		"file=/d/v.raw,format=raw,if=none,id=disk1,readonly=on -device virtio-blk-pci,drive=disk1,serial=nexus-vol-data",
		"file,id=console,append=on,path=/l/c.log -serial chardev:console",
		"name=" + AgentPort,
	} {
		if !strings.Contains(line, want) {
			t.Errorf("args lack %q:\n%s", want, line)
		}
	}
	if slices.Contains(a, "host") {
		t.Errorf("-cpu host under tcg: %s", line)
	}
	if a, _ := Args(c, "kvm", "/p/q", "/p/a"); !strings.Contains(strings.Join(a, " "), "-cpu host") {
		t.Errorf("kvm without -cpu host: %v", a)
	}
	bad := c
	bad.Disks = []vmm.Disk{{Path: "/d/x.qcow2", ImageType: vmm.ImageQcow2}}
	if _, err := Args(bad, "tcg", "/q", "/a"); err == nil {
		t.Error("a qcow2 disk was passed as raw")
	}
	bad = c
	bad.Serial = &vmm.Console{Mode: vmm.ConsoleTty}
	if _, err := Args(bad, "tcg", "/q", "/a"); err == nil {
		t.Error("a tty serial was accepted")
	}
}

// adapter serves the API on a socket under a fresh directory.
func adapter(t *testing.T) (dir, api string, done chan error) {
	t.Helper()
	return adapterWith(t, "tcg")
}

func adapterWith(t *testing.T, accel string) (dir, api string, done chan error) {
	t.Helper()
	dir = testutil.ShortRoot(t)
	api = filepath.Join(dir, "api.sock")
	ctx, cancel := context.WithCancel(context.Background())
	done = make(chan error, 1)
	log, _ := os.Create(filepath.Join(dir, "vmm.log"))
	go func() { done <- Serve(ctx, api, Options{Accel: accel, Log: log}) }()
	t.Cleanup(func() {
		cancel()
		<-done
		if t.Failed() {
			b, _ := os.ReadFile(filepath.Join(dir, "vmm.log"))
			t.Logf("adapter log:\n%s", b)
		}
	})
	testutil.WaitUntil(t, 10*time.Second, "serving the API", func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		v, err := vmm.NewClient(api).Ping(ctx)
		return err == nil && v == Version
	})
	return dir, api, done
}

// TestAdapterDrivesQEMU: the CH client drives a real QEMU through the
// adapter: create, boot (the kernel's log reaches the console file),
// info Running, pause is QEMU paused (QMP query-status), resume, the
// vsock socket refuses CONNECT while no agent in the guest answers,
// shutdown, vmm.shutdown, and no QEMU is left.
func TestAdapterDrivesQEMU(t *testing.T) {
	g := testutil.RealGuest(t)
	dir, api, done := adapter(t)
	ctx, cancel := context.WithTimeout(context.Background(), testutil.Scale(2*time.Minute))
	defer cancel()
	c := vmm.NewClient(api)
	disk := filepath.Join(dir, "os.raw")
	os.WriteFile(disk, make([]byte, 1<<20), 0o600)
	console, vsock := filepath.Join(dir, "console.log"), filepath.Join(dir, "vsock.sock")
	cfg := vmm.Config{
		// No initramfs: the kernel boots, finds no root and waits.
		Payload: vmm.Payload{Kernel: g.Kernel, Cmdline: "console=ttyS0"},
		Disks:   []vmm.Disk{{Path: disk, ImageType: vmm.ImageRaw, Serial: "nexus-os"}},
		Memory:  vmm.Memory{Size: 256 << 20}, Cpus: vmm.Cpus{BootVcpus: 1},
		Vsock:  &vmm.Vsock{Cid: 3, Socket: vsock},
		Serial: &vmm.Console{Mode: vmm.ConsoleFile, File: console},
	}
	if err := c.Boot(ctx); err == nil {
		t.Fatal("vm.boot before vm.create succeeded")
	}
	must := func(what string, err error) {
		t.Helper()
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	}
	must("create", c.Create(ctx, cfg))
	// What a SIGKILLed adapter on this socket would have left.
	stale := PrivateDir(api)
	os.MkdirAll(stale, 0o700)
	os.WriteFile(filepath.Join(stale, "left-by-a-killed-adapter"), nil, 0o600)
	must("boot", c.Boot(ctx))
	if _, err := os.Stat(filepath.Join(stale, "left-by-a-killed-adapter")); !os.IsNotExist(err) {
		t.Errorf("boot kept a killed adapter's leftovers: %v", err)
	}
	state := func() vmm.State {
		t.Helper()
		info, err := c.Info(ctx)
		must("info", err)
		return info.State
	}
	if s := state(); s != vmm.StateRunning {
		t.Fatalf("after boot: %s", s)
	}
	testutil.WaitUntil(t, 60*time.Second, "the kernel logging to the console file", func() bool {
		b, _ := os.ReadFile(console)
		return strings.Contains(string(b), "Linux version")
	})
	must("pause", c.Pause(ctx))
	if s := state(); s != vmm.StatePaused {
		t.Fatalf("after pause: %s", s)
	}
	must("resume", c.Resume(ctx))
	if s := state(); s != vmm.StateRunning {
		t.Fatalf("after resume: %s", s)
	}
	conn, err := unixsock.Dial(ctx, vsock)
	must("dial vsock", err)
	// The relay closes a CONNECT no agent answers once connectWait ends.
	conn.SetDeadline(time.Now().Add(connectWait + testutil.Scale(10*time.Second)))
	conn.Write([]byte("CONNECT 1024\n"))
	if line, err := bufio.NewReader(conn).ReadString('\n'); err == nil {
		t.Fatalf("CONNECT answered %q with no agent port open in the guest", line)
	} else if errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatal("CONNECT neither answered nor closed")
	}
	conn.Close()
	must("shutdown", c.Shutdown(ctx))
	if s := state(); s != vmm.StateShutdown {
		t.Fatalf("after shutdown: %s", s)
	}
	must("vmm.shutdown", c.ShutdownVMM(ctx))
	select {
	case err := <-done:
		done <- err
		must("serve", err)
	case <-time.After(testutil.Scale(10 * time.Second)):
		t.Fatal("adapter still serving after vmm.shutdown")
	}
	if left := testutil.ProcessesUnder(dir); len(left) > 0 {
		t.Fatalf("left running: %+v", left)
	}
	if _, err := os.Stat(stale); !os.IsNotExist(err) {
		t.Fatalf("the private directory outlived the VM: %v", err)
	}
}

// TestAdapterEndsWithItsGuest: a guest that dies (here a kernel that
// panics without a root and reboots, which -no-reboot turns into QEMU's
// exit) ends the adapter, naming the exit, so nexus sees the VMM gone.
func TestAdapterEndsWithItsGuest(t *testing.T) {
	g := testutil.RealGuest(t)
	dir, api, done := adapter(t)
	ctx, cancel := context.WithTimeout(context.Background(), testutil.Scale(2*time.Minute))
	defer cancel()
	c := vmm.NewClient(api)
	if err := c.Create(ctx, vmm.Config{Payload: vmm.Payload{Kernel: g.Kernel, Cmdline: "console=ttyS0 panic=-1"},
		Memory: vmm.Memory{Size: 256 << 20}, Cpus: vmm.Cpus{BootVcpus: 1},
		Serial: &vmm.Console{Mode: vmm.ConsoleFile, File: filepath.Join(dir, "console.log")}}); err != nil {
		t.Fatal(err)
	}
	if err := c.Boot(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		done <- err
		if err == nil || !strings.Contains(err.Error(), "on its own") {
			t.Fatalf("adapter ended with %v, want QEMU's exit named", err)
		}
	case <-time.After(testutil.Scale(90 * time.Second)):
		t.Fatal("adapter still serving after its guest panicked")
	}
	if b, _ := os.ReadFile(filepath.Join(dir, "console.log")); !strings.Contains(string(b), "Kernel panic") {
		t.Fatalf("console log lacks the panic:\n%s", b)
	}
}

// TestAdapterSnapshotAndRestore: vm.snapshot of a paused VM writes CH's
// three files (memory-ranges holding QEMU's migration stream), refuses a
// running VM as CH does, and the VM resumes after it; vm.restore in a
// fresh adapter brings the VM back Paused, and vm.resume runs it.
func TestAdapterSnapshotAndRestore(t *testing.T) {
	g := testutil.RealGuest(t)
	dir, api, _ := adapter(t)
	ctx, cancel := context.WithTimeout(context.Background(), testutil.Scale(3*time.Minute))
	defer cancel()
	c := vmm.NewClient(api)
	disk := filepath.Join(dir, "os.raw")
	os.WriteFile(disk, make([]byte, 1<<20), 0o600)
	console := filepath.Join(dir, "console.log")
	cfg := vmm.Config{Payload: vmm.Payload{Kernel: g.Kernel, Cmdline: "console=ttyS0"},
		Disks:  []vmm.Disk{{Path: disk, ImageType: vmm.ImageRaw, Serial: "nexus-os"}},
		Memory: vmm.Memory{Size: 256 << 20}, Cpus: vmm.Cpus{BootVcpus: 1},
		Serial: &vmm.Console{Mode: vmm.ConsoleFile, File: console}}
	must := func(what string, err error) {
		t.Helper()
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	}
	must("create", c.Create(ctx, cfg))
	must("boot", c.Boot(ctx))
	testutil.WaitUntil(t, 60*time.Second, "the kernel logging", func() bool {
		b, _ := os.ReadFile(console)
		return strings.Contains(string(b), "Linux version")
	})
	snap := filepath.Join(dir, "snap")
	os.Mkdir(snap, 0o700)
	if err := c.Snapshot(ctx, snap); err == nil {
		t.Fatal("snapshot of a running VM succeeded; CH wants it paused")
	}
	must("pause", c.Pause(ctx))
	must("snapshot", c.Snapshot(ctx, snap))
	for _, f := range []string{vmm.SnapshotConfigFile, vmm.SnapshotStateFile, vmm.SnapshotMemoryFile} {
		fi, err := os.Stat(filepath.Join(snap, f))
		if err != nil || fi.Size() == 0 {
			t.Fatalf("snapshot file %s: %v %v", f, fi, err)
		}
	}
	if err := c.Snapshot(ctx, snap); err == nil {
		t.Fatal("a second snapshot into the same directory overwrote the first")
	}
	// The stream restores only on the accelerator it was taken on.
	if b, _ := os.ReadFile(filepath.Join(snap, vmm.SnapshotStateFile)); !strings.Contains(string(b), `"accel": "tcg"`) {
		t.Errorf("state.json does not name the accelerator:\n%s", b)
	}
	must("resume after snapshot", c.Resume(ctx))
	if info, err := c.Info(ctx); err != nil || info.State != vmm.StateRunning {
		t.Fatalf("after snapshot and resume: %+v %v", info.State, err)
	}
	must("shutdown", c.Shutdown(ctx)) // releases the disk's lock for the restore

	// An adapter told to use KVM still restores a TCG stream on TCG: the
	// CPU model is in the stream (and KVM may be missing or broken here).
	_, api2, _ := adapterWith(t, "kvm")
	c2 := vmm.NewClient(api2)
	must("restore", c2.Restore(ctx, snap))
	if info, err := c2.Info(ctx); err != nil || info.State != vmm.StatePaused || len(info.Config.Disks) != 1 {
		t.Fatalf("after restore: %+v %v", info, err)
	}
	must("resume", c2.Resume(ctx))
	if info, err := c2.Info(ctx); err != nil || info.State != vmm.StateRunning {
		t.Fatalf("after restore and resume: %+v %v", info.State, err)
	}
}

// TestAdapterAutoAccelBoots: with no accelerator named, the adapter picks
// KVM when /dev/kvm answers, and falls back to TCG, saying so, when QEMU
// dies on KVM before its monitor answers (a nested /dev/kvm, as on this
// project's CI machine, fails the first vCPU): the guest boots either way.
func TestAdapterAutoAccelBoots(t *testing.T) {
	g := testutil.RealGuest(t)
	dir, api, _ := adapterWith(t, "")
	ctx, cancel := context.WithTimeout(context.Background(), testutil.Scale(2*time.Minute))
	defer cancel()
	c := vmm.NewClient(api)
	console := filepath.Join(dir, "console.log")
	if err := c.Create(ctx, vmm.Config{Payload: vmm.Payload{Kernel: g.Kernel, Cmdline: "console=ttyS0"},
		Memory: vmm.Memory{Size: 256 << 20}, Cpus: vmm.Cpus{BootVcpus: 1},
		Serial: &vmm.Console{Mode: vmm.ConsoleFile, File: console}}); err != nil {
		t.Fatal(err)
	}
	if err := c.Boot(ctx); err != nil {
		t.Fatalf("boot with the accelerator left to the adapter: %v", err)
	}
	testutil.WaitUntil(t, 60*time.Second, "the kernel logging", func() bool {
		b, _ := os.ReadFile(console)
		return strings.Contains(string(b), "Linux version")
	})
	log, _ := os.ReadFile(filepath.Join(dir, "vmm.log"))
	t.Logf("KVM answers: %v; adapter log: %s", KVMAnswers(), regexp.MustCompile(`\(accel \w+\)|falling back to tcg`).FindAllString(string(log), -1))
}
