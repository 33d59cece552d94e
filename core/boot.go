package core

import (
	"fmt"

	"github.com/nexus-sandbox/nexus/events"
	"github.com/nexus-sandbox/nexus/projections"
)

// DecideDriver says whether cmd may boot sb (start it, or boot a fork or
// restore child of it) when the command asked for driver asked ("": it
// asked for none). A sandbox boots under the driver its record names, so
// one asked for explicitly that differs is refused, naming the recorded
// one; a sandbox whose record names none (a history made by hand) boots
// under whatever is asked.
func DecideDriver(cmd Command, sb projections.Sandbox, asked string) error {
	if asked == "" || sb.Driver == "" || asked == sb.Driver {
		return nil
	}
	return &Refusal{Command: cmd, Entity: Sandbox(sb.ID),
		Reason: fmt.Sprintf("it boots under the %s driver, recorded when it was made, not %s: leave out --driver (or give --driver %s)", sb.Driver, asked, sb.Driver)}
}

// The bounds of a guest's size that hold on every host: CH and QEMU both
// take memory in whole MiB here, and a Linux guest with its initramfs
// needs some room to boot at all.
const (
	MinGuestMemory  = 64 << 20
	GuestMemoryUnit = 1 << 20
)

// CheckSizing refuses a guest of cpus vCPUs and memory bytes that its host
// (hostCPUs CPUs, hostMemory bytes) cannot hold: more vCPUs than the host
// has CPUs, or more memory than it has. The refusal names both figures.
func CheckSizing(cpus int, memory int64, hostCPUs int, hostMemory int64) error {
	switch {
	case cpus < 1:
		return fmt.Errorf("%d vCPUs: want at least 1", cpus)
	case cpus > hostCPUs:
		return fmt.Errorf("%d vCPUs is more than this host's %d CPUs", cpus, hostCPUs)
	case memory < MinGuestMemory:
		return fmt.Errorf("memory %d bytes: want at least %s", memory, mib(MinGuestMemory))
	case memory%GuestMemoryUnit != 0:
		return fmt.Errorf("memory %d bytes: want a whole number of MiB", memory)
	case memory > hostMemory:
		return fmt.Errorf("memory %s is more than this host's %s", mib(memory), mib(hostMemory))
	}
	return nil
}

// mib prints a size in whole MiB, rounded down (the unit guests are sized
// in), or in GiB when it is a whole number of them.
func mib(n int64) string {
	if n >= 1<<30 && n%(1<<30) == 0 {
		return fmt.Sprintf("%d GiB", n>>30)
	}
	return fmt.Sprintf("%d MiB", n>>20)
}

// RootMode is how a new sandbox's root is made (events.BootConfig.Root),
// from the setting asked ("" for none, else events.RootOverlay or
// events.RootCopy) and whether its guest runs nexus's agent as init. Only
// that agent, as PID 1, puts an overlay over the read-only OS disk, so a
// guest that boots without it gets a private copy, and an overlay asked
// for it is refused; with the agent, a copy is made only when asked.
func RootMode(asked string, agentIsInit bool) (string, error) {
	switch {
	case asked == events.RootCopy:
		return events.RootCopy, nil
	case asked != "" && asked != events.RootOverlay:
		return "", fmt.Errorf("root %q: want %s or %s", asked, events.RootOverlay, events.RootCopy)
	case agentIsInit:
		return events.RootOverlay, nil
	case asked == events.RootOverlay:
		return "", fmt.Errorf("root %s needs nexus's agent as the guest's init (an initramfs from `nexus guest initramfs`): this guest boots its kernel without one, and would write its root directly", events.RootOverlay)
	default:
		return events.RootCopy, nil
	}
}
