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

// InitConfig is what PID 1 mode does before serving.
type InitConfig struct {
	// ModuleList names a file listing kernel modules to load, one path a
	// line, in order (the initramfs builder writes it).
	ModuleList string
	// Mounts maps disk serials to where they are mounted (ext4).
	Mounts map[string]string
	// Wait bounds the wait for the disks and the agent port to appear.
	Wait time.Duration
}

// Init prepares a guest whose kernel started the agent as PID 1 of an
// initramfs: the pseudo-filesystems, the modules, the nexus disks found by
// serial and mounted.
func Init(cfg InitConfig) error {
	for _, m := range []struct{ src, dst, fstype string }{
		{"devtmpfs", "/dev", "devtmpfs"},
		{"proc", "/proc", "proc"},
		{"sysfs", "/sys", "sysfs"},
	} {
		os.MkdirAll(m.dst, 0o755)
		if err := unix.Mount(m.src, m.dst, m.fstype, 0, ""); err != nil && !errors.Is(err, unix.EBUSY) {
			return fmt.Errorf("mount %s: %w", m.dst, err)
		}
	}
	if cfg.ModuleList != "" {
		if err := loadModules(cfg.ModuleList); err != nil {
			return err
		}
	}
	deadline := time.Now().Add(cfg.Wait)
	for serial, dir := range cfg.Mounts {
		dev, err := waitDisk(serial, deadline)
		if err != nil {
			return err
		}
		os.MkdirAll(dir, 0o755)
		if err := unix.Mount(dev, dir, "ext4", 0, ""); err != nil {
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
