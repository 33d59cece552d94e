package main

import (
	"bytes"
	"context"
	"errors"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nexus-sandbox/nexus/agentproto"
	"github.com/nexus-sandbox/nexus/host/initramfs"
	"github.com/nexus-sandbox/nexus/internal/testutil"
)

// TestBootUnderQEMU boots a real Linux guest with nexus-agent as PID 1 of
// an initramfs built from the host's kernel modules, and drives it over
// virtio-serial: the agent finds the workspace disk by its serial, mounts
// it, runs a program, writes a file and answers a flush, after which a
// power cut (SIGKILL of QEMU) leaves the file on the disk and the
// filesystem needing no journal recovery. It needs QEMU and a kernel with
// modules (make setup-test installs them; NEXUS_REQUIRE_QEMU=1, as make
// test sets, fails rather than skips without them).
func TestBootUnderQEMU(t *testing.T) {
	g := testutil.RealGuest(t) // skips, or fails under NEXUS_REQUIRE_QEMU=1
	qemu, kernel, release := g.QEMU, g.Kernel, g.Release

	dir := t.TempDir()
	modDir := filepath.Join("/lib/modules", release)
	// A helper that orphans a process, for PID 1's reaping.
	orphanBin := filepath.Join(dir, "orphan")
	build := exec.Command("go", "build", "-o", orphanBin, "./testdata/orphan")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build orphan: %v %s", err, out)
	}
	initrd := filepath.Join(dir, "initrd.cpio.gz")
	if _, err := initramfs.Build(initramfs.Options{ModulesDir: modDir, Init: agentBin, Out: initrd,
		Wanted: initramfs.Wanted, Optional: initramfs.Optional}); err != nil {
		t.Fatal(err)
	}
	// The OS disk: an ext4 image holding a marker, the orphan helper in
	// /bin and a copy of the agent in /sbin, none of which the initramfs
	// has, and no /workspace, /data, /proc, /sys or /dev: PID 1 makes the
	// mount points in the (writable) root.
	osTree := filepath.Join(dir, "os")
	for _, d := range []string{"etc", "bin", "sbin"} {
		os.MkdirAll(filepath.Join(osTree, d), 0o755)
	}
	osMarker := "the image's own file\n"
	os.WriteFile(filepath.Join(osTree, "etc", "nexus-os-marker"), []byte(osMarker), 0o644)
	copyFile(t, orphanBin, filepath.Join(osTree, "bin", "orphan"))
	copyFile(t, agentBin, filepath.Join(osTree, "sbin", "nexus-agent"))
	osDisk := filepath.Join(dir, "os.ext4")
	os.WriteFile(osDisk, nil, 0o600)
	os.Truncate(osDisk, 64<<20)
	if out, err := exec.Command("mkfs.ext4", "-q", "-F", "-d", osTree, osDisk).CombinedOutput(); err != nil {
		t.Fatalf("mkfs: %v %s", err, out)
	}
	ws := filepath.Join(dir, "ws.ext4")
	if err := os.WriteFile(ws, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(ws, 64<<20); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("mkfs.ext4", "-q", "-F", ws).CombinedOutput(); err != nil {
		t.Fatalf("mkfs: %v %s", err, out)
	}

	// A volume with a file on it, attached read-only: mounted where the
	// command line says, and never frozen (it is not writable).
	seed := filepath.Join(dir, "seed")
	os.Mkdir(seed, 0o755)
	os.WriteFile(filepath.Join(seed, "hello"), []byte("from the volume\n"), 0o644)
	vol := filepath.Join(dir, "vol.ext4")
	os.WriteFile(vol, nil, 0o600)
	os.Truncate(vol, 16<<20)
	if out, err := exec.Command("mkfs.ext4", "-q", "-F", "-d", seed, vol).CombinedOutput(); err != nil {
		t.Fatalf("mkfs: %v %s", err, out)
	}
	volSerial := agentproto.DiskSerial(agentproto.SerialVolume, "data")

	vm := bootAgentGuest(t, qemu, kernel, initrd, dir, "nexus.mount="+volSerial+":/data",
		"-drive", "file="+osDisk+",if=none,id=os,format=raw",
		"-device", "virtio-blk-pci,drive=os,serial="+agentproto.SerialOS,
		"-drive", "file="+ws+",if=none,id=ws,format=raw",
		"-device", "virtio-blk-pci,drive=ws,serial="+agentproto.SerialWorkspace,
		"-drive", "file="+vol+",if=none,id=vol,format=raw,readonly=on",
		"-device", "virtio-blk-pci,drive=vol,serial="+volSerial)
	c, consoleTail, start := vm.c, vm.consoleTail, vm.start
	ctx, cancel := context.WithTimeout(context.Background(), testutil.Scale(60*time.Second))
	defer cancel()

	// exec runs in the OS disk's root: the agent's copy is only there.
	var stderr bytes.Buffer
	st, err := c.Exec(ctx, agentproto.Exec{Argv: []string{"/sbin/nexus-agent", "--no-such-flag"}, Stderr: &stderr})
	if err != nil || st.Code != 2 || !strings.Contains(stderr.String(), "no-such-flag") {
		t.Fatalf("exec in the guest's OS root: %+v %v %q\n%s", st, err, stderr.String(), consoleTail())
	}
	// On a terminal (devpts, which PID 1 mounts and the OS root sees) the
	// same error arrives on stdout, through the pty.
	var onTTY bytes.Buffer
	st, err = c.Exec(ctx, agentproto.Exec{Argv: []string{"/sbin/nexus-agent", "--no-such-flag"}, Stdout: &onTTY, TTY: true})
	if err != nil || st.Code != 2 || !strings.Contains(onTTY.String(), "no-such-flag") {
		t.Fatalf("exec on a terminal in the guest: %+v %v %q", st, err, onTTY.String())
	}
	// An orphan is reparented to the agent as PID 1 and reaped when it
	// exits, never left a zombie. Its bare name is found on PATH, in the
	// OS root's /bin.
	var pidOut bytes.Buffer
	if st, err := c.Exec(ctx, agentproto.Exec{Argv: []string{"orphan"}, Stdout: &pidOut}); err != nil || st.Code != 0 {
		t.Fatalf("orphan: %+v %v", st, err)
	}
	statPath := "/proc/" + strings.TrimSpace(pidOut.String()) + "/stat"
	reapBy := time.Now().Add(testutil.Scale(15 * time.Second))
	for reaped := false; !reaped; {
		var stat bytes.Buffer
		_, err := c.ReadFile(ctx, statPath, &stat)
		var ae *agentproto.AgentError
		switch {
		case errors.As(err, &ae):
			reaped = true // gone from /proc: reaped
		case err != nil:
			t.Fatal(err)
		case time.Now().After(reapBy):
			t.Fatalf("the orphan is still there: %s", stat.String())
		default:
			time.Sleep(200 * time.Millisecond)
		}
	}
	marker := []byte("written by the guest, then flushed\n")
	if _, err := c.WriteFile(ctx, "/workspace/marker", 0o600, bytes.NewReader(marker)); err != nil {
		t.Fatal(err)
	}
	var back bytes.Buffer
	if _, err := c.ReadFile(ctx, "/proc/cmdline", &back); err != nil || !strings.Contains(back.String(), "console=ttyS0") {
		t.Fatalf("guest /proc/cmdline: %q %v", back.String(), err)
	}
	back.Reset()
	if _, err := c.ReadFile(ctx, "/data/hello", &back); err != nil || back.String() != "from the volume\n" {
		t.Fatalf("volume file: %q %v", back.String(), err)
	}
	var ae *agentproto.AgentError
	if _, err := c.WriteFile(ctx, "/data/nope", 0, strings.NewReader("x")); !errors.As(err, &ae) {
		t.Fatalf("write to the read-only volume: %v", err)
	}
	// File paths are the OS root's too, and it is writable.
	back.Reset()
	if _, err := c.ReadFile(ctx, "/etc/nexus-os-marker", &back); err != nil || back.String() != osMarker {
		t.Fatalf("the OS root's marker: %q %v", back.String(), err)
	}
	osWritten := []byte("written into the OS root\n")
	if _, err := c.WriteFile(ctx, "/etc/written", 0o644, bytes.NewReader(osWritten)); err != nil {
		t.Fatal(err)
	}
	t0 := time.Now()
	paths, err := c.Flush(ctx, time.Minute)
	if err != nil {
		t.Fatalf("flush: %v\n%s", err, consoleTail())
	}
	t.Logf("flush answered in %.2f s: %v", time.Since(t0).Seconds(), paths)
	// The OS root (the agent's /) and the workspace, found by their
	// serials; the read-only volume is left out.
	if !slices.Equal(paths, []string{"/", "/workspace"}) {
		t.Fatalf("flush froze %v, want the OS root and the workspace", paths)
	}
	// A power cut after the acknowledgement.
	vm.kill()
	out, err := exec.Command("debugfs", "-R", "cat /marker", ws).Output()
	if err != nil || !bytes.Equal(out, marker) {
		t.Fatalf("the disk after the power cut holds %q (%v)", out, err)
	}
	if out, err := exec.Command("debugfs", "-R", "cat /etc/written", osDisk).Output(); err != nil || !bytes.Equal(out, osWritten) {
		t.Fatalf("the OS disk after the power cut holds %q (%v)", out, err)
	}
	for _, disk := range []string{ws, osDisk} {
		hdr, err := exec.Command("dumpe2fs", "-h", disk).Output()
		if err != nil {
			t.Fatal(err)
		}
		for _, line := range strings.Split(string(hdr), "\n") {
			if strings.HasPrefix(line, "Filesystem features:") && strings.Contains(line, "needs_recovery") {
				t.Fatalf("%s: a frozen filesystem still needs journal recovery: %s", filepath.Base(disk), line)
			}
		}
	}
	t.Logf("whole run %.1f s", time.Since(start).Seconds())
}

func copyFile(t *testing.T, from, to string) {
	t.Helper()
	b, err := os.ReadFile(from)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(to, b, 0o755); err != nil {
		t.Fatal(err)
	}
}

// agentGuest is a QEMU guest booted with nexus-agent as PID 1, and a
// session with it.
type agentGuest struct {
	c           *agentproto.Client
	start       time.Time
	consoleTail func() string
	kill        func() // SIGKILL QEMU (a power cut) and wait for it
}

// bootAgentGuest boots kernel and initrd under QEMU with the agent's
// virtio-serial port, the kernel command line extended by cmdline and
// the drives (QEMU arguments) given, and waits for the agent to answer.
// QEMU is killed when the test ends.
func bootAgentGuest(t *testing.T, qemu, kernel, initrd, dir, cmdline string, drives ...string) *agentGuest {
	t.Helper()
	sock := filepath.Join(dir, "agent.sock")
	console := filepath.Join(dir, "console.log")
	// Software emulation unless asked: this kind of host has a /dev/kvm
	// (kvm_pvm, nested) that opens and creates VMs, yet a stock kernel
	// under it prints nothing and never boots.
	accel := "tcg"
	if a := os.Getenv("NEXUS_QEMU_ACCEL"); a != "" {
		accel = a
	}
	// no_timer_check: under a loaded host the kernel's IO-APIC timer check
	// can fail ("IO-APIC + timer doesn't work!") and panic a healthy guest.
	args := append([]string{"-machine", "q35", "-accel", accel, "-m", "256", "-smp", "1",
		"-nodefaults", "-no-reboot", "-display", "none", "-serial", "file:" + console,
		"-kernel", kernel, "-initrd", initrd, "-append", "console=ttyS0 panic=-1 no_timer_check " + cmdline}, drives...)
	cmd := exec.Command(qemu, append(args,
		"-device", "virtio-serial-pci",
		"-chardev", "socket,id=agent,path="+sock+",server=on,wait=off",
		"-device", "virtserialport,chardev=agent,name="+agentPort)...)
	// Read by consoleTail while QEMU still writes it.
	var qerr testutil.Buffer
	cmd.Stderr = &qerr
	start := time.Now()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	// exited is closed when QEMU is gone; waitErr says how.
	exited := make(chan struct{})
	var waitErr error
	go func() { waitErr = cmd.Wait(); close(exited) }()
	kill := func() {
		cmd.Process.Kill()
		<-exited
	}
	t.Cleanup(kill)
	consoleTail := func() string {
		b, err := os.ReadFile(console)
		if err != nil {
			return err.Error() + "\n" + qerr.String()
		}
		if len(b) > 3000 {
			b = b[len(b)-3000:]
		}
		return string(b) + qerr.String()
	}

	// Boot under software emulation takes 4-40 s on a loaded machine;
	// the bound, scaled like every wait, is for a guest that never boots.
	bootLimit := testutil.Scale(150 * time.Second)
	for {
		select {
		case <-exited:
			t.Fatalf("QEMU exited before the agent answered: %v\n%s", waitErr, consoleTail())
		default:
		}
		if time.Since(start) > bootLimit {
			t.Fatalf("no agent answer within %v (accel %s)\n%s", bootLimit, accel, consoleTail())
		}
		conn, err := net.Dial("unix", sock)
		if err != nil {
			time.Sleep(200 * time.Millisecond)
			continue
		}
		try := agentproto.NewClient(conn)
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		_, name, err := try.Hello(ctx)
		cancel()
		if err != nil {
			try.Close()
			continue
		}
		t.Logf("agent %q answered %.1f s after QEMU started", name, time.Since(start).Seconds())
		t.Cleanup(func() { try.Close() })
		return &agentGuest{c: try, start: start, consoleTail: consoleTail, kill: kill}
	}
}

// TestHandOverPID1UnderQEMU: with nexus.init=/sbin/init on the command
// line, PID 1 passes to the image's init (a static program that records
// its pid and reaps) in the OS disk's root, while an agent started before
// the switch keeps answering from that root: it reads the init's marker
// and /proc/1/cmdline, runs as init's child, writes to the workspace, and
// freezes the OS root and the workspace.
func TestHandOverPID1UnderQEMU(t *testing.T) {
	g := testutil.RealGuest(t) // skips, or fails under NEXUS_REQUIRE_QEMU=1
	dir := t.TempDir()
	osTree := filepath.Join(dir, "os")
	for _, d := range []string{"etc", "sbin"} {
		os.MkdirAll(filepath.Join(osTree, d), 0o755)
	}
	build := exec.Command("go", "build", "-o", filepath.Join(osTree, "sbin", "init"), "./testdata/imageinit")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build imageinit: %v %s", err, out)
	}
	initrd := filepath.Join(dir, "initrd.cpio.gz")
	if _, err := initramfs.Build(initramfs.Options{ModulesDir: filepath.Join("/lib/modules", g.Release), Init: agentBin, Out: initrd,
		Wanted: initramfs.Wanted, Optional: initramfs.Optional}); err != nil {
		t.Fatal(err)
	}
	disk := func(name string, size int64, tree string) string {
		p := filepath.Join(dir, name)
		os.WriteFile(p, nil, 0o600)
		os.Truncate(p, size)
		args := []string{"-q", "-F", p}
		if tree != "" {
			args = append([]string{"-d", tree}, args...)
		}
		if out, err := exec.Command("mkfs.ext4", args...).CombinedOutput(); err != nil {
			t.Fatalf("mkfs: %v %s", err, out)
		}
		return p
	}
	osDisk, ws := disk("os.ext4", 32<<20, osTree), disk("ws.ext4", 16<<20, "")
	vm := bootAgentGuest(t, g.QEMU, g.Kernel, initrd, dir, "nexus.init=/sbin/init",
		"-drive", "file="+osDisk+",if=none,id=os,format=raw",
		"-device", "virtio-blk-pci,drive=os,serial="+agentproto.SerialOS,
		"-drive", "file="+ws+",if=none,id=ws,format=raw",
		"-device", "virtio-blk-pci,drive=ws,serial="+agentproto.SerialWorkspace)
	c := vm.c
	ctx, cancel := context.WithTimeout(context.Background(), testutil.Scale(60*time.Second))
	defer cancel()
	read := func(path string) (string, error) {
		var b bytes.Buffer
		_, err := c.ReadFile(ctx, path, &b)
		return b.String(), err
	}

	// The agent may answer before init has run: the switch follows its
	// start, and under software emulation on a loaded machine init can
	// take tens of seconds more. init publishes its marker by rename, so a
	// read finds it whole or not at all.
	var marker string
	var markerErr error
	for by := time.Now().Add(testutil.Scale(30 * time.Second)); ; time.Sleep(200 * time.Millisecond) {
		if marker, markerErr = read("/etc/init-ran"); markerErr == nil || time.Now().After(by) {
			break
		}
	}
	if marker != "pid 1\n" {
		t.Fatalf("the image's init wrote %q (%v), want it run as pid 1\n%s", marker, markerErr, vm.consoleTail())
	}
	if cl, err := read("/proc/1/cmdline"); err != nil || cl != "/sbin/init\x00" {
		t.Fatalf("PID 1 is %q (%v), want /sbin/init", cl, err)
	}
	// The agent answering is not PID 1 but init's child.
	stat, err := read("/proc/self/stat")
	if err != nil {
		t.Fatal(err)
	}
	f := strings.Fields(stat[strings.LastIndex(stat, ")")+1:])
	if pid := strings.Fields(stat)[0]; pid == "1" || len(f) < 2 || f[1] != "1" {
		t.Fatalf("the agent's /proc/self/stat %q: want a pid other than 1 whose parent is 1", stat)
	}
	if _, err := c.WriteFile(ctx, "/workspace/after-handover", 0o600, strings.NewReader("x")); err != nil {
		t.Fatal(err)
	}
	paths, err := c.Flush(ctx, time.Minute)
	if err != nil || !slices.Equal(paths, []string{"/", "/workspace"}) {
		t.Fatalf("flush after the hand-over froze %v (%v), want the OS root and the workspace\n%s", paths, err, vm.consoleTail())
	}
	t.Logf("whole run %.1f s", time.Since(vm.start).Seconds())
}
