package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nexus-sandbox/nexus/host/qemu"
	"github.com/nexus-sandbox/nexus/host/vmm"
	"github.com/nexus-sandbox/nexus/internal/testutil"
)

// BenchmarkQEMUBootVsHand: boot-to-ready of a qemu sandbox (`nexus create`
// until nexus-init says ready on the console: the create saga, the
// adapter, QEMU, the guest) against qemu-system-x86_64 started by hand on
// the same kernel, initramfs and disks (same command line, minus the
// adapter), interleaved in each op. ratio = nexus / hand; target ≤ 1.2x.
func BenchmarkQEMUBootVsHand(b *testing.B) {
	g := testutil.RealGuest(b)
	root := shortRoot(b)
	initrd := guestInitramfs(b, root, g)
	env := []string{"NEXUS_KERNEL_PATH=" + g.Kernel, "NEXUS_INITRAMFS_PATH=" + initrd, "NEXUS_QEMU_ACCEL=tcg"}
	image := makeImage(b)
	dir := b.TempDir()
	osDisk, ws := filepath.Join(dir, "os.raw"), filepath.Join(dir, "ws.ext4")
	if out, err := exec.Command("cp", "--sparse=always", image, osDisk).CombinedOutput(); err != nil {
		b.Fatalf("%v %s", err, out)
	}
	if out, err := exec.Command("sh", "-c", "truncate -s 256M \"$1\" && mkfs.ext4 -q -F \"$1\"", "sh", ws).CombinedOutput(); err != nil {
		b.Fatalf("%v %s", err, out)
	}
	ready := func(console string, limit time.Duration) bool {
		deadline := time.Now().Add(limit)
		for time.Now().Before(deadline) {
			if data, _ := os.ReadFile(console); strings.Contains(string(data), "nexus-init: ready") {
				return true
			}
			time.Sleep(10 * time.Millisecond)
		}
		return false
	}
	var viaNexus, byHand time.Duration
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		start := time.Now()
		r := nexusEnv(b, root, env, "--driver", "qemu", "create", "--image", image)
		if r.code != 0 {
			b.Fatalf("create: %s", r.stderr)
		}
		id := strings.Fields(r.stdout)[0]
		if !ready(filepath.Join(root, "logs", id+".console.log"), testutil.Scale(90*time.Second)) {
			b.Fatal("sandbox never ready")
		}
		viaNexus += time.Since(start)
		b.StopTimer()
		nexusEnv(b, root, env, "--driver", "qemu", "rm", "-f", id)
		b.StartTimer()

		console := filepath.Join(dir, "hand.console.log")
		os.Remove(console)
		qmp, agent := filepath.Join(dir, "qmp.sock"), filepath.Join(dir, "agent.sock")
		args, err := qemu.Args(vmm.Config{
			Payload: vmm.Payload{Kernel: g.Kernel, Initramfs: initrd, Cmdline: "console=ttyS0 root=/dev/vda rw"},
			Disks: []vmm.Disk{{Path: osDisk, ImageType: vmm.ImageRaw, Serial: "nexus-os"},
				{Path: ws, ImageType: vmm.ImageRaw, Serial: "nexus-workspace"}},
			Memory: vmm.Memory{Size: 512 << 20}, Cpus: vmm.Cpus{BootVcpus: 1},
			Serial: &vmm.Console{Mode: vmm.ConsoleFile, File: console},
		}, "tcg", qmp, agent)
		if err != nil {
			b.Fatal(err)
		}
		start = time.Now()
		cmd := exec.Command(g.QEMU, args...)
		cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
		if err := cmd.Start(); err != nil {
			b.Fatal(err)
		}
		ok := ready(console, testutil.Scale(90*time.Second))
		byHand += time.Since(start)
		b.StopTimer()
		cmd.Process.Kill()
		cmd.Wait()
		if !ok {
			b.Fatal("QEMU by hand never ready")
		}
		b.StartTimer()
	}
	b.ReportMetric(float64(viaNexus)/float64(byHand), "ratio")
	b.ReportMetric(viaNexus.Seconds()/float64(b.N), "nexus-s/boot")
	b.ReportMetric(byHand.Seconds()/float64(b.N), "hand-s/boot")
}
