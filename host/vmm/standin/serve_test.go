package standin

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nexus-sandbox/nexus/agentproto"
	"github.com/nexus-sandbox/nexus/host/vmm"
	"github.com/nexus-sandbox/nexus/internal/testutil"
)

// The test binary doubles as the process driver's VMM: run with envSocket
// set, it serves that socket until vmm.shutdown or SIGTERM, so tests exercise
// a real separate process as the host will.
const envSocket = "NEXUS_VMM_TEST_SERVE_SOCKET"

func TestMain(m *testing.M) {
	if sock := os.Getenv(envSocket); sock != "" {
		os.Exit(childMain(sock))
	}
	os.Exit(m.Run())
}

func childMain(sock string) int {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	ready := os.NewFile(3, "ready")
	err := serve(ctx, sock, os.Stderr, func() {
		ready.Write([]byte("ready\n"))
		ready.Close()
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, "serve:", err)
		return 1
	}
	return 0
}

type vmmProc struct {
	cmd    *exec.Cmd
	sock   string
	client *vmm.Client
	stderr *bytes.Buffer
	exited chan struct{}
	err    error // Wait's result, once exited is closed
}

// startVMM runs the stand-in VMM as a child on sock and returns once it
// accepts connections (it says so on a pipe; nothing is polled).
func startVMM(t *testing.T, sock string) *vmmProc {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	p := &vmmProc{sock: sock, client: vmm.NewClient(sock), stderr: new(bytes.Buffer), exited: make(chan struct{})}
	p.cmd = exec.Command(exe, "-test.run=^$")
	// The race runtime otherwise sleeps a second at exit before reporting.
	p.cmd.Env = append(os.Environ(), envSocket+"="+sock, "GORACE="+strings.TrimSpace(os.Getenv("GORACE")+" atexit_sleep_ms=0"))
	p.cmd.ExtraFiles = []*os.File{w}
	p.cmd.Stderr = p.stderr
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	w.Close()
	go func() {
		p.err = p.cmd.Wait()
		close(p.exited)
	}()
	t.Cleanup(func() {
		p.cmd.Process.Kill()
		<-p.exited
		if t.Failed() || os.Getenv("VMM_DEBUG") != "" {
			t.Logf("VMM stderr:\n%s", p.stderr)
		}
	})
	line, err := bufio.NewReader(r).ReadString('\n')
	r.Close()
	if line != "ready\n" {
		<-p.exited
		t.Fatalf("VMM did not start: %q, %v; exit %v; stderr:\n%s", line, err, p.err, p.stderr)
	}
	return p
}

func (p *vmmProc) wait(t *testing.T) error {
	t.Helper()
	select {
	case <-p.exited:
		return p.err
	case <-time.After(testutil.Scale(10 * time.Second)):
		t.Fatal("VMM did not exit")
		return nil
	}
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func makeDisk(t *testing.T, dir, name string) string {
	t.Helper()
	path := filepath.Join(dir, name)
	if err := os.WriteFile(path, make([]byte, 1<<16), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// openFiles maps each file pid holds open to its open flags (from fdinfo).
func openFiles(t *testing.T, pid int) map[string]int {
	t.Helper()
	dir := "/proc/" + strconv.Itoa(pid) + "/fd"
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	files := map[string]int{}
	for _, e := range ents {
		target, err := os.Readlink(filepath.Join(dir, e.Name()))
		if err != nil {
			continue // closed meanwhile
		}
		info, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/fdinfo/" + e.Name())
		if err != nil {
			continue
		}
		for _, l := range strings.Split(string(info), "\n") {
			if v, ok := strings.CutPrefix(l, "flags:"); ok {
				flags, _ := strconv.ParseInt(strings.TrimSpace(v), 8, 64)
				files[target] = int(flags)
			}
		}
	}
	return files
}

func wantStatus(t *testing.T, err error, status int) {
	t.Helper()
	var ae *vmm.APIError
	if !errors.As(err, &ae) || ae.Status != status {
		t.Fatalf("got %v, want HTTP %d", err, status)
	}
	if vmm.IsDead(err) {
		t.Fatalf("IsDead(%v) on an answering VMM", err)
	}
	if strings.Contains(err.Error(), "\n") {
		t.Fatalf("error spans lines: %q", err)
	}
}

// wantRaw sends a call the client would never send (a wrong method, a body
// of the wrong shape) and wants the VMM to answer it with status.
func wantRaw(t *testing.T, sock, method, op string, body any, status int) {
	t.Helper()
	data, err := json.Marshal(body)
	if err != nil {
		t.Fatal(err)
	}
	hc := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return new(net.Dialer).DialContext(ctx, "unix", sock)
		},
	}}
	req, err := http.NewRequest(method, "http://localhost"+vmm.APIRoot+op, bytes.NewReader(data))
	if err != nil {
		t.Fatal(err)
	}
	resp, err := hc.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, op, err)
	}
	defer resp.Body.Close()
	answer, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != status {
		t.Fatalf("%s %s: HTTP %d %s, want %d", method, op, resp.StatusCode, answer, status)
	}
}

// agentConn is a raw session with the VMM's stand-in agent: the CONNECT
// handshake and hello done, then one frame at a time, so a test can watch
// silence (a paused guest) that the client would hide behind a context.
type agentConn struct {
	c    net.Conn
	next uint32
}

func dialAgent(t *testing.T, path string) *agentConn {
	t.Helper()
	c, err := net.Dial("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := c.Write([]byte("CONNECT 1024\n")); err != nil {
		t.Fatal(err)
	}
	line, err := vmm.ReadHandshakeLine(c)
	if err != nil || !strings.HasPrefix(line, "OK ") {
		t.Fatalf("CONNECT -> %q, %v", line, err)
	}
	a := &agentConn{c: c}
	if got := a.ask(t, agentproto.THello); got != agentproto.THello {
		t.Fatalf("hello -> %q", got)
	}
	return a
}

func (a *agentConn) send(t *testing.T, typ string) {
	t.Helper()
	a.next++
	m := &agentproto.Message{Type: typ, ID: a.next}
	if typ == agentproto.THello {
		m.Version = agentproto.Version
	}
	if typ == agentproto.TExec {
		m.Argv = []string{"true"}
	}
	a.c.SetDeadline(time.Now().Add(10 * time.Second))
	if err := agentproto.Write(a.c, m); err != nil {
		t.Fatal(err)
	}
}

// recv reads one answer: its type, or "error: <reason>".
func (a *agentConn) recv() (string, error) {
	m, err := agentproto.Read(a.c)
	if err != nil {
		return "", err
	}
	if m.Type == agentproto.TError {
		return "error: " + m.Error, nil
	}
	return m.Type, nil
}

func (a *agentConn) ask(t *testing.T, typ string) string {
	t.Helper()
	a.send(t, typ)
	got, err := a.recv()
	if err != nil {
		t.Fatalf("%s: %v", typ, err)
	}
	return got
}

func TestLifecycle(t *testing.T) {
	dir := t.TempDir()
	ctx := ctxT(t)
	sock := filepath.Join(dir, "api.sock")
	vsock := filepath.Join(dir, "vsock.sock")
	p := startVMM(t, sock)
	c := p.client

	fi, err := os.Lstat(sock)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Type() != os.ModeSocket || fi.Mode().Perm() != 0o600 {
		t.Fatalf("API socket mode %v", fi.Mode())
	}
	if v, err := c.Ping(ctx); err != nil || v != Version {
		t.Fatalf("Ping = %q, %v", v, err)
	}

	// Wrong state before any VM exists: CH answers VmNotCreated and
	// VmMissingConfig 404 (vm.info, vm.boot), VmNotRunning 500.
	wantStatus(t, c.Boot(ctx), http.StatusNotFound)
	_, err = c.Info(ctx)
	wantStatus(t, err, http.StatusNotFound)
	wantStatus(t, c.Pause(ctx), http.StatusInternalServerError)

	rw := makeDisk(t, dir, "rootfs.img")
	ro := makeDisk(t, dir, "base.img")
	cfg := vmm.Config{
		Payload: vmm.Payload{Kernel: "/boot/vmlinux", Cmdline: "console=hvc0"},
		Disks:   []vmm.Disk{{Path: rw}, {Path: ro, Readonly: true}},
		Memory:  vmm.Memory{Size: 256 << 20},
		Cpus:    vmm.Cpus{BootVcpus: 2, MaxVcpus: 2},
		Vsock:   &vmm.Vsock{Cid: 3, Socket: vsock},
	}
	if err := c.Create(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	wantStatus(t, c.Create(ctx, cfg), http.StatusInternalServerError)
	info, err := c.Info(ctx)
	if err != nil || info.State != vmm.StateCreated {
		t.Fatalf("Info = %+v, %v", info, err)
	}
	// Disks are held from create on: writable ones O_RDWR, readonly O_RDONLY.
	files := openFiles(t, p.cmd.Process.Pid)
	if f, ok := files[rw]; !ok || f&syscall.O_ACCMODE != syscall.O_RDWR {
		t.Fatalf("rw disk: held=%v flags %o", ok, f)
	}
	if f, ok := files[ro]; !ok || f&syscall.O_ACCMODE != syscall.O_RDONLY {
		t.Fatalf("ro disk: held=%v flags %o", ok, f)
	}
	wantStatus(t, c.Resume(ctx), http.StatusInternalServerError)
	if _, err := os.Lstat(vsock); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("vsock socket before boot: %v", err)
	}

	if err := c.Boot(ctx); err != nil {
		t.Fatal(err)
	}
	wantStatus(t, c.Boot(ctx), http.StatusInternalServerError)
	info, err = c.Info(ctx)
	if err != nil || info.State != vmm.StateRunning {
		t.Fatalf("Info = %+v, %v", info, err)
	}
	// vm.info shows what CH filled in: device ids from one counter, disks
	// before vsock, and the probed image type.
	want := cfg
	want.Disks = []vmm.Disk{{Path: rw, ImageType: vmm.ImageRaw, ID: "_disk0"}, {Path: ro, Readonly: true, ImageType: vmm.ImageRaw, ID: "_disk1"}}
	want.Vsock = &vmm.Vsock{Cid: 3, Socket: vsock, ID: "_vsock2"}
	if fmt.Sprint(info.Config.Payload, info.Config.Disks, info.Config.Memory, info.Config.Cpus, *info.Config.Vsock) !=
		fmt.Sprint(want.Payload, want.Disks, want.Memory, want.Cpus, *want.Vsock) {
		t.Fatalf("Info config %+v, want %+v", info.Config, want)
	}

	fi, err = os.Lstat(vsock)
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("vsock socket: %v, %v", fi, err)
	}
	ag := dialAgent(t, vsock)
	if got := ag.ask(t, agentproto.TPing); got != agentproto.TOK {
		t.Fatalf("ping -> %q", got)
	}
	if err := os.WriteFile(rw, []byte("guest data"), 0o600); err != nil {
		t.Fatal(err)
	}
	// The disks were sent without image_type: CH v51+ refuses the guest's
	// sector-0 writes, so the flush (a superblock commit) fails.
	if got := ag.ask(t, agentproto.TFlush); !strings.Contains(got, "sector 0") {
		t.Fatalf("flush on an untyped raw disk -> %q", got)
	}
	// The stand-in guest runs commands for real, in its guest root: a
	// file written by one exec is read back through the agent.
	cl, err := vmm.DialAgent(ctx, vsock)
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	st, err := cl.Exec(ctx, agentproto.Exec{Argv: []string{"/bin/sh", "-c", "echo guest > /dev/stdout; echo made > f; exit 3"}, Cwd: "/workspace", Stdout: &out})
	if err != nil || st.Code != 3 || out.String() != "guest\n" {
		t.Fatalf("exec: %+v %v %q", st, err, out.String())
	}
	var back bytes.Buffer
	if _, err := cl.ReadFile(ctx, "/workspace/f", &back); err != nil || back.String() != "made\n" {
		t.Fatalf("read back what exec wrote: %v %q", err, back.String())
	}
	cl.Close()

	// Snapshot needs a paused VM, as on CH, and an existing directory.
	snap := filepath.Join(dir, "snap", "one")
	wantStatus(t, c.Snapshot(ctx, snap), http.StatusInternalServerError)
	if err := os.MkdirAll(snap, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := c.Pause(ctx); err != nil {
		t.Fatal(err)
	}
	wantStatus(t, c.Pause(ctx), http.StatusInternalServerError)
	if info, err := c.Info(ctx); err != nil || info.State != vmm.StatePaused {
		t.Fatalf("Info = %+v, %v", info, err)
	}
	// A paused guest answers nothing. Silence has no event to wait for, so
	// this one check needs a deadline.
	ag.send(t, agentproto.TPing)
	ag.c.SetDeadline(time.Now().Add(200 * time.Millisecond))
	if _, err := ag.recv(); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("paused agent answered: %v", err)
	}
	if err := c.Snapshot(ctx, snap); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"config.json", "state.json", "memory-ranges"} {
		fi, err := os.Stat(filepath.Join(snap, name))
		if err != nil || fi.Mode().Perm() != 0o600 || fi.Size() == 0 {
			t.Fatalf("%s: %v, %v", name, fi, err)
		}
	}
	// CH creates the files exclusively: a second snapshot into the same
	// directory fails.
	wantStatus(t, c.Snapshot(ctx, snap), http.StatusInternalServerError)
	state, _ := os.ReadFile(filepath.Join(snap, "state.json"))
	for _, want := range []string{`"state":"Paused"`, `"taken_at"`, `"_disk0"`, `"_disk1"`, `"_vsock2"`, `"memory_ranges":[{"gpa":0,"length":268435456}]`} {
		if !strings.Contains(string(state), want) {
			t.Fatalf("state.json lacks %s: %s", want, state)
		}
	}
	if fi, _ := os.Stat(filepath.Join(snap, "memory-ranges")); fi.Size() != 256<<20 {
		t.Fatalf("memory-ranges is %d bytes, want the guest's 256 MiB", fi.Size())
	}
	if err := c.Resume(ctx); err != nil {
		t.Fatal(err)
	}
	// The ping sent while paused is answered on resume.
	ag.c.SetDeadline(time.Now().Add(10 * time.Second))
	if got, err := ag.recv(); err != nil || got != agentproto.TOK {
		t.Fatalf("after resume: %q, %v", got, err)
	}

	if err := c.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	if info, err := c.Info(ctx); err != nil || info.State != vmm.StateShutdown {
		t.Fatalf("Info = %+v, %v", info, err)
	}
	files = openFiles(t, p.cmd.Process.Pid)
	if _, ok := files[rw]; ok {
		t.Fatal("rw disk still held after vm.shutdown")
	}
	if _, ok := files[ro]; ok {
		t.Fatal("ro disk still held after vm.shutdown")
	}
	if _, err := os.Lstat(vsock); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("vsock socket after vm.shutdown: %v", err)
	}
	// The agent's connection died with the VM.
	ag.c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := ag.recv(); err != io.EOF {
		t.Fatalf("agent connection after shutdown: %v", err)
	}

	// CH can boot a shut-down VM again.
	if err := c.Boot(ctx); err != nil {
		t.Fatal(err)
	}
	if got := dialAgent(t, vsock).ask(t, agentproto.TPing); got != agentproto.TOK {
		t.Fatalf("ping after reboot -> %q", got)
	}

	if err := c.ShutdownVMM(ctx); err != nil {
		t.Fatal(err)
	}
	if err := p.wait(t); err != nil {
		t.Fatalf("VMM exit: %v", err)
	}
	for _, path := range []string{sock, vsock} {
		if _, err := os.Lstat(path); !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("%s after vmm.shutdown: %v", path, err)
		}
	}
	if _, err := c.Ping(ctx); !vmm.IsDead(err) {
		t.Fatalf("Ping after exit: %v, want dead", err)
	}
}

func TestRestore(t *testing.T) {
	dir := t.TempDir()
	ctx := ctxT(t)
	disk := makeDisk(t, dir, "rootfs.img")
	vsock := filepath.Join(dir, "v.sock")
	cfg := vmm.Config{
		Payload: vmm.Payload{Kernel: "/boot/vmlinux"},
		Disks:   []vmm.Disk{{Path: disk}},
		Vsock:   &vmm.Vsock{Cid: 7, Socket: vsock},
	}
	snap := filepath.Join(dir, "snap")
	os.Mkdir(snap, 0o700)

	a := startVMM(t, filepath.Join(dir, "a.sock"))
	for _, step := range []func(context.Context) error{
		func(ctx context.Context) error { return a.client.Create(ctx, cfg) },
		a.client.Boot, a.client.Pause,
		func(ctx context.Context) error { return a.client.Snapshot(ctx, snap) },
		a.client.ShutdownVMM,
	} {
		if err := step(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if err := a.wait(t); err != nil {
		t.Fatal(err)
	}

	b := startVMM(t, filepath.Join(dir, "b.sock"))
	wantStatus(t, b.client.Restore(ctx, filepath.Join(dir, "nosnap")), http.StatusInternalServerError)
	if err := b.client.Restore(ctx, snap); err != nil {
		t.Fatal(err)
	}
	wantStatus(t, b.client.Restore(ctx, snap), http.StatusInternalServerError)
	info, err := b.client.Info(ctx)
	if err != nil || info.State != vmm.StatePaused || info.Config.Vsock == nil || info.Config.Vsock.Cid != 7 {
		t.Fatalf("Info = %+v, %v", info, err)
	}
	if _, ok := openFiles(t, b.cmd.Process.Pid)[disk]; !ok {
		t.Fatal("restored VMM does not hold the disk")
	}
	if err := b.client.Resume(ctx); err != nil {
		t.Fatal(err)
	}
	if info, err := b.client.Info(ctx); err != nil || info.State != vmm.StateRunning {
		t.Fatalf("Info = %+v, %v", info, err)
	}
	// CH wrote the probed type into its configuration, so the restored
	// disk is typed and the guest's sector-0 writes succeed.
	if got := dialAgent(t, vsock).ask(t, agentproto.TFlush); got != agentproto.TOK {
		t.Fatalf("flush -> %q", got)
	}

	// A snapshot whose disks are gone cannot be restored.
	if err := os.Remove(disk); err != nil {
		t.Fatal(err)
	}
	c := startVMM(t, filepath.Join(dir, "c.sock"))
	wantStatus(t, c.client.Restore(ctx, snap), http.StatusInternalServerError)
	if _, err := c.client.Info(ctx); err == nil {
		t.Fatal("failed restore left a VM")
	}
}

func TestBadRequests(t *testing.T) {
	dir := t.TempDir()
	ctx := ctxT(t)
	p := startVMM(t, filepath.Join(dir, "api.sock"))
	c := p.client

	_, err := c.Info(ctx)
	wantStatus(t, err, http.StatusNotFound)
	wantStatus(t, c.Create(ctx, vmm.Config{}), http.StatusInternalServerError) // no kernel
	wantStatus(t, c.Create(ctx, vmm.Config{Payload: vmm.Payload{Kernel: "k"}, Disks: []vmm.Disk{{Path: filepath.Join(dir, "missing.img")}}}),
		http.StatusInternalServerError)
	wantRaw(t, p.sock, http.MethodPut, "vm.nonesuch", nil, http.StatusNotFound)
	wantRaw(t, p.sock, http.MethodGet, vmm.OpBoot, nil, http.StatusBadRequest)
	wantRaw(t, p.sock, http.MethodPut, vmm.OpCreate, "not a config", http.StatusBadRequest)
	// CH's serde (v53.0) has no default for a given cpus's counts or a
	// given memory's size: such a body is refused before any VM exists.
	payload := map[string]any{"kernel": "k"}
	wantRaw(t, p.sock, http.MethodPut, vmm.OpCreate, map[string]any{"payload": payload, "cpus": map[string]any{"boot_vcpus": 2}}, http.StatusBadRequest)
	wantRaw(t, p.sock, http.MethodPut, vmm.OpCreate, map[string]any{"payload": payload, "cpus": map[string]any{"max_vcpus": 2}}, http.StatusBadRequest)
	wantRaw(t, p.sock, http.MethodPut, vmm.OpCreate, map[string]any{"payload": payload, "memory": map[string]any{"mergeable": true}}, http.StatusBadRequest)
	// A body that parses but names a URL CH cannot use fails the action.
	wantRaw(t, p.sock, http.MethodPut, vmm.OpRestore, vmm.RestoreRequest{SourceURL: "http://example/snap"}, http.StatusInternalServerError)
	wantRaw(t, p.sock, http.MethodPut, vmm.OpRestore, "not a restore config", http.StatusBadRequest)

	// A create that failed on its second disk released the first.
	good := makeDisk(t, dir, "good.img")
	wantStatus(t, c.Create(ctx, vmm.Config{Payload: vmm.Payload{Kernel: "k"}, Disks: []vmm.Disk{{Path: good}, {Path: filepath.Join(dir, "missing.img")}}}),
		http.StatusInternalServerError)
	if _, ok := openFiles(t, p.cmd.Process.Pid)[good]; ok {
		t.Fatal("failed create still holds a disk")
	}

	// vm.delete releases a created-but-never-booted VM's disks.
	if err := c.Create(ctx, vmm.Config{Payload: vmm.Payload{Kernel: "k"}, Disks: []vmm.Disk{{Path: good}}}); err != nil {
		t.Fatal(err)
	}
	wantStatus(t, c.Shutdown(ctx), http.StatusInternalServerError)
	if err := c.Delete(ctx); err != nil {
		t.Fatal(err)
	}
	if _, ok := openFiles(t, p.cmd.Process.Pid)[good]; ok {
		t.Fatal("deleted VM still holds a disk")
	}
	_, err = c.Info(ctx)
	wantStatus(t, err, http.StatusNotFound)
}

// TestIsDeadOnALiveVMM: a refusal from a VMM that answers is not death.
func TestIsDeadOnALiveVMM(t *testing.T) {
	dir := t.TempDir()
	ctx := ctxT(t)
	p := startVMM(t, filepath.Join(dir, "live.sock"))
	if _, err := p.client.Ping(ctx); err != nil {
		t.Fatal(err)
	}
	err := p.client.Boot(ctx)
	if err == nil || vmm.IsDead(err) {
		t.Fatalf("live server's refusal: IsDead(%v) = true", err)
	}
}

func TestSIGKILLLeavesDeadSocket(t *testing.T) {
	dir := t.TempDir()
	ctx := ctxT(t)
	sock := filepath.Join(dir, "api.sock")
	p := startVMM(t, sock)
	if _, err := p.client.Ping(ctx); err != nil {
		t.Fatal(err)
	}
	p.cmd.Process.Signal(syscall.SIGKILL)
	p.wait(t)
	if _, err := os.Lstat(sock); err != nil {
		t.Fatalf("SIGKILL should leave the socket file: %v", err)
	}
	_, err := p.client.Ping(ctx)
	if !vmm.IsDead(err) || !errors.Is(err, syscall.ECONNREFUSED) {
		t.Fatalf("after SIGKILL: IsDead(%v) = false", err)
	}

	// A new VMM takes over the leftover socket.
	q := startVMM(t, sock)
	if _, err := q.client.Ping(ctx); err != nil {
		t.Fatal(err)
	}
}

func TestSIGTERM(t *testing.T) {
	dir := t.TempDir()
	ctx := ctxT(t)
	sock := filepath.Join(dir, "api.sock")
	vsock := filepath.Join(dir, "v.sock")
	disk := makeDisk(t, dir, "d.img")
	p := startVMM(t, sock)
	if err := p.client.Create(ctx, vmm.Config{Payload: vmm.Payload{Kernel: "k"}, Disks: []vmm.Disk{{Path: disk}}, Vsock: &vmm.Vsock{Cid: 3, Socket: vsock}}); err != nil {
		t.Fatal(err)
	}
	if err := p.client.Boot(ctx); err != nil {
		t.Fatal(err)
	}
	p.cmd.Process.Signal(syscall.SIGTERM)
	if err := p.wait(t); err != nil {
		t.Fatalf("exit after SIGTERM: %v", err)
	}
	for _, path := range []string{sock, vsock} {
		if _, err := os.Lstat(path); !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("%s after SIGTERM: %v", path, err)
		}
	}
}

func TestServeRefusesLiveOrForeignPath(t *testing.T) {
	dir := t.TempDir()
	ctx := ctxT(t)
	sock := filepath.Join(dir, "api.sock")
	p := startVMM(t, sock)

	// In-process: Serve must refuse a socket something answers on, and leave
	// it be.
	if err := Serve(ctx, sock, nil, nil); err == nil {
		t.Fatal("Serve over a live VMM's socket succeeded")
	}
	if _, err := p.client.Ping(ctx); err != nil {
		t.Fatalf("live VMM hurt by a refused Serve: %v", err)
	}

	plain := filepath.Join(dir, "plain")
	if err := os.WriteFile(plain, []byte("keep me"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := Serve(ctx, plain, nil, nil); err == nil {
		t.Fatal("Serve over a regular file succeeded")
	}
	if data, err := os.ReadFile(plain); err != nil || string(data) != "keep me" {
		t.Fatalf("regular file touched: %q, %v", data, err)
	}
}

func TestServeInProcessContext(t *testing.T) {
	dir := t.TempDir()
	sock := filepath.Join(dir, "api.sock")
	ctx, cancel := context.WithCancel(context.Background())
	ready := make(chan struct{})
	done := make(chan error, 1)
	var log bytes.Buffer
	go func() { done <- serve(ctx, sock, &log, func() { close(ready) }) }()
	<-ready
	if _, err := vmm.NewClient(sock).Ping(ctxT(t)); err != nil {
		t.Fatal(err)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(sock); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("socket after cancel: %v", err)
	}
	if !strings.Contains(log.String(), "stopped") {
		t.Fatalf("log: %s", log.String())
	}
}
