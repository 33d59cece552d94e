// Package driver names the VMMs a sandbox can run in (cloud-hypervisor,
// qemu, process) and, for each, the command line that starts its VMM on
// an API socket and how a process so started is recognised. Every driver
// is driven through the same Cloud Hypervisor REST API on that socket;
// only the binary, its arguments and the kernel requirement differ.
package driver

import (
	"fmt"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"

	"golang.org/x/sys/unix"

	"github.com/nexus-sandbox/nexus/host/fsx"
	"github.com/nexus-sandbox/nexus/host/proc"
)

const (
	CloudHypervisor = "cloud-hypervisor"
	Process         = "process"
	// QEMU runs nexus's own adapter (`nexus vmm-qemu`), which serves the
	// same API and runs qemu-system-x86_64 underneath.
	QEMU = "qemu"

	// Default is the driver used when none is named.
	Default = CloudHypervisor
)

// Names lists every driver, in the order a person is shown them.
var Names = []string{CloudHypervisor, Process, QEMU}

// Known reports whether name is a driver.
func Known(name string) bool { return slices.Contains(Names, name) }

// The nexus subcommands that serve the process and qemu drivers' VMMs,
// and the flags every VMM command line carries (cloud-hypervisor's own
// flag names, which nexus's VMMs take too).
const (
	ProcessCommand    = "vmm-process"
	QEMUCommand       = "vmm-qemu"
	APISocketFlag     = "api-socket"
	QEMUBinaryFlag    = "qemu"
	DefaultCHBinary   = "cloud-hypervisor"
	DefaultQEMUBinary = "qemu-system-x86_64"
)

// Driver is the VMM nexus spawns for a sandbox.
type Driver struct {
	Name      string // one of Names
	Exe       string // nexus-shim: the process and qemu drivers' VMM, and every supervisor
	CHBinary  string // cloud-hypervisor, for the cloud-hypervisor driver
	Kernel    string // NEXUS_KERNEL_PATH, for the drivers that boot a guest
	Initramfs string // optional; a distro kernel needs one to load its virtio modules
	Cmdline   string // the guest kernel's command line; lifecycle's default when empty
	QEMU      string // qemu-system-x86_64, for the qemu driver
}

// BootsKernel reports whether the driver boots a real guest kernel (the
// process driver boots none).
func (d Driver) BootsKernel() bool { return d.Name != Process }

// IsolatesGuest reports whether the driver's guest runs in a VM. The
// process driver's "guest" is a process on this host: its commands run
// with the host's files and the user nexus runs as.
func (d Driver) IsolatesGuest() bool { return d.Name != Process }

// Preflight refuses a driver that cannot boot anything, or cannot serve
// its API on apiSocket (the sandbox's, layout.Root.APISocket), before any
// byte of a sandbox is written.
func (d Driver) Preflight(apiSocket string) error {
	switch d.Name {
	case Process:
		return nil
	case CloudHypervisor:
		if err := CHAPISocket(apiSocket); err != nil {
			return err
		}
		if err := d.assets(); err != nil {
			return err
		}
		if _, err := exec.LookPath(d.chBinary()); err != nil {
			return fmt.Errorf("cloud-hypervisor driver: %v", err)
		}
		return nil
	case QEMU:
		if err := d.assets(); err != nil {
			return err
		}
		if _, err := exec.LookPath(d.qemuBinary()); err != nil {
			return fmt.Errorf("qemu driver: %v", err)
		}
		return nil
	default:
		return fmt.Errorf("unknown driver %q", d.Name)
	}
}

// sunPathMax is the room in sockaddr_un.sun_path for a path and its NUL.
const sunPathMax = len(unix.RawSockaddrUnix{}.Path)

// CHAPISocket refuses an API socket path Cloud Hypervisor cannot serve on.
// CH binds the path as given, without the detour through a directory
// descriptor that nexus's own sockets take (host/unixsock), so the path
// and its NUL must fit sun_path. CH v53 reads --api-socket as options
// (path=..., fd=...) and takes the whole argument as the path only when
// that parse fails (parse_api_socket, option_parser): an absolute path
// fails it at its first item, as "/..." names no option, whatever commas
// or '=' follow; a relative one (fd=3, path=x,...) could be read as
// options. So the path must be absolute and short enough.
func CHAPISocket(path string) error {
	if !filepath.IsAbs(path) {
		return fmt.Errorf("cloud-hypervisor driver: API socket %s is not an absolute path: cloud-hypervisor could read it as its path=/fd= options", path)
	}
	if len(path) >= sunPathMax {
		return fmt.Errorf("cloud-hypervisor driver: API socket %s is %d bytes, and cloud-hypervisor binds it by name, which holds at most %d (sun_path): use a state root at least %d bytes shorter (--state-dir)", path, len(path), sunPathMax-1, len(path)-sunPathMax+1)
	}
	return nil
}

// assets checks the kernel (required) and the initramfs (if any) of a
// driver that boots a real guest.
func (d Driver) assets() error {
	if d.Kernel == "" {
		return fmt.Errorf("NEXUS_KERNEL_PATH is not set: the %s driver needs a guest kernel (or use --driver process)", d.Name)
	}
	if err := fsx.RegularFile(d.Kernel); err != nil {
		return fmt.Errorf("NEXUS_KERNEL_PATH: %v", err)
	}
	if d.Initramfs != "" {
		if err := fsx.RegularFile(d.Initramfs); err != nil {
			return fmt.Errorf("initramfs: %v", err)
		}
	}
	return nil
}

func (d Driver) chBinary() string {
	if d.CHBinary != "" {
		return d.CHBinary
	}
	return DefaultCHBinary
}

func (d Driver) qemuBinary() string {
	if d.QEMU != "" {
		return d.QEMU
	}
	return DefaultQEMUBinary
}

// SignalsReady reports whether the driver's VMM is nexus's own, which
// says when it serves on the readiness pipe it is spawned with
// (proc.SpawnReady); cloud-hypervisor's is waited for by asking its API
// socket.
func (d Driver) SignalsReady() bool { return d.Name != CloudHypervisor }

// Argv is the command line that starts the driver's VMM serving its API
// on apiSocket.
func (d Driver) Argv(apiSocket string) []string {
	switch d.Name {
	case CloudHypervisor:
		return append([]string{d.chBinary()}, d.naming(apiSocket)...)
	case QEMU:
		return append(append([]string{d.Exe}, d.naming(apiSocket)...), "--"+QEMUBinaryFlag, d.qemuBinary())
	}
	return append([]string{d.Exe}, d.naming(apiSocket)...)
}

// naming is the part of Argv after the binary that names the VMM: its
// subcommand, if any, and its API socket. A process whose arguments start
// so is this driver's VMM of that socket, whichever binary runs it.
func (d Driver) naming(apiSocket string) []string {
	api := []string{"--" + APISocketFlag, apiSocket}
	switch d.Name {
	case CloudHypervisor:
		return api
	case QEMU:
		return append([]string{QEMUCommand}, api...)
	}
	return append([]string{ProcessCommand}, api...)
}

// Runs reports whether argv, a process's command line, is this driver's
// VMM serving apiSocket, as Argv started it.
func (d Driver) Runs(argv []string, apiSocket string) bool {
	return proc.HasArgs(argv, d.naming(apiSocket)...)
}

// VMMs lists the processes that run a VMM of any driver on apiSocket, by
// their command lines (one scan of /proc): how a VMM spawned just before
// its spawner died is found before it answers on its socket. The binary
// is not compared, so a VMM is found whatever binary started it.
func VMMs(apiSocket string) []int {
	return proc.Matching(func(argv []string) bool {
		for _, name := range Names {
			if (Driver{Name: name}).Runs(argv, apiSocket) {
				return true
			}
		}
		return false
	})
}

// HostSize is what a guest's size is checked against: the CPUs this
// process may run on (its affinity, as runtime.NumCPU reads it) and the
// host's total memory.
func HostSize() (cpus int, memory int64, err error) {
	var si unix.Sysinfo_t
	if err := unix.Sysinfo(&si); err != nil {
		return 0, 0, fmt.Errorf("host memory: %w", err)
	}
	return runtime.NumCPU(), int64(si.Totalram) * int64(si.Unit), nil
}
