package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/nexus-sandbox/nexus/agentproto"
	"github.com/nexus-sandbox/nexus/host/initramfs"
	"github.com/nexus-sandbox/nexus/host/vmm"
	"github.com/nexus-sandbox/nexus/internal/testutil"
	"github.com/nexus-sandbox/nexus/layout"
)

// benchGuest is a running sandbox the agent benchmarks drive, on either
// driver. Commands run with /workspace as their working directory and
// name files relative to it: the process driver's stand-in guest maps the
// paths the protocol carries, not those in a command's arguments.
type benchGuest struct {
	root, id string
	env      []string // driver and boot assets, for nexusEnv
	settle   time.Duration
	trueArgv []string
	catArgv  func(name string) []string // name to stdout
	sinkArgv func(name string) []string // stdin to name, fsynced
}

func (g *benchGuest) nexus(b *testing.B, args ...string) result {
	b.Helper()
	return nexusEnv(b, g.root, g.env, args...)
}

// session runs f on one agent session opened through the sandbox's vsock
// socket, as nexus exec and cp open theirs. The dial is not timed. A
// virtio-serial port carries one session at a time, so no session is held
// across a CLI call; after one ends, the guest agent reopens its port
// (settle), which a dial must not race.
func (g *benchGuest) session(b *testing.B, f func(c *agentproto.Client)) {
	b.Helper()
	b.StopTimer()
	var c *agentproto.Client
	deadline := time.Now().Add(testutil.Scale(30 * time.Second))
	for {
		ctx, cancel := context.WithTimeout(context.Background(), testutil.Scale(10*time.Second))
		var err error
		c, err = vmm.DialAgent(ctx, layout.Root(g.root).VsockSocket(g.id))
		cancel()
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			b.Fatal(err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	b.StartTimer()
	f(c)
	b.StopTimer()
	c.Close()
	time.Sleep(g.settle)
	b.StartTimer()
}

// processGuest is a sandbox on the process driver (always runnable): its
// guest is the stand-in serving the protocol on a unix socket.
func processGuest(b *testing.B) *benchGuest {
	root := shortRoot(b)
	g := &benchGuest{root: root, env: []string{"NEXUS_DRIVER=process"},
		trueArgv: []string{"true"},
		catArgv:  func(n string) []string { return []string{"cat", n} },
		sinkArgv: func(n string) []string { return []string{"sh", "-c", `cat > "$1" && sync "$1"`, "sh", n} },
	}
	r := g.nexus(b, "create", "--image", makeImage(b))
	if r.code != 0 {
		b.Fatalf("create: %s", r.stderr)
	}
	g.id = strings.Fields(r.stdout)[0]
	b.Cleanup(func() { g.nexus(b, "rm", "-f", g.id) })
	return g
}

// qemuGuest is a sandbox on the qemu driver, booted under software
// emulation with nexus-agent as /init and benchbin's true, cat and sink
// beside it (the initramfs holds nothing else); it skips without QEMU and
// a kernel. Its agent channel is the adapter's virtio-serial relay.
func qemuGuest(b *testing.B) *benchGuest {
	guest := testutil.RealGuest(b)
	root := shortRoot(b)
	_, file, _, _ := runtime.Caller(0)
	src := filepath.Join(filepath.Dir(file), "..", "..")
	dir := b.TempDir()
	agent, helper := filepath.Join(dir, "nexus-agent"), filepath.Join(dir, "benchbin")
	for out, pkg := range map[string]string{agent: "./cmd/nexus-agent", helper: "./cmd/nexus/testdata/benchbin"} {
		build := exec.Command("go", "build", "-o", out, pkg)
		build.Dir = src
		build.Env = append(os.Environ(), "CGO_ENABLED=0")
		if o, err := build.CombinedOutput(); err != nil {
			b.Fatalf("build %s: %v\n%s", pkg, err, o)
		}
	}
	initrd := filepath.Join(dir, "initrd.gz")
	if _, err := initramfs.Build(initramfs.Options{ModulesDir: filepath.Join("/lib/modules", guest.Release), Init: agent, Out: initrd,
		Wanted: initramfs.Wanted, Optional: initramfs.Optional,
		Programs: map[string]string{"bench/true": helper, "bench/cat": helper, "bench/sink": helper}}); err != nil {
		b.Fatal(err)
	}
	// Room for a 100 MiB file, its replacement's temporary and the
	// baseline's copy.
	os.WriteFile(filepath.Join(root, "config.toml"), []byte("[vm]\noverlay_disk_mib = 512\n"), 0o600)
	g := &benchGuest{root: root,
		settle:   500 * time.Millisecond,
		env:      []string{"NEXUS_DRIVER=qemu", "NEXUS_KERNEL_PATH=" + guest.Kernel, "NEXUS_INITRAMFS_PATH=" + initrd, "NEXUS_QEMU_ACCEL=tcg"},
		trueArgv: []string{"/bench/true"},
		catArgv:  func(n string) []string { return []string{"/bench/cat", n} },
		sinkArgv: func(n string) []string { return []string{"/bench/sink", n} },
	}
	r := g.nexus(b, "create", "--image", makeImage(b))
	if r.code != 0 {
		b.Fatalf("create: %s", r.stderr)
	}
	g.id = strings.Fields(r.stdout)[0]
	b.Cleanup(func() { g.nexus(b, "rm", "-f", g.id) })
	console := filepath.Join(root, "logs", g.id+".console.log")
	deadline := time.Now().Add(testutil.Scale(120 * time.Second))
	for {
		data, _ := os.ReadFile(console)
		if strings.Contains(string(data), "serving on") {
			break
		}
		if time.Now().After(deadline) {
			b.Fatalf("the guest agent never served:\n%s", data)
		}
		time.Sleep(50 * time.Millisecond)
	}
	b.Logf("guest: kernel %s", guest.Kernel)
	return g
}

// BenchmarkAgentExec: the round trip of running `true` in the guest.
// Each op, back to back: `nexus exec ID -- true` end to end (a CLI
// process, the daemon, a session, the exec) against `sh -c true` run
// locally; and on one open session, an exec of true against a ping over
// the same channel. Ratios: e2e/local, exec/ping.
func BenchmarkAgentExec(b *testing.B) {
	b.Run("process", func(b *testing.B) { benchAgentExec(b, processGuest(b)) })
	b.Run("qemu", func(b *testing.B) { benchAgentExec(b, qemuGuest(b)) })
}

func benchAgentExec(b *testing.B, g *benchGuest) {
	ctx := context.Background()
	cli := append([]string{"exec", g.id, "-w", "/workspace", "--"}, g.trueArgv...)
	// Warm: the daemon started, the binary in the page cache.
	if r := g.nexus(b, cli...); r.code != 0 {
		b.Fatalf("exec true: exit %d: %s", r.code, r.stderr)
	}
	time.Sleep(g.settle)
	var e2e, local, sexec, ping time.Duration
	timed := func(sum *time.Duration, f func()) {
		t0 := time.Now()
		f()
		*sum += time.Since(t0)
	}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		timed(&e2e, func() {
			if r := g.nexus(b, cli...); r.code != 0 {
				b.Fatalf("exec true: exit %d: %s", r.code, r.stderr)
			}
		})
		b.StopTimer()
		time.Sleep(g.settle)
		b.StartTimer()
		timed(&local, func() {
			if err := exec.Command("sh", "-c", "true").Run(); err != nil {
				b.Fatal(err)
			}
		})
		g.session(b, func(c *agentproto.Client) {
			timed(&sexec, func() {
				if st, err := c.Exec(ctx, agentproto.Exec{Argv: g.trueArgv, Cwd: "/workspace"}); err != nil || st.Code != 0 {
					b.Fatalf("session exec: %+v %v", st, err)
				}
			})
			timed(&ping, func() {
				if err := c.Ping(ctx); err != nil {
					b.Fatal(err)
				}
			})
		})
	}
	n := float64(b.N)
	b.ReportMetric(e2e.Seconds()*1e3/n, "e2e-ms")
	b.ReportMetric(local.Seconds()*1e3/n, "local-sh-ms")
	b.ReportMetric(sexec.Seconds()*1e3/n, "session-exec-ms")
	b.ReportMetric(ping.Seconds()*1e3/n, "ping-ms")
	b.ReportMetric(float64(e2e)/float64(local), "e2e/local")
	b.ReportMetric(float64(sexec)/float64(ping), "exec/ping")
}

// cpBytes is what the cp benchmarks move each way.
const cpBytes = 100 << 20

// BenchmarkAgentCp: 100 MiB into and out of the guest. Each op, back to
// back: `nexus cp` in and out end to end; the same through one open
// session (WriteFile; ReadFile into a file that is then fsynced, as cp
// publishes it); and the baseline, cat over the same channel: on the
// process driver a `cat` at each end of a unix socket, on qemu a raw cat
// through the agent's exec (stdin into `sink`, `cat` to stdout) over the
// virtio-serial relay. Every destination is fsynced before its time
// stops, as cp's is. Ratios: session/cat and e2e/cat, each way.
func BenchmarkAgentCp(b *testing.B) {
	b.Run("process", func(b *testing.B) { benchAgentCp(b, processGuest(b), true) })
	b.Run("qemu", func(b *testing.B) { benchAgentCp(b, qemuGuest(b), false) })
}

func benchAgentCp(b *testing.B, g *benchGuest, rawSocket bool) {
	dir := b.TempDir()
	src := filepath.Join(dir, "src")
	data := make([]byte, cpBytes)
	rand.Read(data)
	if err := os.WriteFile(src, data, 0o644); err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	var viaCat string // the raw baseline's file, on the host for the stand-in guest
	if rawSocket {
		viaCat = guestFile(b, g, "viacat")
	}
	var e2eIn, e2eOut, sIn, sOut, catIn, catOut time.Duration
	timed := func(sum *time.Duration, f func()) {
		t0 := time.Now()
		f()
		*sum += time.Since(t0)
	}
	out := filepath.Join(dir, "out")
	check := func(what string) {
		b.StopTimer()
		got, err := os.ReadFile(out)
		if err != nil || !bytes.Equal(got, data) {
			b.Fatalf("%s: %d bytes back, %v; want the %d sent", what, len(got), err, len(data))
		}
		os.Remove(out)
		b.StartTimer()
	}
	// The file cp writes is the one cat reads back, and the other way
	// round, so each direction moves the same bytes through the same
	// guest filesystem.
	b.SetBytes(2 * cpBytes)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		timed(&e2eIn, func() {
			if r := g.nexus(b, "cp", src, g.id+":/workspace/viacp"); r.code != 0 {
				b.Fatalf("cp in: %s", r.stderr)
			}
		})
		b.StopTimer()
		time.Sleep(g.settle)
		b.StartTimer()
		timed(&e2eOut, func() {
			if r := g.nexus(b, "cp", g.id+":/workspace/viacp", out); r.code != 0 {
				b.Fatalf("cp out: %s", r.stderr)
			}
		})
		b.StopTimer()
		time.Sleep(g.settle)
		b.StartTimer()
		check("cp")
		g.session(b, func(c *agentproto.Client) {
			timed(&sIn, func() {
				f, _ := os.Open(src)
				defer f.Close()
				if _, err := c.WriteFile(ctx, "/workspace/viasession", 0o644, f); err != nil {
					b.Fatal(err)
				}
			})
			timed(&sOut, func() {
				f, _ := os.Create(out)
				defer f.Close()
				if _, err := c.ReadFile(ctx, "/workspace/viasession", f); err != nil {
					b.Fatal(err)
				}
				if err := f.Sync(); err != nil {
					b.Fatal(err)
				}
			})
		})
		check("session")
		if rawSocket {
			timed(&catIn, func() { catOverSocket(b, src, viaCat) })
			timed(&catOut, func() { catOverSocket(b, viaCat, out) })
		} else {
			g.session(b, func(c *agentproto.Client) {
				timed(&catIn, func() {
					f, _ := os.Open(src)
					defer f.Close()
					var stderr bytes.Buffer
					if st, err := c.Exec(ctx, agentproto.Exec{Argv: g.sinkArgv("viacat"), Cwd: "/workspace", Stdin: f, Stderr: &stderr}); err != nil || st.Code != 0 {
						b.Fatalf("sink: %+v %v %s", st, err, stderr.String())
					}
				})
				timed(&catOut, func() {
					f, _ := os.Create(out)
					defer f.Close()
					var stderr bytes.Buffer
					if st, err := c.Exec(ctx, agentproto.Exec{Argv: g.catArgv("viacat"), Cwd: "/workspace", Stdout: f, Stderr: &stderr}); err != nil || st.Code != 0 {
						b.Fatalf("cat: %+v %v %s", st, err, stderr.String())
					}
					if err := f.Sync(); err != nil {
						b.Fatal(err)
					}
				})
			})
		}
		check("cat")
	}
	b.StopTimer()
	mbps := func(d time.Duration) float64 { return float64(cpBytes) * float64(b.N) / d.Seconds() / (1 << 20) }
	b.ReportMetric(mbps(catIn), "cat-in-MiB/s")
	b.ReportMetric(mbps(catOut), "cat-out-MiB/s")
	b.ReportMetric(float64(sIn)/float64(catIn), "session-in/cat")
	b.ReportMetric(float64(sOut)/float64(catOut), "session-out/cat")
	b.ReportMetric(float64(e2eIn)/float64(catIn), "cp-in/cat")
	b.ReportMetric(float64(e2eOut)/float64(catOut), "cp-out/cat")
}

// guestFile is where the stand-in guest keeps /workspace/name: under its
// guest root, found by the agent's own answer (a pwd in /workspace).
func guestFile(b *testing.B, g *benchGuest, name string) string {
	b.Helper()
	var out bytes.Buffer
	g.session(b, func(c *agentproto.Client) {
		if st, err := c.Exec(context.Background(), agentproto.Exec{Argv: []string{"pwd", "-P"}, Cwd: "/workspace", Stdout: &out}); err != nil || st.Code != 0 {
			b.Fatalf("pwd: %+v %v", st, err)
		}
	})
	return filepath.Join(strings.TrimSpace(out.String()), name)
}

// catOverSocket copies from to to with a real `cat` at each end of a unix
// socket (the process driver's agent channel is one), then fsyncs to.
func catOverSocket(b *testing.B, from, to string) {
	b.Helper()
	l, err := net.Listen("unix", filepath.Join(b.TempDir(), "cat.sock"))
	if err != nil {
		b.Fatal(err)
	}
	defer l.Close()
	dial, err := net.Dial("unix", l.Addr().String())
	if err != nil {
		b.Fatal(err)
	}
	acc, err := l.Accept()
	if err != nil {
		b.Fatal(err)
	}
	sendEnd, _ := dial.(*net.UnixConn).File()
	recvEnd, _ := acc.(*net.UnixConn).File()
	dial.Close()
	acc.Close()
	dst, err := os.Create(to)
	if err != nil {
		b.Fatal(err)
	}
	defer dst.Close()
	send := exec.Command("cat", from)
	send.Stdout = sendEnd
	recv := exec.Command("cat")
	recv.Stdin, recv.Stdout = recvEnd, dst
	if err := recv.Start(); err != nil {
		b.Fatal(err)
	}
	recvEnd.Close()
	if err := send.Run(); err != nil {
		b.Fatal(err)
	}
	sendEnd.Close()
	if err := recv.Wait(); err != nil {
		b.Fatal(err)
	}
	if err := dst.Sync(); err != nil {
		b.Fatal(err)
	}
}
