// Package standin is the process driver's VMM: a stand-in for Cloud
// Hypervisor, for hosts where CH cannot run. It serves CH's REST subset
// (host/vmm) and enforces CH's rules with real kernel objects (chrules.go),
// and its guest serves the agent protocol with guest/agent itself on the
// host (agent.go), so code exercised against it behaves the same against CH.
package standin

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	stdlog "log"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/nexus-sandbox/nexus/host/vmm"
)

// Serve is the process driver's VMM: it answers CH's API on apiSocket and
// plays the VM's part with real kernel objects, so that everything the host
// checks about a VMM holds of it. It holds every disk open from vm.create on,
// as a VMM holds its images, and from boot on it serves the vsock socket as a
// stand-in guest agent whose "flush" fsyncs the writable disks.
//
// Serve returns nil after vmm.shutdown or when ctx is done (SIGTERM handling
// is the caller's, by cancelling ctx); either way it first releases the disks
// and vsock socket, then stops answering and removes the API socket, so that
// a refused API socket never coexists with disks still held. ready, if
// not nil, is called once the API socket accepts connections.
func Serve(ctx context.Context, apiSocket string, log io.Writer, ready func()) error {
	return serve(ctx, apiSocket, log, ready)
}

func serve(ctx context.Context, apiSocket string, log io.Writer, ready func()) error {
	if log == nil {
		log = io.Discard
	}
	s := &server{log: &logger{w: log}, stop: make(chan struct{})}
	lock, err := lockAPISocket(apiSocket)
	if err != nil {
		return fmt.Errorf("vmm: API socket: %w", err)
	}
	defer lock.Close() // the file stays, as CH leaves it
	err = vmm.APIServer{
		Socket: apiSocket,
		Handler: vmm.Calls{VMM: s, Lock: &s.op, Logf: s.log.Printf,
			Stopping: func() bool { return s.stopping },
			Stop:     func() { s.stopOnce.Do(func() { close(s.stop) }) }},
		Name: Version, Logf: s.log.Printf, ErrorLog: stdlog.New(s.log, "vmm http: ", 0),
		Stop: s.stop, Ready: ready,
		Teardown: func() {
			s.op.Lock()
			s.stopping = true
			s.releaseVM()
			s.op.Unlock()
		},
	}.Serve(ctx)
	if err != nil {
		return fmt.Errorf("vmm: %w", err)
	}
	return nil
}

// lockAPISocket does what CH v53+ does before it binds its API socket:
// create <socket>.lock and take an OFD write lock on the whole file, so a
// second VMM on the same path is refused (vmm/src/api/http/mod.rs,
// acquire_api_socket_lock). CH never removes the file.
func lockAPISocket(apiSocket string) (*os.File, error) {
	f, err := os.OpenFile(apiSocket+".lock", os.O_WRONLY|os.O_CREATE|unix.O_CLOEXEC|unix.O_NOFOLLOW, 0o600)
	if err != nil {
		return nil, err
	}
	lk := unix.Flock_t{Type: unix.F_WRLCK, Whence: 0, Start: 0, Len: 0}
	for {
		err = unix.FcntlFlock(f.Fd(), unix.F_OFD_SETLK, &lk)
		if !errors.Is(err, unix.EINTR) {
			break
		}
	}
	if err != nil {
		f.Close()
		if errors.Is(err, unix.EAGAIN) || errors.Is(err, unix.EACCES) {
			return nil, fmt.Errorf("%s is in use by another VMM (its .lock is held)", apiSocket)
		}
		return nil, err
	}
	return f, nil
}

// Version is what the process driver's VMM answers to vmm.ping, so a
// caller can tell it from a real CH (which answers e.g. "v43.0").
const Version = "nexus-process-vmm"

type server struct {
	log *logger

	// op serializes API calls and teardown, so every state change sees the
	// previous one complete, files and sockets included. The stand-in agent
	// never takes it, which lets teardown wait for the agent's goroutines.
	op       sync.Mutex
	vm       *vm // nil: no VM created
	stopping bool

	stop     chan struct{}
	stopOnce sync.Once
}

type vm struct {
	state  vmm.State
	config *vmConfig
	disks  []disk   // nil while shut down
	agent  *agent   // nil while shut down or without vsock
	serial *os.File // the serial port's File, nil unless mode File
}

type disk struct {
	f        *os.File
	path     string
	writable bool
	// sector0Refused: the image type was probed as raw, not given, so CH
	// (v51+) fails the guest's writes to sector 0.
	sector0Refused bool
}

// apiError carries the HTTP status CH would give.
type apiError struct {
	status int
	msg    string
}

func (e *apiError) Error() string   { return e.msg }
func (e *apiError) HTTPStatus() int { return e.status }

// CH answers failed VM actions with 500 and the error text.
func failed(format string, args ...any) error {
	return &apiError{http.StatusInternalServerError, fmt.Sprintf(format, args...)}
}

// notCreated is CH's answer when no VM configuration exists (VmNotCreated,
// VmMissingConfig): 404, per vmm/src/api/http/mod.rs and the OpenAPI
// document (vm.info, vm.boot).
func notCreated(format string, args ...any) error {
	return &apiError{http.StatusNotFound, fmt.Sprintf(format, args...)}
}

func badRequest(format string, args ...any) error {
	return &apiError{http.StatusBadRequest, fmt.Sprintf(format, args...)}
}

func (s *server) Ping(*http.Request) (any, error) {
	return vmm.PingResponse{Version: Version, Pid: os.Getpid()}, nil
}

func (s *server) ShutdownVMM(*http.Request) (any, error) {
	s.stopping = true
	s.releaseVM()
	return nil, nil
}

func (s *server) Create(r *http.Request) (any, error) {
	if s.vm != nil {
		return nil, failed("VM is already created")
	}
	data, err := readBody(r)
	if err != nil {
		return nil, err
	}
	vc, err := parseVMConfig(data)
	if err != nil {
		return nil, badRequest("cannot parse request body: %v", err)
	}
	if err := vc.validate(); err != nil {
		return nil, err
	}
	// CH opens the serial port's file at vm.create (File::create: created
	// or truncated); the stand-in also holds the disks from here on.
	serial, err := openSerial(vc.cfg)
	if err != nil {
		return nil, err
	}
	disks, err := openDisks(vc)
	if err != nil {
		if serial != nil {
			serial.Close()
		}
		return nil, err
	}
	s.vm = &vm{state: vmm.StateCreated, config: vc, disks: disks, serial: serial}
	return nil, nil
}

// openSerial opens the serial port's file as CH does, following the path
// as given: keeping it safe is the host's job, before it names the file.
func openSerial(cfg vmm.Config) (*os.File, error) {
	if cfg.Serial == nil || cfg.Serial.Mode != vmm.ConsoleFile {
		return nil, nil
	}
	if cfg.Serial.File == "" {
		return nil, failed("invalid VM config: serial mode File without a file")
	}
	f, err := os.OpenFile(cfg.Serial.File, os.O_WRONLY|os.O_CREATE|os.O_TRUNC|unix.O_CLOEXEC, 0o644)
	if err != nil {
		return nil, failed("cannot create console devices: serial: %v", err)
	}
	return f, nil
}

// console writes a line to the guest's serial port, as its kernel would.
func (v *vm) console(format string, args ...any) {
	if v.serial != nil {
		fmt.Fprintf(v.serial, "[nexus stand-in guest] "+format+"\n", args...)
	}
}

func (s *server) Boot(*http.Request) (any, error) {
	v := s.vm
	if v == nil {
		return nil, notCreated("cannot boot: VM is not created")
	}
	if v.state != vmm.StateCreated && v.state != vmm.StateShutdown {
		return nil, failed("cannot boot: VM is %s", v.state)
	}
	if v.disks == nil {
		if v.serial == nil {
			serial, err := openSerial(v.config.cfg)
			if err != nil {
				return nil, err
			}
			v.serial = serial
		}
		disks, err := openDisks(v.config)
		if err != nil {
			return nil, err
		}
		v.disks = disks
	}
	if v.config.cfg.Vsock != nil {
		a, err := startAgent(v.config.cfg.Vsock.Socket, v.disks, false, s.log, v.console)
		if err != nil {
			return nil, failed("cannot boot: vsock: %v", err)
		}
		v.agent = a
	}
	v.console("booted: %s", v.config.cfg.Payload.Cmdline)
	v.state = vmm.StateRunning
	return nil, nil
}

func (s *server) Shutdown(*http.Request) (any, error) {
	v := s.vm
	if v == nil {
		return nil, failed("cannot shut down: VM is not created")
	}
	if v.state != vmm.StateRunning && v.state != vmm.StatePaused {
		return nil, failed("cannot shut down: VM is %s", v.state)
	}
	v.release()
	v.state = vmm.StateShutdown
	return nil, nil
}

func (s *server) Delete(*http.Request) (any, error) {
	s.releaseVM()
	s.vm = nil
	return nil, nil
}

func (s *server) Info(*http.Request) (any, error) {
	if s.vm == nil {
		return nil, notCreated("VM is not created")
	}
	// The configuration as CH shows it: as sent, with the device ids and
	// probed image types CH filled in.
	return map[string]any{"state": s.vm.state, "config": s.vm.config.raw}, nil
}

func (s *server) Pause(*http.Request) (any, error) {
	v := s.vm
	if v == nil || v.state != vmm.StateRunning {
		return nil, failed("cannot pause: VM is %s", stateOf(v))
	}
	if v.agent != nil {
		v.agent.setPaused(true)
	}
	v.state = vmm.StatePaused
	return nil, nil
}

func (s *server) Resume(*http.Request) (any, error) {
	v := s.vm
	if v == nil || v.state != vmm.StatePaused {
		return nil, failed("cannot resume: VM is %s", stateOf(v))
	}
	if v.agent != nil {
		v.agent.setPaused(false)
	}
	v.state = vmm.StateRunning
	return nil, nil
}

func (s *server) Snapshot(r *http.Request) (any, error) {
	v := s.vm
	// CH snapshots only a paused VM, so a host that forgets to pause fails
	// here too rather than only on real CH.
	if v == nil || v.state != vmm.StatePaused {
		return nil, failed("cannot snapshot: VM is %s, not Paused", stateOf(v))
	}
	var req vmm.SnapshotRequest
	if err := decodeBody(r, &req); err != nil {
		return nil, err
	}
	dir, err := dirOfURL(req.DestinationURL)
	if err != nil {
		return nil, err
	}
	if err := writeSnapshot(dir, v.config, vmState{State: v.state, TakenAt: time.Now().UTC().Format(time.RFC3339Nano)}); err != nil {
		return nil, failed("cannot snapshot: %v", err)
	}
	return nil, nil
}

func (s *server) Restore(r *http.Request) (any, error) {
	if s.vm != nil {
		return nil, failed("cannot restore: VM is already created")
	}
	var req vmm.RestoreRequest
	if err := decodeBody(r, &req); err != nil {
		return nil, err
	}
	dir, err := dirOfURL(req.SourceURL)
	if err != nil {
		return nil, err
	}
	vc, err := readSnapshot(dir)
	if err != nil {
		return nil, failed("cannot restore: %v", err)
	}
	serial, err := openSerial(vc.cfg)
	if err != nil {
		return nil, err
	}
	disks, err := openDisks(vc)
	if err != nil {
		if serial != nil {
			serial.Close()
		}
		return nil, failed("cannot restore: %v", err)
	}
	v := &vm{state: vmm.StatePaused, config: vc, disks: disks, serial: serial}
	v.console("restored from %s", dir)
	if vc.cfg.Vsock != nil {
		// CH recreates the vsock device, socket included, at restore; the
		// guest behind it stays frozen until resume.
		a, err := startAgent(vc.cfg.Vsock.Socket, disks, true, s.log, v.console)
		if err != nil {
			v.release()
			return nil, failed("cannot restore: vsock: %v", err)
		}
		v.agent = a
	}
	s.vm = v
	return nil, nil
}

// releaseVM frees the VM's kernel objects but keeps its state for vm.info.
func (s *server) releaseVM() {
	if s.vm != nil {
		s.vm.release()
	}
}

// release stops the agent before closing the disks so that a flush in
// progress completes against open files.
func (v *vm) release() {
	if v.agent != nil {
		v.agent.close()
		v.agent = nil
	}
	for _, d := range v.disks {
		d.f.Close()
	}
	v.disks = nil
	if v.serial != nil {
		v.serial.Close()
		v.serial = nil
	}
}

func stateOf(v *vm) string {
	if v == nil {
		return "not created"
	}
	return string(v.state)
}

func (vc *vmConfig) validate() error {
	if err := validateConfig(&vc.cfg); err != nil {
		return err
	}
	// CH's defaults, so vm.info shows what CH would.
	cpus, _ := vc.raw["cpus"].(map[string]any)
	if cpus == nil {
		cpus = map[string]any{}
		vc.raw["cpus"] = cpus
	}
	cpus["boot_vcpus"], cpus["max_vcpus"] = vc.cfg.Cpus.BootVcpus, vc.cfg.Cpus.MaxVcpus
	mem, _ := vc.raw["memory"].(map[string]any)
	if mem == nil {
		mem = map[string]any{}
		vc.raw["memory"] = mem
	}
	mem["size"] = vc.cfg.Memory.Size
	return nil
}

// validateConfig refuses a configuration CH would refuse and fills in
// CH's defaults.
func validateConfig(c *vmm.Config) error {
	if c.Payload.Kernel == "" && c.Payload.Firmware == "" {
		return failed("invalid VM config: payload needs a kernel or firmware")
	}
	for i, d := range c.Disks {
		if d.Path == "" {
			return failed("invalid VM config: disk %d has no path", i)
		}
		// CH's DiskConfig::validate (v47+), message included.
		if len(d.Serial) > vmm.SerialMax {
			return failed("invalid VM config: Block device serial length (%d) exceeds maximum allowed length (%d)", len(d.Serial), vmm.SerialMax)
		}
	}
	if c.Vsock != nil && c.Vsock.Socket == "" {
		return failed("invalid VM config: vsock has no socket")
	}
	// CH's defaults, so vm.info shows what CH would.
	if c.Cpus.BootVcpus == 0 {
		c.Cpus.BootVcpus = 1
	}
	if c.Cpus.MaxVcpus == 0 {
		c.Cpus.MaxVcpus = c.Cpus.BootVcpus
	}
	if c.Cpus.BootVcpus < 0 || c.Cpus.MaxVcpus < c.Cpus.BootVcpus {
		return failed("invalid VM config: cpus boot_vcpus %d, max_vcpus %d", c.Cpus.BootVcpus, c.Cpus.MaxVcpus)
	}
	if c.Memory.Size == 0 {
		c.Memory.Size = 512 << 20
	}
	if c.Memory.Size < 0 {
		return failed("invalid VM config: memory size %d", c.Memory.Size)
	}
	return nil
}

func readBody(r *http.Request) ([]byte, error) {
	data, err := io.ReadAll(http.MaxBytesReader(nil, r.Body, 1<<20))
	if err != nil {
		return nil, badRequest("cannot read request body: %v", err)
	}
	return data, nil
}

func decodeBody(r *http.Request, v any) error {
	dec := json.NewDecoder(http.MaxBytesReader(nil, r.Body, 1<<20))
	if err := dec.Decode(v); err != nil {
		return badRequest("cannot parse request body: %v", err)
	}
	return nil
}

// dirOfURL is CH's url_to_path: a URL it cannot use fails the action (500,
// as a MigratableError does), it is not a malformed request (400). CH
// would resolve a relative path against its own directory; the stand-in
// refuses one, which no caller of it sends.
func dirOfURL(u string) (string, error) {
	dir, ok := strings.CutPrefix(u, "file://")
	if !ok || !filepath.IsAbs(dir) {
		return "", failed("want a file:// URL with an absolute path, got %q", u)
	}
	return filepath.Clean(dir), nil
}

// logger makes one io.Writer safe for the concurrent goroutines that log.
type logger struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *logger) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

func (l *logger) Printf(format string, args ...any) {
	line := time.Now().UTC().Format("2006-01-02T15:04:05.000Z") + " vmm: " + fmt.Sprintf(format, args...)
	if !strings.HasSuffix(line, "\n") {
		line += "\n"
	}
	l.Write([]byte(line))
}
