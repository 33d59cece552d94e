package lifecycle

import (
	"errors"
	"testing"

	"github.com/nexus-sandbox/nexus/events"
	"github.com/nexus-sandbox/nexus/host/driver"
	"github.com/nexus-sandbox/nexus/projections"
)

// TestBootOf: a sandbox boots as its record says, whatever the booting
// command's settings; one whose record predates boot configurations boots
// with the command's kernel, initramfs and command line and the size
// every VM had then.
func TestBootOf(t *testing.T) {
	m := &Manager{Driver: driver.Driver{Name: driver.CloudHypervisor, Exe: "/usr/bin/nexus", Kernel: "/cmd/vmlinuz", Initramfs: "/cmd/initrd", Cmdline: "console=ttyS0 cmd"},
		Cpus: 4, MemoryBytes: 2 << 30}
	recorded := projections.Sandbox{ID: "A", Driver: driver.QEMU,
		BootConfig: events.BootConfig{Kernel: "/rec/vmlinuz", Initramfs: "/rec/initrd", Cmdline: "console=ttyS0 rec", Cpus: 2, MemoryBytes: 1 << 30}}
	d, b := m.bootOf(recorded)
	if d.Name != driver.QEMU || d.Kernel != "/rec/vmlinuz" || d.Initramfs != "/rec/initrd" || d.Cmdline != "console=ttyS0 rec" || d.Exe != "/usr/bin/nexus" || b != recorded.BootConfig {
		t.Fatalf("recorded sandbox boots as %+v, %+v", d, b)
	}
	d, b = m.bootOf(projections.Sandbox{ID: "B", Driver: driver.Process})
	if d.Name != driver.Process || d.Kernel != "/cmd/vmlinuz" || d.Initramfs != "/cmd/initrd" || d.Cmdline != "console=ttyS0 cmd" || b.Cpus != DefaultCpus || b.MemoryBytes != DefaultMemory {
		t.Fatalf("a sandbox without a recorded boot configuration boots as %+v, %+v", d, b)
	}
	// A new sandbox records the manager's settings, its size from the
	// create, else the manager's, else the default.
	if b, err := m.newBoot(0, 0); err != nil || b != (events.BootConfig{Kernel: "/cmd/vmlinuz", Initramfs: "/cmd/initrd", Cmdline: "console=ttyS0 cmd", Cpus: 4, MemoryBytes: 2 << 30, Root: events.RootOverlay}) {
		t.Fatalf("newBoot(0, 0) = %+v, %v", b, err)
	}
	if b, err := (&Manager{}).newBoot(3, 0); err != nil || b.Cpus != 3 || b.MemoryBytes != DefaultMemory || b.Cmdline != DefaultCmdline {
		t.Fatalf("newBoot(3, 0) of a manager without settings = %+v, %v", b, err)
	}
	// A kernel booted without an initramfs runs no nexus agent as init:
	// its root is a private copy, and an overlay asked for it is refused.
	bare := &Manager{Driver: driver.Driver{Name: driver.QEMU, Kernel: "/k"}}
	if b, err := bare.newBoot(0, 0); err != nil || b.Root != events.RootCopy {
		t.Fatalf("newBoot of a guest without the agent = %+v, %v", b, err)
	}
	bare.RootMode = events.RootOverlay
	if _, err := bare.newBoot(0, 0); !errors.Is(err, ErrRefused) {
		t.Fatalf("an overlay root for a guest without the agent: %v, want refused", err)
	}
	m.RootMode = events.RootCopy
	if b, _ := m.newBoot(0, 0); b.Root != events.RootCopy {
		t.Fatalf("newBoot with root = copy: %+v", b)
	}
}
