package core

import (
	"fmt"

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
