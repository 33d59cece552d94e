package lifecycle

import (
	"cmp"
	"fmt"

	"github.com/nexus-sandbox/nexus/core"
	"github.com/nexus-sandbox/nexus/events"
	"github.com/nexus-sandbox/nexus/host/driver"
	"github.com/nexus-sandbox/nexus/projections"
)

// A sandbox's size when its create named none (no flag, no setting), and
// the size of every sandbox whose record predates sizing: what every VM
// had then. DefaultMemory is also the size of the memory-ranges file a
// snapshot of such a guest writes.
const (
	DefaultCpus   = 1
	DefaultMemory = 512 << 20
)

// Sizing is the size of a new sandbox asked for cpus and memory (zero: the
// manager's setting, else the default), or why this host cannot hold it
// (core.CheckSizing): a caller's bad input, checked before anything runs.
func (m *Manager) Sizing(cpus int, memory int64) (int, int64, error) {
	cpus, memory = cmp.Or(cpus, m.Cpus, DefaultCpus), cmp.Or(memory, m.MemoryBytes, DefaultMemory)
	hostCPUs, hostMemory, err := driver.HostSize()
	if err != nil {
		return 0, 0, err
	}
	if err := core.CheckSizing(cpus, memory, hostCPUs, hostMemory); err != nil {
		return 0, 0, err
	}
	return cpus, memory, nil
}

// newBoot is the boot configuration a new sandbox records: this manager's
// kernel, initramfs and command line, and the size asked for (zero: the
// manager's setting, else the default). Driver is recorded beside it, in the commit event.
func (m *Manager) newBoot(cpus int, memory int64) (events.BootConfig, error) {
	b := events.BootConfig{Kernel: m.Driver.Kernel, Initramfs: m.Driver.Initramfs, Cmdline: m.Driver.Cmdline}
	if b.Cmdline == "" {
		b.Cmdline = DefaultCmdline
	}
	b.Cpus, b.MemoryBytes = cmp.Or(cpus, m.Cpus, DefaultCpus), cmp.Or(memory, m.MemoryBytes, DefaultMemory)
	root, err := core.RootMode(m.RootMode, agentIsInit(m.Driver))
	if err != nil {
		return b, fmt.Errorf("%w: %v", ErrRefused, err)
	}
	b.Root = root
	return b, nil
}

// bootOf is how sb boots: the driver and boot configuration its record
// names. What the record lacks (a sandbox made before they were recorded)
// comes from this manager's settings, and the default size, as its boots
// did then. The binaries (nexus, cloud-hypervisor, qemu) are this host's.
func (m *Manager) bootOf(sb projections.Sandbox) (driver.Driver, events.BootConfig) {
	d, b := m.Driver, sb.BootConfig
	if sb.Driver != "" {
		d.Name = sb.Driver
	}
	if b.Kernel != "" {
		d.Kernel = b.Kernel
	}
	if b.Initramfs != "" {
		d.Initramfs = b.Initramfs
	}
	if b.Cmdline != "" {
		d.Cmdline = b.Cmdline
	}
	b.Cpus, b.MemoryBytes = cmp.Or(b.Cpus, DefaultCpus), cmp.Or(b.MemoryBytes, DefaultMemory)
	return d, b
}

// HostGuestNotice is what a command that boots or reaches a sandbox of a
// driver without a VM tells its operator (once per command: the notice is
// the same for every such sandbox).
const HostGuestNotice = "the process driver runs a sandbox's guest as a process on this host, not in a VM: exec and cp act on this host's files as the user nexus runs as"

func (m *Manager) noticeHostGuest(sb projections.Sandbox) {
	if d, _ := m.bootOf(sb); !d.IsolatesGuest() {
		m.notice("%s", HostGuestNotice)
	}
}

// bootable refuses cmd's boot of sb (its start, or a fork or restore child
// of it) under a driver other than its record's (core.DecideDriver), or
// under one this host cannot run, before anything is written.
func (m *Manager) bootable(cmd core.Command, sb projections.Sandbox) error {
	if err := core.DecideDriver(cmd, sb, m.AskedDriver); err != nil {
		return err
	}
	d, _ := m.bootOf(sb)
	// A child's API socket has the length of its parent's.
	if err := d.Preflight(m.Root.APISocket(sb.ID)); err != nil {
		return fmt.Errorf("%w: %v", ErrRefused, err)
	}
	return nil
}
