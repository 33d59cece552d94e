package main

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nexus-sandbox/nexus/agentproto"
	"github.com/nexus-sandbox/nexus/host/qemu"
	"github.com/nexus-sandbox/nexus/host/vmm"
	"github.com/nexus-sandbox/nexus/internal/testutil"
	"github.com/nexus-sandbox/nexus/layout"
	"github.com/nexus-sandbox/nexus/lifecycle"
)

// BenchmarkQEMUBootVsHand: boot to agent-ready of a qemu sandbox against
// qemu-system-x86_64 started by hand on the same kernel, initramfs (the
// one `nexus guest initramfs` builds, nexus-agent as /init) and disks,
// interleaved in each op. ratio = nexus / hand; target ≤ 1.2x.
//
// "Ready" is the first agent ping answered, because that is the first
// moment anything can use the guest: `nexus create` returns once the VM
// is booting (lifecycle's boot saga waits on the VMM's API, not on the
// guest), so the nexus side is create returning, then a session through
// the sandbox's vsock socket (CONNECT 1024, the adapter's relay and its
// reset handshake, hello) and a ping, retried until one answers, as
// `nexus exec` opens its session. The hand side is QEMU with the
// adapter's own command line (host/qemu Args), whose virtio-serial
// chardev socket the benchmark speaks the agent protocol on itself:
// reset, the echo, hello, ping.
//
// The first op of each side is run untimed: it starts the daemon, fills
// the image cache and the page cache, none of which a later boot pays.
func BenchmarkQEMUBootVsHand(b *testing.B) {
	g := testutil.RealGuest(b)
	root := shortRoot(b)
	initrd := agentInitramfs(b, g)
	env := []string{"NEXUS_KERNEL_PATH=" + g.Kernel, "NEXUS_INITRAMFS_PATH=" + initrd, "NEXUS_QEMU_ACCEL=tcg"}
	image := makeImage(b)
	dir := b.TempDir()
	osDisk, ws := filepath.Join(dir, "os.raw"), filepath.Join(dir, "ws.ext4")
	if out, err := exec.Command("cp", "--sparse=always", image, osDisk).CombinedOutput(); err != nil {
		b.Fatalf("%v %s", err, out)
	}
	// The size of a sandbox's overlay when none is configured.
	size := fmt.Sprintf("%dM", lifecycle.DefaultOverlayMiB)
	if out, err := exec.Command("sh", "-c", "truncate -s \"$2\" \"$1\" && mkfs.ext4 -q -F \"$1\"", "sh", ws, size).CombinedOutput(); err != nil {
		b.Fatalf("%v %s", err, out)
	}
	limit := testutil.Scale(120 * time.Second)

	// viaNexus returns the time to ready and, of it, create's share.
	viaNexus := func() (total, create time.Duration) {
		start := time.Now()
		r := nexusEnv(b, root, env, "--driver", "qemu", "create", "--image", image)
		if r.code != 0 {
			b.Fatalf("create: %s", r.stderr)
		}
		create = time.Since(start)
		id := strings.Fields(r.stdout)[0]
		err := pingUntil(limit, func(ctx context.Context) (*agentproto.Client, error) {
			return vmm.DialAgent(ctx, layout.Root(root).VsockSocket(id))
		})
		total = time.Since(start)
		b.StopTimer()
		if err != nil {
			console, _ := os.ReadFile(filepath.Join(root, "logs", id+".console.log"))
			b.Fatalf("sandbox never ready: %v\n%s", err, console)
		}
		mustOK(b, nexusEnv(b, root, env, "--driver", "qemu", "rm", "-f", id), "rm")
		b.StartTimer()
		return total, create
	}
	byHand := func() time.Duration {
		console := filepath.Join(dir, "hand.console.log")
		os.Remove(console)
		qmp, agent := filepath.Join(dir, "qmp.sock"), filepath.Join(dir, "agent.sock")
		os.Remove(qmp)
		os.Remove(agent)
		args, err := qemu.Args(vmm.Config{
			Payload: vmm.Payload{Kernel: g.Kernel, Initramfs: initrd, Cmdline: lifecycle.DefaultCmdline},
			Disks: []vmm.Disk{{Path: osDisk, ImageType: vmm.ImageRaw, Serial: agentproto.SerialOS},
				{Path: ws, ImageType: vmm.ImageRaw, Serial: agentproto.SerialWorkspace}},
			Memory: vmm.Memory{Size: 512 << 20}, Cpus: vmm.Cpus{BootVcpus: 1, MaxVcpus: 1},
			Serial: &vmm.Console{Mode: vmm.ConsoleFile, File: console},
		}, "tcg", qmp, agent)
		if err != nil {
			b.Fatal(err)
		}
		start := time.Now()
		cmd := exec.Command(g.QEMU, args...)
		cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
		if err := cmd.Start(); err != nil {
			b.Fatal(err)
		}
		err = pingUntil(limit, func(ctx context.Context) (*agentproto.Client, error) { return serialAgent(ctx, agent) })
		took := time.Since(start)
		b.StopTimer()
		cmd.Process.Kill()
		cmd.Wait()
		if err != nil {
			data, _ := os.ReadFile(console)
			b.Fatalf("QEMU by hand never ready: %v\n%s", err, data)
		}
		b.StartTimer()
		return took
	}

	b.StopTimer()
	wn, wc := viaNexus()
	b.Logf("untimed first op: nexus %.2fs (create %.2fs), hand %.2fs", wn.Seconds(), wc.Seconds(), byHand().Seconds())
	b.Logf("load average before: %s", loadavg())
	var nexusSum, createSum, handSum time.Duration
	b.StartTimer()
	for i := 0; i < b.N; i++ {
		total, create := viaNexus()
		hand := byHand()
		b.Logf("op %d: nexus %.2fs (create %.2fs, then agent %.2fs), hand %.2fs", i, total.Seconds(), create.Seconds(), (total - create).Seconds(), hand.Seconds())
		nexusSum, createSum, handSum = nexusSum+total, createSum+create, handSum+hand
	}
	b.StopTimer()
	b.Logf("load average after: %s", loadavg())
	n := float64(b.N)
	b.ReportMetric(float64(nexusSum)/float64(handSum), "ratio")
	b.ReportMetric(nexusSum.Seconds()/n, "nexus-s/boot")
	b.ReportMetric(createSum.Seconds()/n, "create-s/boot")
	b.ReportMetric(handSum.Seconds()/n, "hand-s/boot")
}

// pingUntil opens sessions with dial until one answers a ping, or limit
// passes. A guest still booting refuses (the relay closes after 5 s
// without the agent's echo, a serial dial times out): open another at
// once, since the time to the first answer is what is measured.
func pingUntil(limit time.Duration, dial func(context.Context) (*agentproto.Client, error)) error {
	deadline := time.Now().Add(limit)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), min(10*time.Second, time.Until(deadline)))
		c, err := dial(ctx)
		if err == nil {
			err = c.Ping(ctx)
			c.Close()
		}
		cancel()
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return err
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// serialAgent opens an agent session on QEMU's end of the virtio-serial
// agent port (a unix socket QEMU serves) as nexus's adapter does, minus
// the adapter: a reset with a fresh nonce, every frame dropped until its
// echo, then hello (docs/guest-agent.md, Transports). The socket appears
// once QEMU has set its devices up: until then, dial again.
func serialAgent(ctx context.Context, path string) (*agentproto.Client, error) {
	var conn net.Conn
	for {
		var err error
		var d net.Dialer
		if conn, err = d.DialContext(ctx, "unix", path); err == nil {
			break
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("agent port: %w", err)
		case <-time.After(2 * time.Millisecond):
		}
	}
	stop := context.AfterFunc(ctx, func() { conn.SetDeadline(time.Unix(1, 0)) })
	defer stop()
	var nb [8]byte
	rand.Read(nb[:])
	nonce := binary.BigEndian.Uint64(nb[:]) | 1
	if err := agentproto.Write(conn, &agentproto.Message{Type: agentproto.TReset, ID: 1, Nonce: nonce}); err != nil {
		conn.Close()
		return nil, err
	}
	for {
		m, err := agentproto.Read(conn)
		if err != nil && !errors.Is(err, agentproto.ErrUnknownType) {
			conn.Close()
			return nil, fmt.Errorf("waiting for the reset's echo: %w", err)
		}
		if err == nil && m.Type == agentproto.TReset && m.Nonce == nonce {
			break
		}
	}
	c := agentproto.NewClient(conn)
	if _, _, err := c.Hello(ctx); err != nil {
		c.Close()
		return nil, err
	}
	return c, nil
}

func loadavg() string {
	b, _ := os.ReadFile("/proc/loadavg")
	return strings.TrimSpace(string(b))
}
