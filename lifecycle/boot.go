package lifecycle

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/oklog/ulid/v2"

	"github.com/nexus-sandbox/nexus/agentproto"
	"github.com/nexus-sandbox/nexus/core"
	"github.com/nexus-sandbox/nexus/events"
	"github.com/nexus-sandbox/nexus/host/driver"
	"github.com/nexus-sandbox/nexus/host/ext4"
	"github.com/nexus-sandbox/nexus/host/fsx"
	"github.com/nexus-sandbox/nexus/host/proc"
	"github.com/nexus-sandbox/nexus/host/supervisor"
	"github.com/nexus-sandbox/nexus/host/vmm"
	"github.com/nexus-sandbox/nexus/layout"
	"github.com/nexus-sandbox/nexus/projections"
	"github.com/nexus-sandbox/nexus/sagas"
)

// DefaultCmdline logs to the serial port (kept as logs/<id>.console.log).
// root= serves a kernel booted without an initramfs; an initramfs's /init
// ignores it and finds its disks by serial.
const DefaultCmdline = "console=ttyS0 root=/dev/vda rw"

// vmConfig is vm.create's body for d, sized by b. The guest kernel logs to ttyS0, CH's serial
// port, whose default mode (Null) drops every line: it goes to serialLog.
// mounts are appended to the kernel command line (guestMounts): the agent
// as PID 1 reads them there to mount volumes at their guest paths.
func vmConfig(d driver.Driver, b events.BootConfig, disks []vmm.Disk, mounts []string, vsock, serialLog string) vmm.Config {
	c := vmm.Config{
		Disks:  disks,
		Memory: vmm.Memory{Size: b.MemoryBytes},
		// CH's serde requires both counts once cpus is given; nexus
		// hot-plugs none, so the guest's maximum is what it boots with.
		Cpus:   vmm.Cpus{BootVcpus: b.Cpus, MaxVcpus: b.Cpus},
		Vsock:  &vmm.Vsock{Cid: 3, Socket: vsock},
		Serial: &vmm.Console{Mode: vmm.ConsoleFile, File: serialLog},
		// Off, not CH's default Tty: the guest logs to the serial port,
		// and the VMM runs without a terminal.
		Console: &vmm.Console{Mode: vmm.ConsoleOff},
		// The process driver boots no kernel; it still names one, as the
		// API requires a payload, and is handed the rest as a VMM is.
		Payload: vmm.Payload{Kernel: "process-driver", Initramfs: d.Initramfs, Cmdline: d.Cmdline},
	}
	if c.Payload.Cmdline == "" {
		c.Payload.Cmdline = DefaultCmdline
	}
	if len(mounts) > 0 {
		c.Payload.Cmdline += " " + strings.Join(mounts, " ")
	}
	// CH gives the guest a vsock device and no virtio-serial port: the
	// agent is told so, and serves vsock at once rather than wait for a
	// port (QEMU's adapter gives it one).
	if d.Name == driver.CloudHypervisor {
		c.Payload.Cmdline += " " + agentproto.CmdlineVsockOnly
	}
	if d.BootsKernel() {
		c.Payload.Kernel = d.Kernel
	}
	return c
}

func nowUTC() time.Time { return time.Now().UTC() }

// waitFor polls check until it succeeds, the process dies, or the timeout
// passes. There is no signal to wait on: readiness is a socket answering.
// A freshly spawned process answers within tens of milliseconds, which is
// on every create's path, so the first second polls every few milliseconds
// (a refused dial costs microseconds); only a slow start backs off.
func waitFor(ctx context.Context, who proc.Identity, timeout time.Duration, what string, check func(context.Context) error) error {
	start := time.Now()
	deadline := start.Add(timeout)
	var last error
	for delay := time.Millisecond; ; delay = pollDelay(time.Since(start), delay) {
		cctx, cancel := context.WithTimeout(ctx, time.Second)
		last = check(cctx)
		cancel()
		if last == nil {
			return nil
		}
		if alive, _ := proc.Alive(who); !alive {
			return fmt.Errorf("%s exited before answering: %v", what, last)
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s did not answer within %s: %v", what, timeout, last)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(delay):
		}
	}
}

// pollDelay is waitFor's next pause: 3 ms while a process is expected to
// come up, then doubling up to 100 ms.
func pollDelay(waited, last time.Duration) time.Duration {
	if waited < time.Second {
		return 3 * time.Millisecond
	}
	return min(max(last, 3*time.Millisecond)*2, 100*time.Millisecond)
}

// bootSteps start the sandbox's perimeter supervisor, then its VMM. With
// restoreFrom set, the VMM restores that snapshot instead of booting cold.
func (m *Manager) bootSteps(id, restoreFrom string) []sagas.Step {
	var sup, vm proc.Identity
	// early is the VMM's process, started beside the supervisor; booting
	// is the sandbox as it was read to start it.
	var early *vmmLaunch
	var booting projections.Sandbox
	// run is this boot's run marker; vmBegun says a VM may exist (vm.create
	// or vm.restore was sent), after which the overlay may have been used.
	var run, prevRun, prevFlushed string
	var vmBegun bool
	stateDir := m.Root.SupervisorDir(id)
	api, vsock, iid := m.Root.APISocket(id), m.Root.VsockSocket(id), m.Root.IIDSocket(id)
	// The logs are journaled with the run marker, and the supervisor with
	// the VMM: a crash before either append leaves what recover finds
	// without the journal, as a crash before the step was journaled does
	// (logs named for the sandbox, processes by their command lines).
	logs := m.logsStep(id)
	logs.Defer = true
	return []sagas.Step{logs, {
		// The run marker is journaled before the VMM spawns: a run that
		// dies without a FlushAcknowledged for it is then known to be
		// unacknowledged, and its overlay is never edited offline.
		Name: "run-mark",
		Do: func(ctx context.Context) ([]events.Payload, error) {
			sb, err := m.Find(ctx, id)
			if err != nil {
				return nil, err
			}
			run, prevRun, prevFlushed = ulid.Make().String(), sb.LastRun, sb.FlushedRun
			return sagas.One(events.FlushPendingEvent{Run: run, Previous: prevRun, PreviousFlushed: prevFlushed,
				Overlay: m.rel(m.Root.WorkspaceDisk(id))}), nil
		},
		// A VMM that failed before any VM existed never touched the
		// overlay: the previous marker and acknowledgement hold again.
		Undo: func(context.Context) ([]events.Payload, error) {
			if run == "" || vmBegun {
				return nil, nil
			}
			return sagas.One(events.FlushRestoredEvent{Run: run, Previous: prevRun, PreviousFlushed: prevFlushed}), nil
		},
	}, {
		// The VMM's process starts here, beside the supervisor's: neither
		// needs the other to start, and each takes a process start. The
		// VM is created and booted in the next step, once the supervisor
		// serves and is journaled. A crash meanwhile leaves a VMM the
		// journal never heard of, which recover finds by its command line
		// (killStartingVMM) as it does one the vmm step spawned.
		Name:  "supervisor",
		Defer: true,
		Do: func(ctx context.Context) ([]events.Payload, error) {
			sb, err := m.Find(ctx, id)
			if err != nil {
				return nil, err
			}
			if err := m.checkDisks(m.vmDisks(ctx, sb)); err != nil {
				return nil, err
			}
			booting, early = sb, m.launchVMM(ctx, id, sb)
			// A supervisor that fails leaves the VMM to this step's undo.
			if sup, err = m.startSupervisor(ctx, id); err != nil {
				return nil, err
			}
			return sagas.One(events.SupervisorStartedEvent{Pid: sup.Pid, Start: sup.StartTicks,
				Socket: m.rel(filepath.Join(stateDir, supervisor.SocketName)), StateDir: m.res(events.KindSupervisorState, stateDir)}), nil
		},
		Undo: func(ctx context.Context) ([]events.Payload, error) {
			ps, err := early.drop(ctx, m, id)
			if err != nil || sup.Pid == 0 {
				return ps, err
			}
			more, err := m.stopSupervisor(sup)
			return append(ps, more...), err
		},
	}, {
		Name: "vmm",
		Do: func(ctx context.Context) ([]events.Payload, error) {
			// The supervisor's start changed none of what the VM is made of.
			sb := booting
			d, boot := m.bootOf(sb)
			m.noticeHostGuest(sb)
			c := vmm.NewClient(api)
			var err error
			if vm, err = early.take(); err != nil {
				return nil, err
			}
			// CH opens the serial log by name and follows symlinks: make it
			// a regular file beneath the root first.
			if err := fsx.EnsureFile(string(m.Root), m.rel(m.Root.ConsoleLog(id)), 0o600); err != nil {
				proc.Terminate(vm, time.Second)
				return nil, fmt.Errorf("serial log: %w", err)
			}
			// A restore brings its own configuration (re-pointed at this
			// sandbox's disks); a cold boot is configured here.
			vmBegun = true
			if restoreFrom != "" {
				err = c.Restore(ctx, restoreFrom)
				if err == nil {
					err = c.Resume(ctx)
				}
			} else if err = c.Create(ctx, vmConfig(d, boot, m.vmDisks(ctx, sb), guestMounts(sb), vsock, m.Root.ConsoleLog(id))); err == nil {
				err = c.Boot(ctx)
			}
			if err != nil {
				proc.Terminate(vm, time.Second)
				return nil, err
			}
			sockets := []events.Resource{m.res(events.KindAPISocket, api), m.res(events.KindVsockSocket, vsock), m.res(events.KindIIDSocket, iid)}
			// CH v53+ locks <api>.lock before it binds the socket, so the
			// file exists by now if this VMM makes one; it outlives the VMM.
			if fi, err := fsx.Stat(string(m.Root), m.Root.APISocketLock(id)); err == nil && fi.Mode().IsRegular() {
				sockets = append(sockets, m.res(events.KindAPISocketLock, m.Root.APISocketLock(id)))
			}
			return sagas.One(events.SandboxStartedEvent{Driver: d.Name, VMMPid: vm.Pid, VMMStart: vm.StartTicks,
				RunMarker: run, Sockets: sockets}), nil
		},
		Undo: func(ctx context.Context) ([]events.Payload, error) {
			if vm.Pid == 0 {
				return nil, nil
			}
			return m.stopVMM(ctx, id, vm, false)
		},
	}}
}

// vmmLaunch is a VMM's process starting in the background while the
// supervisor starts; the vmm step takes it, and anything that undoes the
// boot before then drops it.
type vmmLaunch struct {
	done  chan struct{}
	who   proc.Identity
	err   error
	taken bool
}

// launchVMM starts sb's VMM in the background.
func (m *Manager) launchVMM(ctx context.Context, id string, sb projections.Sandbox) *vmmLaunch {
	d, _ := m.bootOf(sb)
	api := m.Root.APISocket(id)
	c := vmm.NewClient(api)
	l := &vmmLaunch{done: make(chan struct{})}
	go func() {
		defer close(l.done)
		l.who, l.err = m.launch(ctx, "VMM", d.Argv(api), m.Root.VMMLog(id), d.SignalsReady(), func(ctx context.Context) error { _, err := c.Ping(ctx); return err })
	}()
	return l
}

// take waits for the launch and hands over its process (with an error,
// the process that did not answer, if one started), as m.launch does.
func (l *vmmLaunch) take() (proc.Identity, error) {
	if l == nil {
		return proc.Identity{}, errors.New("VMM: not launched")
	}
	<-l.done
	l.taken = true
	return l.who, l.err
}

// drop waits for a launch nobody took and stops its process as the vmm
// step's undo stops one it took.
func (l *vmmLaunch) drop(ctx context.Context, m *Manager, id string) ([]events.Payload, error) {
	if l == nil || l.taken {
		return nil, nil
	}
	who, _ := l.take()
	if who.Pid == 0 {
		return nil, nil
	}
	return m.stopVMM(ctx, id, who, false)
}

// logsStep makes the sandbox's logs before anything writes to them and
// journals the ones the journal does not have yet, so rm and the reaper
// know them from the journal, not only by name. Its undo journals any it
// made but could not record (an interruption between the two): a log of a
// failed boot is worth keeping, and is the sandbox's.
func (m *Manager) logsStep(id string) sagas.Step {
	claims := func(ctx context.Context) ([]events.Payload, error) {
		sb, err := m.Find(ctx, id)
		if err != nil {
			return nil, err
		}
		return m.logClaims(sb), nil
	}
	return sagas.Step{
		Name: "logs",
		Do: func(ctx context.Context) ([]events.Payload, error) {
			if err := fsx.MkdirAll(string(m.Root), "logs", 0o700); err != nil {
				return nil, fmt.Errorf("logs: %w", err)
			}
			var rels []string
			for _, r := range m.logResources(id) {
				rels = append(rels, r.Path)
			}
			// One fsync of logs/ makes all three names durable, before
			// the journal claims any of them.
			if err := fsx.EnsureFiles(string(m.Root), rels, 0o600); err != nil {
				return nil, fmt.Errorf("log: %w", err)
			}
			// The VMM begins the console log anew (CH's File::create
			// truncates it): its time index begins anew with it, before
			// the supervisor that keeps it starts.
			if err := clearFile(string(m.Root), m.rel(m.Root.ConsoleIndex(id))); err != nil {
				return nil, fmt.Errorf("console index: %w", err)
			}
			return claims(ctx)
		},
		Undo: claims,
	}
}

// logClaims are the resource.created events of the sandbox's logs that
// exist but the journal does not give it yet.
func (m *Manager) logClaims(sb projections.Sandbox) []events.Payload {
	var ps []events.Payload
	for _, r := range m.logResources(sb.ID) {
		if sb.Owns(r.Path) {
			continue
		}
		if _, err := fsx.Stat(string(m.Root), m.Root.Abs(r.Path)); err == nil {
			ps = append(ps, events.ResourceCreatedEvent{Resource: r})
		}
	}
	return ps
}

func (m *Manager) logResources(id string) []events.Resource {
	return []events.Resource{
		m.res(events.KindLog, m.Root.VMMLog(id)),
		m.res(events.KindLog, m.Root.SupervisorLog(id)),
		m.res(events.KindLog, m.Root.ConsoleLog(id)),
		m.res(events.KindLog, m.Root.ConsoleIndex(id)),
	}
}

// clearFile empties the regular file rel beneath root.
func clearFile(root, rel string) error {
	f, err := fsx.OpenFile(root, rel, os.O_WRONLY|os.O_TRUNC, 0)
	if err != nil {
		return err
	}
	return f.Close()
}

// vmDisks lists the disks a sandbox boots with: its own, then its volumes.
// Every one is typed Raw: CH v51+ refuses the guest's writes to sector 0
// of a disk whose raw type it had to probe, and an ext4 with 4 KiB blocks
// writes its superblock's block there. Every one carries a serial saying
// what it is, so the guest finds it without relying on order
// (docs/guest-agent.md).
func (m *Manager) vmDisks(ctx context.Context, sb projections.Sandbox) []vmm.Disk {
	var disks []vmm.Disk
	if sb.BootConfig.RootMode() == events.RootOverlay {
		// The entry itself, shared by every sandbox booted on it: read-only
		// (CH opens it O_RDONLY under a shared lock, QEMU readonly=on), so
		// no guest can write it; its writes go to the overlay's upper layer
		// on the workspace disk.
		disks = append(disks, vmm.Disk{Path: m.Root.ImageDisk(sb.Bootstrap.CacheID), Readonly: true, ImageType: vmm.ImageRaw, Serial: agentproto.SerialOS})
	}
	for _, r := range sb.Resources {
		var serial string
		switch r.Kind {
		case events.KindRawDisk:
			serial = agentproto.SerialOS
		case events.KindWorkspaceDisk:
			serial = agentproto.SerialWorkspace
		case events.KindShadowDisk:
			name, _ := layout.ShadowName(r.Path)
			serial = agentproto.DiskSerial(agentproto.SerialShadow, name)
		default:
			continue
		}
		disks = append(disks, vmm.Disk{Path: m.Root.Abs(r.Path), ImageType: vmm.ImageRaw, Serial: serial})
	}
	for _, v := range sb.Volumes {
		disks = append(disks, vmm.Disk{Path: m.Root.VolumeDisk(v.Name), Readonly: v.ReadOnly, ImageType: vmm.ImageRaw,
			Serial: agentproto.DiskSerial(agentproto.SerialVolume, v.Name)})
	}
	return disks
}

// guestMounts are the kernel command-line entries that make the guest's
// root an overlay (nexus.root=overlay) and mount each volume at its guest
// path, nexus.mount=SERIAL:/path (docs/guest-agent.md), in the order the
// volumes were attached. Create refuses a guest path the
// command line cannot carry.
func guestMounts(sb projections.Sandbox) []string {
	var ms []string
	if sb.BootConfig.RootMode() == events.RootOverlay {
		ms = append(ms, agentproto.CmdlineRootOverlay)
	}
	for _, v := range sb.Volumes {
		if v.GuestPath == "" {
			continue
		}
		ms = append(ms, "nexus.mount="+agentproto.DiskSerial(agentproto.SerialVolume, v.Name)+":"+v.GuestPath)
	}
	return ms
}

func (m *Manager) startSupervisor(ctx context.Context, id string) (proc.Identity, error) {
	stateDir := m.Root.SupervisorDir(id)
	argv := supervisor.Argv(m.Driver.Exe, supervisor.ServeOptions{SandboxID: id, StateDir: stateDir, IIDSocket: m.Root.IIDSocket(id),
		ConsoleLog: m.Root.ConsoleLog(id), ConsoleIndex: m.Root.ConsoleIndex(id)})
	who, err := m.launch(ctx, "supervisor", argv, m.Root.SupervisorLog(id), true, func(ctx context.Context) error {
		_, err := supervisor.Ping(ctx, stateDir)
		return err
	})
	if err != nil && who.Pid != 0 {
		proc.Terminate(who, time.Second)
	}
	return who, err
}

func (m *Manager) stopSupervisor(who proc.Identity) ([]events.Payload, error) {
	if err := proc.Terminate(who, 5*time.Second); err != nil {
		return nil, err
	}
	return sagas.One(events.SupervisorStoppedEvent{Pid: who.Pid, Reason: "stopped"}), nil
}

// stopVMM asks the VMM to shut down through its API, makes sure the
// process is gone, then removes the sandbox's sockets. flush asks
// the guest to flush its filesystem first and, only if it confirms,
// journals the flush acknowledgement.
func (m *Manager) stopVMM(ctx context.Context, id string, who proc.Identity, flush bool) ([]events.Payload, error) {
	ps, err := m.terminateVMM(ctx, id, who, flush)
	if err != nil {
		return nil, err
	}
	lock := m.rel(m.Root.APISocketLock(id))
	more, err := m.reclaimVMMSockets(id, func(rel string) bool { return rel != lock })
	return append(ps, more...), err
}

// terminateVMM flushes the guest (when asked), shuts the VMM down and
// makes sure its process is gone. The FlushAcknowledged event is returned
// only when the guest confirmed its flush AND the termination succeeded: a
// failed flush or a failed termination never yields one.
func (m *Manager) terminateVMM(ctx context.Context, id string, who proc.Identity, flush bool) ([]events.Payload, error) {
	flushed := false
	var flushErr error
	if flush {
		flushErr = vmm.GuestFlush(ctx, m.Root.VsockSocket(id), m.FlushDeadline)
		flushed = flushErr == nil
	}
	c := vmm.NewClient(m.Root.APISocket(id))
	sctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	c.Shutdown(sctx)
	c.ShutdownVMM(sctx)
	cancel()
	if err := proc.Terminate(who, 5*time.Second); err != nil {
		return nil, fmt.Errorf("stop VMM pid %d: %w", who.Pid, err)
	}
	var ps []events.Payload
	sb, _ := m.Find(ctx, id)
	if flushed {
		ps = append(ps, events.FlushAcknowledgedEvent{Run: sb.LastRun, Overlay: m.rel(m.Root.WorkspaceDisk(id))})
	} else if flush {
		// docs/overlay.md: an unacknowledged run's overlay is trusted at
		// the next start only if it is clean and roomy.
		m.notice("%s stopped without a flush acknowledgement for run %s (%v): the guest's last writes may not be on its disks; the next start checks the workspace overlay and refuses it if its journal needs replay, its counts are stale or it is full (`nexus start --accept-unflushed %s` then replays and checks it on a private copy)", id, sb.LastRun, flushErr, id)
	}
	return append(ps, events.SandboxStoppedEvent{Reason: "stopped"}), nil
}

// reclaimVMMSockets removes the API and vsock sockets and the API
// socket's lock file, once the VMM is gone.
func (m *Manager) reclaimVMMSockets(id string, owned func(rel string) bool) ([]events.Payload, error) {
	var ps []events.Payload
	for _, r := range []events.Resource{
		m.res(events.KindAPISocket, m.Root.APISocket(id)), m.res(events.KindAPISocketLock, m.Root.APISocketLock(id)),
		m.res(events.KindVsockSocket, m.Root.VsockSocket(id)),
	} {
		more, err := m.reclaim(r, owned(r.Path), "stop")
		if err != nil {
			return ps, err
		}
		ps = append(ps, more...)
	}
	return ps, nil
}

// Start boots a stopped sandbox.
func (m *Manager) Start(ctx context.Context, ref string) (projections.Sandbox, error) {
	return m.StartWith(ctx, ref, StartOptions{})
}

// StartOptions are what `nexus start` may add.
type StartOptions struct {
	// AcceptUnflushed lets the overlay preparation treat a last run
	// without a flush acknowledgement as flushed: a journal needing replay
	// is replayed on a private copy, published only after the checks
	// (docs/overlay.md).
	AcceptUnflushed bool
}

// StartWith boots a stopped sandbox with options.
func (m *Manager) StartWith(ctx context.Context, ref string, opt StartOptions) (projections.Sandbox, error) {
	c, err := m.claim(ctx, ref, core.Start)
	if err != nil {
		return m.already(ctx, ref, err)
	}
	defer c.release()
	if c.sb.State == projections.StateExited {
		// An exited sandbox starts like one after a crash (lifecycle/exits.go):
		// settled under our lease, then decided again on what that left.
		if _, err := m.settleExited(ctx, c.sb); err != nil {
			return c.sb, err
		}
		if err := c.decide(ctx, m, c.sb.ID); err != nil {
			return c.sb, err
		}
	}
	sb := c.sb
	if err := m.bootable(core.Start, sb); err != nil {
		return sb, err
	}
	if err := m.refuseVolumesReadLocked(ctx, sb); err != nil {
		return sb, err
	}
	if _, err := ext4.Preflight(ctx); err != nil {
		if ctx.Err() != nil {
			return sb, notStarted(ctx, string(core.Start), err)
		}
		return sb, fmt.Errorf("%w: start %s: overlay preparation: %v", ErrRefused, sb.ID, err)
	}
	err = m.run(ctx, c, func(sb projections.Sandbox) *sagas.Saga {
		return m.saga(events.SagaStart, sb.ID, append(m.overlaySteps(sb, opt.AcceptUnflushed), m.bootSteps(sb.ID, "")...))
	})
	if err != nil {
		var refusal *OverlayRefusal
		if errors.As(err, &refusal) {
			if ferr := m.failStart(ctx, sb.ID, refusal); ferr != nil {
				err = errors.Join(err, ferr)
			}
			m.writeRecord(ctx, sb.ID)
		}
		return sb, err
	}
	return m.recordAndRead(ctx, sb.ID)
}

// refuseVolumesReadLocked refuses, before anything runs, the start of a
// sandbox that attaches a volume read-write while a running sandbox (a
// child forked with --readonly-volumes) has it attached read-only: that
// VMM holds a read lock on the image (Cloud Hypervisor v46+), so this
// VMM's write lock, and its boot, would fail.
func (m *Manager) refuseVolumesReadLocked(ctx context.Context, sb projections.Sandbox) error {
	var rw []string
	for _, v := range sb.Volumes {
		if !v.ReadOnly {
			rw = append(rw, v.Name)
		}
	}
	if len(rw) == 0 {
		return nil
	}
	// The volumes name who attaches them, so only those sandboxes are
	// read, not every sandbox of the root.
	vols, err := m.B.Volumes(ctx)
	if err != nil {
		return err
	}
	var holders []string
	for _, vol := range vols {
		if !slices.Contains(rw, vol.Name) {
			continue
		}
		for _, id := range vol.AttachedTo {
			if id == sb.ID {
				continue
			}
			other, found, err := m.B.Sandbox(ctx, id)
			if err != nil {
				return err
			}
			if found && other.State == projections.StateRunning && slices.ContainsFunc(other.Volumes, func(a projections.Attachment) bool { return a.Name == vol.Name }) {
				holders = append(holders, fmt.Sprintf("%s (volume %s)", other.ID, vol.Name))
			}
		}
	}
	if len(holders) == 0 {
		return nil
	}
	return fmt.Errorf("%w: sandbox %s attaches its volume(s) read-write, but running sandbox(es) %s hold them read-only, locked; stop those first", ErrRefused, sb.ID, strings.Join(holders, ", "))
}

// Stop shuts a running sandbox down: guest flush, VMM, sockets, supervisor.
func (m *Manager) Stop(ctx context.Context, ref string) (projections.Sandbox, error) {
	c, err := m.claim(ctx, ref, core.Stop)
	if err != nil {
		return m.already(ctx, ref, err)
	}
	defer c.release()
	err = m.run(ctx, c, func(sb projections.Sandbox) *sagas.Saga { return m.saga(events.SagaStop, sb.ID, m.stopSteps(sb)) })
	if err != nil {
		return c.sb, err
	}
	return m.recordAndRead(ctx, c.sb.ID)
}

// already returns the sandbox as it is with err when err is ErrAlready (the
// caller reports it and succeeds), and err alone otherwise.
func (m *Manager) already(ctx context.Context, ref string, err error) (projections.Sandbox, error) {
	if errors.Is(err, ErrAlready) {
		if sb, ferr := m.Lookup(ctx, ref); ferr == nil {
			return sb, err
		}
	}
	return projections.Sandbox{}, err
}

// stopSteps stop whatever of the sandbox still runs.
func (m *Manager) stopSteps(sb projections.Sandbox) []sagas.Step {
	var steps []sagas.Step
	if sb.VMM != nil {
		who := proc.Identity{Pid: sb.VMM.Pid, StartTicks: sb.VMM.StartTicks}
		// The acknowledgement and the stop are journaled as soon as the
		// VMM is gone, before the sockets are reclaimed, so a later
		// failure cannot lose a successful flush.
		steps = append(steps, sagas.Step{Name: "vmm-stop", Do: func(ctx context.Context) ([]events.Payload, error) {
			return m.terminateVMM(ctx, sb.ID, who, true)
		}})
	}
	if sb.VMM != nil || sb.Owns(m.rel(m.Root.APISocket(sb.ID))) || sb.Owns(m.rel(m.Root.APISocketLock(sb.ID))) || sb.Owns(m.rel(m.Root.VsockSocket(sb.ID))) {
		steps = append(steps, sagas.Step{Name: "vmm-sockets", Do: func(ctx context.Context) ([]events.Payload, error) {
			return m.reclaimVMMSockets(sb.ID, sb.Owns)
		}})
	}
	if sb.Supervisor != nil {
		who := proc.Identity{Pid: sb.Supervisor.Pid, StartTicks: sb.Supervisor.StartTicks}
		steps = append(steps, sagas.Step{Name: "supervisor-stop", Do: func(context.Context) ([]events.Payload, error) {
			ps, err := m.stopSupervisor(who)
			if err != nil {
				return ps, err
			}
			more, err := m.reclaim(m.res(events.KindIIDSocket, m.Root.IIDSocket(sb.ID)), sb.Owns(m.rel(m.Root.IIDSocket(sb.ID))), "stop")
			return append(ps, more...), err
		}})
	}
	return steps
}

var _ = fsx.Remove
