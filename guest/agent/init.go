package agent

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// Kernel command-line keys PID 1 mode reads (from /proc/cmdline, where
// dotted keys the kernel does not know stay visible).
const (
	// CmdlineWorkspace moves the workspace mount: nexus.workspace=/path.
	CmdlineWorkspace = "nexus.workspace="
	// CmdlineMount mounts a disk by serial: nexus.mount=SERIAL:/path
	// (repeatable), for volumes at their guest paths.
	CmdlineMount = "nexus.mount="
)

// ParseCmdline returns the mounts a kernel command line asks for: the
// workspace (nexus-workspace at /workspace unless moved) and every
// nexus.mount. A malformed entry is an error, not a guess.
func ParseCmdline(cmdline, workspaceSerial string) (map[string]string, error) {
	mounts := map[string]string{workspaceSerial: "/workspace"}
	for _, f := range strings.Fields(cmdline) {
		switch {
		case strings.HasPrefix(f, CmdlineWorkspace):
			p := strings.TrimPrefix(f, CmdlineWorkspace)
			if !filepath.IsAbs(p) {
				return nil, fmt.Errorf("%s: want an absolute path", f)
			}
			mounts[workspaceSerial] = filepath.Clean(p)
		case strings.HasPrefix(f, CmdlineMount):
			serial, p, ok := strings.Cut(strings.TrimPrefix(f, CmdlineMount), ":")
			if !ok || serial == "" || !filepath.IsAbs(p) {
				return nil, fmt.Errorf("%s: want SERIAL:/path", f)
			}
			if _, dup := mounts[serial]; dup {
				return nil, fmt.Errorf("%s: disk %s is mounted twice", f, serial)
			}
			mounts[serial] = filepath.Clean(p)
		}
	}
	return mounts, nil
}

// MountPseudo mounts what an initramfs's PID 1 lacks: devtmpfs, proc,
// sysfs, and devpts (the terminals `exec` with tty allocates).
func MountPseudo() error {
	for _, m := range []struct{ src, dst, fstype string }{
		{"devtmpfs", "/dev", "devtmpfs"},
		{"proc", "/proc", "proc"},
		{"sysfs", "/sys", "sysfs"},
		{"devpts", "/dev/pts", "devpts"},
	} {
		os.MkdirAll(m.dst, 0o755)
		if err := unix.Mount(m.src, m.dst, m.fstype, 0, ""); err != nil && !errors.Is(err, unix.EBUSY) {
			return fmt.Errorf("mount %s: %w", m.dst, err)
		}
	}
	return nil
}

// LoadModules loads the modules a list file names, one path a line, in
// order (the initramfs builder writes it); a missing list loads nothing.
func LoadModules(list string) error { return loadModules(list) }

// MountDisks mounts each disk, found by its serial, on its directory
// (ext4; read-only when the VMM attached it read-only), waiting up to wait
// for the disks to appear.
func MountDisks(mounts map[string]string, wait time.Duration) error {
	deadline := time.Now().Add(wait)
	for serial, dir := range mounts {
		dev, err := waitDisk(serial, deadline)
		if err != nil {
			return err
		}
		os.MkdirAll(dir, 0o755)
		var flags uintptr
		if ro, _ := os.ReadFile("/sys/block/" + filepath.Base(dev) + "/ro"); strings.TrimSpace(string(ro)) == "1" {
			flags = unix.MS_RDONLY
		}
		if err := unix.Mount(dev, dir, "ext4", flags, ""); err != nil {
			return fmt.Errorf("mount %s (%s) on %s: %w", dev, serial, dir, err)
		}
	}
	return nil
}

func loadModules(list string) error {
	f, err := os.Open(list)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil
		}
		return err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		p := strings.TrimSpace(sc.Text())
		if p == "" {
			continue
		}
		m, err := os.Open(p)
		if err != nil {
			return fmt.Errorf("module %s: %w", p, err)
		}
		err = unix.FinitModule(int(m.Fd()), "", 0)
		m.Close()
		if err != nil && !errors.Is(err, unix.EEXIST) {
			return fmt.Errorf("load module %s: %w", p, err)
		}
	}
	return sc.Err()
}

// DiskBySerial returns /dev/<name> of the block device whose virtio serial
// is serial, or "" when none is there (yet).
func DiskBySerial(serial string) string {
	paths, _ := filepath.Glob("/sys/block/*/serial")
	for _, p := range paths {
		b, err := os.ReadFile(p)
		if err == nil && strings.TrimSpace(string(b)) == serial {
			return "/dev/" + filepath.Base(filepath.Dir(p))
		}
	}
	return ""
}

func waitDisk(serial string, deadline time.Time) (string, error) {
	for {
		if dev := DiskBySerial(serial); dev != "" {
			return dev, nil
		}
		if time.Now().After(deadline) {
			return "", fmt.Errorf("no disk with serial %s appeared", serial)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// PortByName returns the /dev node of the virtio-serial port named name
// (what udev would link as /dev/virtio-ports/<name>; an initramfs has no
// udev), waiting until deadline.
func PortByName(name string, deadline time.Time) (string, error) {
	for {
		paths, _ := filepath.Glob("/sys/class/virtio-ports/*/name")
		for _, p := range paths {
			b, err := os.ReadFile(p)
			if err == nil && strings.TrimSpace(string(b)) == name {
				return "/dev/" + filepath.Base(filepath.Dir(p)), nil
			}
		}
		if time.Now().After(deadline) {
			return "", fmt.Errorf("no virtio-serial port named %s appeared", name)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
