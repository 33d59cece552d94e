// Package qemu is the qemu driver's VMM: an adapter that serves the Cloud
// Hypervisor REST subset host/vmm's client speaks on the API socket and
// runs qemu-system-x86_64 underneath, controlled over QMP, so the client
// code that drives Cloud Hypervisor drives real guests on any Linux host
// with QEMU (KVM when it answers, software emulation otherwise).
package qemu

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	stdlog "log"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/nexus-sandbox/nexus/agentproto"
	"github.com/nexus-sandbox/nexus/host/driver"
	"github.com/nexus-sandbox/nexus/host/unixsock"
	"github.com/nexus-sandbox/nexus/host/vmm"
)

// Version is what the adapter answers to vmm.ping.
const Version = "nexus-qemu-vmm"

// AgentPort is the virtio-serial port the guest agent opens
// (/dev/virtio-ports/nexus.agent; docs/guest-agent.md).
const AgentPort = "nexus.agent"

// Options say which QEMU to run and how.
type Options struct {
	Binary string // default qemu-system-x86_64
	// Accel is "kvm", "tcg" or "" (kvm when /dev/kvm answers, else tcg).
	Accel string
	Log   io.Writer
	// Ready, if set, is called once the API socket accepts connections.
	Ready func()
}

// Serve answers the API on apiSocket until vmm.shutdown, ctx's end, or the
// QEMU it booted exiting on its own (a guest that powered off, rebooted
// or panicked: -no-reboot), and returns only once QEMU is gone.
func Serve(ctx context.Context, apiSocket string, o Options) error {
	if o.Binary == "" {
		o.Binary = driver.DefaultQEMUBinary
	}
	if o.Log == nil {
		o.Log = io.Discard
	}
	s := &server{o: o, api: apiSocket, log: stdlog.New(o.Log, "", stdlog.LstdFlags|stdlog.Lmicroseconds), stop: make(chan struct{})}
	var exited string
	err := vmm.APIServer{Socket: apiSocket, Handler: vmm.Calls{VMM: s, Lock: &s.mu, Logf: s.log.Printf,
		Stopping: func() bool { return s.stopping }, Stop: func() { s.stopOnce.Do(func() { close(s.stop) }) }},
		Name: Version, Logf: s.log.Printf, ErrorLog: stdlog.New(o.Log, "http: ", 0), Stop: s.stop, Ready: o.Ready,
		Teardown: func() {
			s.mu.Lock()
			s.stopping = true
			s.stopVM()
			exited = s.exitedOnItsOwn
			s.mu.Unlock()
		}}.Serve(ctx)
	if exited != "" {
		return fmt.Errorf("qemu adapter: %s", exited)
	}
	if err != nil {
		return fmt.Errorf("qemu adapter: %w", err)
	}
	return nil
}

type server struct {
	o   Options
	api string
	log *stdlog.Logger

	// mu serialises API calls and teardown: every call sees the previous
	// one's QEMU, sockets and state complete.
	mu       sync.Mutex
	cfg      *vmm.Config
	state    vmm.State
	vm       *instance
	stopping bool
	// exitedOnItsOwn is why QEMU ended without being asked, if it did.
	exitedOnItsOwn string

	stop     chan struct{}
	stopOnce sync.Once
}

// instance is one running QEMU and what the adapter serves for it.
type instance struct {
	accel  string // what QEMU runs on: a migration stream restores only on the same
	cmd    *exec.Cmd
	dir    string // private: QMP and agent sockets
	mon    *monitor
	exited chan struct{}
	status string // QEMU's exit, once exited is closed
	stderr *tail
	relay  *relay
}

type apiError struct {
	status int
	msg    string
	cause  error // for errors.Is; the message already says it
}

func (e *apiError) Error() string { return e.msg }
func (e *apiError) Unwrap() error { return e.cause }

// HTTPStatus is the status vmm.Calls answers the error with.
func (e *apiError) HTTPStatus() int { return e.status }

func failed(format string, args ...any) error {
	return &apiError{status: http.StatusInternalServerError, msg: fmt.Sprintf(format, args...)}
}

func (s *server) Ping(*http.Request) (any, error) {
	return vmm.PingResponse{Version: Version, Pid: os.Getpid()}, nil
}

func (s *server) ShutdownVMM(*http.Request) (any, error) {
	s.stopping = true
	s.stopVM()
	return nil, nil
}

func (s *server) Create(r *http.Request) (any, error) {
	if s.cfg != nil {
		return nil, failed("VM is already created")
	}
	var c vmm.Config
	if err := json.NewDecoder(io.LimitReader(r.Body, 1<<20)).Decode(&c); err != nil {
		return nil, &apiError{status: http.StatusBadRequest, msg: fmt.Sprintf("vm.create: %v", err)}
	}
	if c.Payload.Kernel == "" {
		return nil, &apiError{status: http.StatusBadRequest, msg: "vm.create: payload.kernel is required (the qemu driver boots a kernel directly)"}
	}
	s.cfg, s.state = &c, vmm.StateCreated
	return nil, nil
}

func (s *server) Boot(*http.Request) (any, error) {
	switch {
	case s.cfg == nil:
		return nil, &apiError{status: http.StatusNotFound, msg: "VM is not created"}
	case s.vm != nil:
		return nil, failed("VM is already booted")
	}
	vm, err := s.start(*s.cfg)
	if err != nil {
		return nil, err
	}
	s.vm, s.state = vm, vmm.StateRunning
	return nil, nil
}

func (s *server) Shutdown(*http.Request) (any, error) {
	if s.cfg == nil {
		return nil, &apiError{status: http.StatusNotFound, msg: "VM is not created"}
	}
	s.stopVM()
	s.state = vmm.StateShutdown
	return nil, nil
}

func (s *server) Delete(*http.Request) (any, error) {
	s.stopVM()
	s.cfg, s.state = nil, ""
	return nil, nil
}

func (s *server) Info(*http.Request) (any, error) {
	if s.cfg == nil {
		return nil, &apiError{status: http.StatusNotFound, msg: "VM is not created"}
	}
	state := s.state
	if s.vm != nil {
		select {
		case <-s.vm.exited:
			state = vmm.StateShutdown
		default:
			// QEMU's own word: a guest stopped by an I/O error or a
			// debugger is paused, whatever the adapter last asked.
			var st struct {
				Running bool `json:"running"`
			}
			if err := s.vm.command("query-status", nil, &st); err != nil {
				return nil, failed("query-status: %v", err)
			}
			state = vmm.StatePaused
			if st.Running {
				state = vmm.StateRunning
			}
		}
	}
	return vmm.Info{State: state, Config: *s.cfg}, nil
}

func (s *server) Pause(*http.Request) (any, error) {
	if s.vm == nil || s.state != vmm.StateRunning {
		return nil, failed("VM is not running (%s)", s.state)
	}
	if err := s.vm.command("stop", nil, nil); err != nil {
		return nil, failed("pause: %v", err)
	}
	s.state = vmm.StatePaused
	return nil, nil
}

func (s *server) Resume(*http.Request) (any, error) {
	if s.vm == nil || s.state != vmm.StatePaused {
		return nil, failed("VM is not paused (%s)", s.state)
	}
	if err := s.vm.command("cont", nil, nil); err != nil {
		return nil, failed("resume: %v", err)
	}
	s.state = vmm.StateRunning
	return nil, nil
}

// snapshot writes CH's three files into an existing directory, each
// created exclusively as CH does: config.json (the VM's configuration,
// which a restore re-points at its own files), memory-ranges (QEMU's
// migration stream: guest memory and device state) and state.json (what
// the stream is). Like CH, it wants the VM paused.
func (s *server) Snapshot(r *http.Request) (any, error) {
	if s.vm == nil || s.state != vmm.StatePaused {
		return nil, failed("cannot snapshot: VM is %s, not Paused", s.state)
	}
	dir, err := fileURLDir(r, "destination_url")
	if err != nil {
		return nil, err
	}
	cfg, _ := json.MarshalIndent(s.cfg, "", "  ")
	state, _ := json.MarshalIndent(snapshotState{VMM: Version, Memory: vmm.SnapshotMemoryFile, Format: "qemu migration stream", Accel: s.vm.accel}, "", "  ")
	for _, f := range []struct {
		name string
		data []byte
	}{{vmm.SnapshotConfigFile, cfg}, {vmm.SnapshotStateFile, state}, {vmm.SnapshotMemoryFile, nil}} {
		if err := writeNew(filepath.Join(dir, f.name), f.data); err != nil {
			return nil, failed("snapshot: %v", err)
		}
	}
	mem := filepath.Join(dir, vmm.SnapshotMemoryFile)
	if err := s.vm.command("migrate", map[string]any{"uri": "exec:cat > " + shellQuote(mem)}, nil); err != nil {
		return nil, failed("snapshot: %v", err)
	}
	if err := s.vm.migrated(); err != nil {
		return nil, failed("snapshot: %v", err)
	}
	return nil, nil
}

// restore recreates the VM from a snapshot directory: QEMU started with
// the saved configuration (disks, vsock and console as the restore
// re-pointed them), waiting for the migration stream, which it reads from
// memory-ranges. The VM comes back Paused, as from CH; vm.resume runs it.
func (s *server) Restore(r *http.Request) (any, error) {
	if s.cfg != nil {
		return nil, failed("cannot restore: a VM is already created")
	}
	dir, err := fileURLDir(r, "source_url")
	if err != nil {
		return nil, err
	}
	data, err := os.ReadFile(filepath.Join(dir, vmm.SnapshotConfigFile))
	if err != nil {
		return nil, failed("restore: %v", err)
	}
	var c vmm.Config
	if err := json.Unmarshal(data, &c); err != nil {
		return nil, failed("restore: %s: %v", vmm.SnapshotConfigFile, err)
	}
	mem := filepath.Join(dir, vmm.SnapshotMemoryFile)
	if _, err := os.Stat(mem); err != nil {
		return nil, failed("restore: %v", err)
	}
	var st snapshotState
	if b, err := os.ReadFile(filepath.Join(dir, vmm.SnapshotStateFile)); err == nil {
		json.Unmarshal(b, &st)
	}
	var vm *instance
	if st.Accel == "kvm" || st.Accel == "tcg" {
		vm, err = s.launch(c, st.Accel, []string{"-S", "-incoming", "defer"})
	} else {
		vm, err = s.startWith(c, "-S", "-incoming", "defer")
	}
	if err != nil {
		return nil, err
	}
	err = vm.command("migrate-incoming", map[string]any{"uri": "exec:cat " + shellQuote(mem)}, nil)
	if err == nil {
		err = vm.migrated()
	}
	if err != nil {
		s.vm = vm
		s.stopVM()
		return nil, failed("restore: %v", err)
	}
	s.cfg, s.vm, s.state = &c, vm, vmm.StatePaused
	return nil, nil
}

type snapshotState struct {
	VMM    string `json:"vmm"`
	Memory string `json:"memory"`
	Format string `json:"format"`
	// Accel is what the VM ran on: its CPU model (-cpu host under KVM,
	// QEMU's default under TCG) is in the stream, so a restore runs on it.
	Accel string `json:"accel"`
}

// migrated waits for the migration in either direction to end.
func (vm *instance) migrated() error {
	deadline := time.Now().Add(5 * time.Minute)
	for {
		var st struct {
			Status    string `json:"status"`
			ErrorDesc string `json:"error-desc"`
		}
		if err := vm.command("query-migrate", nil, &st); err != nil {
			return err
		}
		switch st.Status {
		case "completed":
			return nil
		case "failed", "cancelled":
			return fmt.Errorf("migration %s: %s", st.Status, st.ErrorDesc)
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("migration still %q after 5m", st.Status)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// fileURLDir reads a file:// directory URL from the request body field.
func fileURLDir(r *http.Request, field string) (string, error) {
	var body map[string]any
	if err := json.NewDecoder(io.LimitReader(r.Body, 1<<20)).Decode(&body); err != nil {
		return "", &apiError{status: http.StatusBadRequest, msg: err.Error()}
	}
	u, _ := body[field].(string)
	dir, ok := strings.CutPrefix(u, "file://")
	if !ok || !filepath.IsAbs(dir) {
		return "", &apiError{status: http.StatusBadRequest, msg: fmt.Sprintf("%s %q: want file:///DIR", field, u)}
	}
	if fi, err := os.Stat(dir); err != nil || !fi.IsDir() {
		return "", failed("%s %s: not a directory", field, dir)
	}
	return dir, nil
}

// writeNew creates name exclusively and leaves it unsynced, as CH does
// its snapshot files: whoever records the snapshot syncs it.
func writeNew(name string, data []byte) error {
	f, err := os.OpenFile(name, os.O_WRONLY|os.O_CREATE|os.O_EXCL|unix.O_NOFOLLOW, 0o600)
	if err != nil {
		return err
	}
	_, err = f.Write(data)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

// shellQuote quotes a path for the sh -c QEMU runs an exec: migration URI
// with.
func shellQuote(p string) string { return "'" + strings.ReplaceAll(p, "'", `'\''`) + "'" }

// stopVM asks QEMU to quit, kills it if it does not, and removes the
// adapter's private sockets; the caller holds mu.
func (s *server) stopVM() {
	vm := s.vm
	if vm == nil {
		return
	}
	s.vm = nil
	vm.relay.close()
	select {
	case <-vm.exited:
	default:
		vm.command("quit", nil, nil)
		select {
		case <-vm.exited:
		case <-time.After(5 * time.Second):
			vm.cmd.Process.Kill()
			<-vm.exited
		}
	}
	vm.mon.close()
	os.RemoveAll(vm.dir)
	s.log.Printf("qemu pid %d: %s", vm.cmd.Process.Pid, vm.status)
}

// start runs QEMU for c and connects to its QMP socket.
func (s *server) start(c vmm.Config) (*instance, error) { return s.startWith(c) }

func (s *server) startWith(c vmm.Config, extra ...string) (*instance, error) {
	accel := s.accel()
	vm, err := s.launch(c, accel, extra)
	// A nested /dev/kvm can answer the API and still fail the first vCPU
	// (this project's CI: "failed to set MSR", QEMU aborts before its
	// monitor answers). Only a choice nexus made itself is retried, and
	// the log says so; NEXUS_QEMU_ACCEL=kvm keeps the failure.
	if errors.Is(err, errEarlyExit) && accel == "kvm" && s.o.Accel == "" {
		s.log.Printf("kvm failed (%v): falling back to tcg (NEXUS_QEMU_ACCEL chooses)", err)
		vm, err = s.launch(c, "tcg", extra)
	}
	return vm, err
}

// errEarlyExit: QEMU exited before its monitor answered.
var errEarlyExit = errors.New("exited before its QMP socket answered")

func (s *server) launch(c vmm.Config, accel string, extra []string) (*instance, error) {
	dir := PrivateDir(s.api)
	// Only the adapter serving this API socket uses the directory, and the
	// socket is ours: whatever is there was left by one SIGKILLed before
	// it could clean up.
	if err := os.RemoveAll(dir); err != nil {
		return nil, failed("private dir: %v", err)
	}
	if err := os.Mkdir(dir, 0o700); err != nil {
		return nil, failed("private dir: %v", err)
	}
	qmpPath, agentPath := dir+"/qmp.sock", dir+"/agent.sock"
	argv, err := Args(c, accel, qmpPath, agentPath)
	if err != nil {
		os.RemoveAll(dir)
		return nil, &apiError{status: http.StatusBadRequest, msg: err.Error()}
	}
	argv = append(argv, extra...)
	vm := &instance{accel: accel, dir: dir, exited: make(chan struct{}), stderr: &tail{max: 4096}}
	vm.cmd = exec.Command(s.o.Binary, argv...)
	vm.cmd.Stdout, vm.cmd.Stderr = vm.stderr, vm.stderr
	// QEMU must not outlive its adapter: nexus tracks the adapter's pid.
	vm.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	s.log.Printf("starting %s (accel %s) %s", s.o.Binary, accel, strings.Join(argv, " "))
	if err := vm.cmd.Start(); err != nil {
		os.RemoveAll(dir)
		return nil, failed("start %s: %v", s.o.Binary, err)
	}
	go func() {
		err := vm.cmd.Wait()
		vm.status = "exited 0"
		if err != nil {
			vm.status = err.Error()
		}
		close(vm.exited)
		s.exitedAlone(vm)
	}()
	fail := func(err error) (*instance, error) {
		vm.cmd.Process.Kill()
		<-vm.exited
		os.RemoveAll(dir)
		return nil, &apiError{status: http.StatusInternalServerError, msg: fmt.Sprintf("qemu: %v: %s", err, strings.Join(strings.Fields(vm.stderr.String()), " ")), cause: err}
	}
	// QEMU binds its QMP socket before it loads the kernel; under a
	// loaded host that can take seconds.
	deadline := time.Now().Add(30 * time.Second)
	vm.relay = &relay{agent: agentPath, log: s.log, turn: make(chan struct{}, 1)}
	for {
		if vm.mon, err = dialMonitor(qmpPath, vm.relay.event); err == nil {
			break
		}
		select {
		case <-vm.exited:
			return fail(fmt.Errorf("%w (%s)", errEarlyExit, vm.status))
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return fail(fmt.Errorf("QMP socket did not answer within 30s: %v", err))
		}
	}
	if c.Vsock != nil && c.Vsock.Socket != "" {
		if err := vm.relay.listen(c.Vsock.Socket); err != nil {
			return fail(fmt.Errorf("vsock socket: %v", err))
		}
	}
	return vm, nil
}

// PrivateDir is where the adapter serving apiSocket keeps QEMU's QMP and
// agent sockets: under $TMPDIR (short enough for sun_path), named for the
// API socket so the next adapter on it removes what a killed one left.
func PrivateDir(apiSocket string) string {
	sum := sha256.Sum256([]byte(apiSocket))
	return filepath.Join(os.TempDir(), "nexus-qemu-"+hex.EncodeToString(sum[:8]))
}

// exitedAlone ends the adapter when QEMU exits without being asked: the
// VMM nexus tracks must not outlive its VM.
func (s *server) exitedAlone(vm *instance) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.vm != vm {
		return // stopVM asked for it
	}
	s.exitedOnItsOwn = fmt.Sprintf("qemu %s on its own: %s", vm.status, strings.Join(strings.Fields(vm.stderr.String()), " "))
	s.log.Print(s.exitedOnItsOwn)
	s.stopOnce.Do(func() { close(s.stop) })
}

// command runs one QMP command. quit answers, or QEMU exits first.
func (vm *instance) command(name string, args, out any) error {
	err := vm.mon.run(name, args, out, 10*time.Second)
	if name == "quit" && errors.Is(err, errMonitorClosed) {
		return nil
	}
	return err
}

func (s *server) accel() string {
	if s.o.Accel != "" {
		return s.o.Accel
	}
	if KVMAnswers() {
		return "kvm"
	}
	return "tcg"
}

// KVMAnswers reports whether /dev/kvm opens and speaks the stable KVM API
// (KVM_GET_API_VERSION is 12).
func KVMAnswers() bool {
	fd, err := unix.Open("/dev/kvm", unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return false
	}
	defer unix.Close(fd)
	const kvmGetAPIVersion = 0xAE00
	v, err := unix.IoctlRetInt(fd, kvmGetAPIVersion)
	return err == nil && v == 12
}

// Args is QEMU's command line for c: q35 (faster than microvm under
// software emulation, and it needs no tsc hint), no default devices, the
// serial port appended to c.Serial's file, each disk virtio-blk with its
// serial, the agent's virtio-serial port on a unix socket, and no reboot
// (a guest that reboots or panics ends the VMM, as it would end CH).
func Args(c vmm.Config, accel, qmpPath, agentPath string) ([]string, error) {
	mem := c.Memory.Size >> 20
	if mem <= 0 {
		mem = 512
	}
	cpus := max(c.Cpus.BootVcpus, 1)
	a := []string{
		"-machine", "q35", "-accel", accel, "-nodefaults", "-no-user-config", "-display", "none", "-vga", "none",
		"-no-reboot", "-m", strconv.FormatInt(mem, 10), "-smp", strconv.Itoa(cpus),
		"-qmp", "unix:" + opt(qmpPath) + ",server=on,wait=off",
		"-kernel", c.Payload.Kernel,
	}
	if accel == "kvm" {
		a = append(a, "-cpu", "host")
	}
	if c.Payload.Initramfs != "" {
		a = append(a, "-initrd", c.Payload.Initramfs)
	}
	if c.Payload.Cmdline != "" {
		a = append(a, "-append", c.Payload.Cmdline)
	}
	switch {
	case c.Serial == nil || c.Serial.Mode == vmm.ConsoleOff || c.Serial.Mode == vmm.ConsoleNull:
	case c.Serial.Mode == vmm.ConsoleFile && c.Serial.File != "":
		// Appended: the console log keeps every run of the sandbox.
		a = append(a, "-chardev", "file,id=console,append=on,path="+opt(c.Serial.File), "-serial", "chardev:console")
	default:
		return nil, fmt.Errorf("serial mode %s is not supported by the qemu driver (File, Off or Null)", c.Serial.Mode)
	}
	for i, d := range c.Disks {
		if d.ImageType != "" && d.ImageType != vmm.ImageRaw {
			return nil, fmt.Errorf("disk %s: image type %s is not supported by the qemu driver (Raw)", d.Path, d.ImageType)
		}
		id := fmt.Sprintf("disk%d", i)
		drive := "file=" + opt(d.Path) + ",format=raw,if=none,id=" + id
		if d.Readonly {
			drive += ",readonly=on"
		}
		dev := "virtio-blk-pci,drive=" + id
		if d.Serial != "" {
			dev += ",serial=" + opt(d.Serial)
		}
		a = append(a, "-drive", drive, "-device", dev)
	}
	a = append(a, "-device", "virtio-serial-pci,id=vser0",
		"-chardev", "socket,id=agent,server=on,wait=off,path="+opt(agentPath),
		"-device", "virtserialport,bus=vser0.0,chardev=agent,id=agentport,name="+AgentPort)
	return a, nil
}

// opt escapes a value inside a QEMU option list, where a comma separates
// options and a doubled comma is a literal one.
func opt(v string) string { return strings.ReplaceAll(v, ",", ",,") }

// tail keeps the last max bytes written: QEMU's stderr, for errors.
type tail struct {
	mu  sync.Mutex
	max int
	b   []byte
}

func (t *tail) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.b = append(t.b, p...)
	if len(t.b) > t.max {
		t.b = t.b[len(t.b)-t.max:]
	}
	return len(p), nil
}

func (t *tail) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return string(bytes.TrimSpace(t.b))
}

// relay serves the sandbox's vsock socket as Cloud Hypervisor's hybrid
// vsock does: a host connection sends "CONNECT <port>\n" and gets "OK
// <n>\n" only once a guest agent answered, and is closed otherwise.
//
// A virtio-serial port is one stream without connections, and the guest
// cannot tell one host session from the next by watching the port: when
// the host side closes and reopens, the guest may not notice, still
// holds bytes the old session sent, and its writes of the old session
// wait and then reach the new one. So the relay holds one connection to
// QEMU's end of the port for the VM's whole life (the guest never sees
// it come and go, pause and resume included) and marks session
// boundaries in the stream itself: it forwards the host's frames whole
// (a host that dies inside a frame never leaves half of one in the
// guest), and ends and starts each session with a reset frame carrying a
// fresh random nonce. The agent ends the old session, then echoes the
// reset; the relay discards everything the guest sends until it sees that
// exact echo, and answers "OK" only then (docs/guest-agent.md). Sessions
// take turns.
type relay struct {
	agent string
	log   *stdlog.Logger
	turn  chan struct{}

	guest net.Conn   // QEMU's end of the agent port
	wmu   sync.Mutex // frames to the guest, whole and one at a time

	mu      sync.Mutex
	want    []byte        // the echo the session being set up waits for
	pending net.Conn      // that session's host connection
	synced  chan struct{} // closed when the echo arrived
	host    net.Conn      // the session the guest's frames go to
	l       *unixsock.Listener
	conns   map[net.Conn]bool
	n       int
}

// event logs QMP's VSERPORT_CHANGE for the agent's port: the console of
// the relay's view of the guest, not a rule it follows.
func (r *relay) event(name string, data json.RawMessage) {
	if name != "VSERPORT_CHANGE" {
		return
	}
	var d struct {
		ID   string `json:"id"`
		Open bool   `json:"open"`
	}
	if json.Unmarshal(data, &d) != nil || d.ID != "agentport" {
		return
	}
	r.log.Printf("guest %s the agent port", map[bool]string{true: "opened", false: "closed"}[d.Open])
}

func (r *relay) listen(path string) error {
	g, err := net.Dial("unix", r.agent)
	if err != nil {
		return fmt.Errorf("agent port: %w", err)
	}
	l, err := unixsock.Listen(path)
	if err != nil {
		g.Close()
		return err
	}
	r.mu.Lock()
	r.guest, r.l, r.conns = g, l, map[net.Conn]bool{}
	r.mu.Unlock()
	go r.fromGuest()
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			r.mu.Lock()
			r.conns[c] = true
			r.mu.Unlock()
			go r.serve(c)
		}
	}()
	return nil
}

// fromGuest reads the guest's side for the VM's life: byte by byte
// (watching for the echo a session waits for) while no session is
// synced, frame by frame to the synced session's host.
func (r *relay) fromGuest() {
	br := bufio.NewReaderSize(r.guest, 256<<10)
	var win []byte
	scan := func(p []byte) {
		for _, c := range p {
			win = append(win, c)
			if len(win) > 64 {
				win = win[len(win)-64:]
			}
			r.mu.Lock()
			if r.want != nil && bytes.HasSuffix(win, r.want) {
				r.host, r.want = r.pending, nil
				close(r.synced)
				win = win[:0]
			}
			r.mu.Unlock()
		}
	}
	one := make([]byte, 1)
	for {
		r.mu.Lock()
		host := r.host
		r.mu.Unlock()
		if host == nil {
			if _, err := io.ReadFull(br, one); err != nil {
				return
			}
			scan(one)
			continue
		}
		frame, err := agentproto.ReadRawFrame(br)
		if err != nil {
			if errors.Is(err, agentproto.ErrProtocol) {
				// Not the agent's framing: nothing more can be
				// forwarded until the next session's echo.
				r.log.Printf("agent port: %v", err)
				r.mu.Lock()
				r.host = nil
				r.mu.Unlock()
				continue
			}
			return
		}
		r.mu.Lock()
		same := r.host == host
		r.mu.Unlock()
		if !same {
			// The session ended while the frame arrived: it may be the
			// next one's echo.
			scan(frame)
			continue
		}
		if _, err := host.Write(frame); err != nil {
			r.mu.Lock()
			if r.host == host {
				r.host = nil
			}
			r.mu.Unlock()
		}
	}
}

// toGuest writes whole frames to the guest's side.
func (r *relay) toGuest(frame []byte) error {
	r.wmu.Lock()
	defer r.wmu.Unlock()
	_, err := r.guest.Write(frame)
	return err
}

// newReset is a reset frame with a fresh random nonce. Its echo is the
// same frame: the agent encodes the same message with the same codec,
// whose field order and integer widths are fixed.
func newReset() []byte {
	var b [8]byte
	rand.Read(b[:])
	nonce := binary.BigEndian.Uint64(b[:]) | 1
	frame, err := agentproto.Encode(&agentproto.Message{Type: agentproto.TReset, ID: uint32(nonce>>32) | 1, Nonce: nonce})
	if err != nil {
		panic(err) // a reset with a non-zero nonce always encodes
	}
	return frame
}

func (r *relay) serve(c net.Conn) {
	defer func() {
		c.Close()
		r.mu.Lock()
		delete(r.conns, c)
		r.mu.Unlock()
	}()
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	br := bufio.NewReader(c)
	line, err := br.ReadString('\n')
	if err != nil {
		return
	}
	port, ok := strings.CutPrefix(strings.TrimSpace(line), "CONNECT ")
	if !ok || port != "1024" {
		return // CH closes a connection to a port nothing listens on
	}
	c.SetReadDeadline(time.Time{})
	select {
	case r.turn <- struct{}{}:
	case <-time.After(30 * time.Second):
		return
	}
	defer func() { <-r.turn }()
	synced, reset := make(chan struct{}), newReset()
	r.mu.Lock()
	r.synced, r.pending, r.want = synced, c, reset
	r.mu.Unlock()
	// However the session ends, the guest hears of it, so what it
	// started ends with it, as on a closed vsock connection.
	defer func() {
		r.mu.Lock()
		if r.host == c {
			r.host = nil
		}
		r.want, r.pending = nil, nil
		r.mu.Unlock()
		r.toGuest(newReset())
	}()
	if err := r.toGuest(reset); err != nil {
		r.log.Printf("agent port: %v", err)
		return
	}
	// The host sends nothing until it reads "OK": a read that ends first
	// means it gave up, and its turn goes to the next session.
	left := make(chan error, 1)
	go func() {
		_, err := br.Peek(1)
		left <- err
	}()
	select {
	case <-synced:
	case <-left:
		return
	case <-time.After(connectWait):
		return // no agent answered: CH closes, as for no listener
	}
	r.mu.Lock()
	r.n++
	n := r.n
	r.mu.Unlock()
	if _, err := fmt.Fprintf(c, "OK %d\n", n); err != nil {
		return
	}
	if err := <-left; err != nil {
		return
	}
	for {
		frame, err := agentproto.ReadRawFrame(br)
		if err != nil {
			return
		}
		if err := r.toGuest(frame); err != nil {
			return
		}
	}
}

// connectWait bounds the wait for the agent's echo: a guest that is
// booting, paused or has no agent gets the connection closed, as CH does
// with no listener, and the caller's retry sends another reset. It is
// long because the echo queues behind what the guest was still sending
// for an abandoned session, through an emulated serial port on a loaded
// host; a caller that gives up sooner frees its turn at once.
const connectWait = 30 * time.Second

func (r *relay) close() {
	if r == nil {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.l != nil {
		r.l.Close()
	}
	if r.guest != nil {
		r.guest.Close()
	}
	for c := range r.conns {
		c.Close()
	}
}
