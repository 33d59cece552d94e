// Package config is the settings a command reads besides its flags: the
// config file ($NEXUS_CONFIG, else <state-root>/config.toml) and the
// environment variables that override it. The CLI and the Go client read
// them here, so a sandbox is made alike whichever of them makes it.
package config

import (
	"cmp"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/BurntSushi/toml"

	"github.com/nexus-sandbox/nexus/events"
	"github.com/nexus-sandbox/nexus/lifecycle"
)

// File is nexus's config file. A missing default file means every
// default; a named file must exist.
//
// The boot settings (driver, kernel, initramfs, cmdline, cpus, memory) are
// what a NEW sandbox records; every later boot of it, and of its fork and
// restore children, uses its record.
//
//	[vm]
//	overlay_disk_mib = 256          # size of a NEW sandbox's overlay; existing ones keep theirs
//	overlay_warn_fill_ratio = 0.9   # start warns (OverlayNearlyFull) at this fill ratio
//	driver = "qemu"                 # VMM driver (env NEXUS_DRIVER, then --driver, win)
//	kernel = "/path/vmlinuz"        # guest kernel (env NEXUS_KERNEL_PATH wins)
//	initramfs = "/path/initrd"      # guest initramfs (env NEXUS_INITRAMFS_PATH wins)
//	cmdline = "console=ttyS0 ..."   # guest kernel command line (env NEXUS_KERNEL_CMDLINE wins)
//	cpus = 2                        # vCPUs (create --cpus wins)
//	memory = "1G"                   # guest memory (create --memory wins)
//	root = "copy"                   # a private copy of the OS disk, not the overlay root (env NEXUS_VM_ROOT wins)
//
// The fleet settings are what every daemon of the root mirrors with, the
// ones commands start on demand included (the daemon's flags and
// NEXUS_MIRROR win):
//
//	[fleet]
//	urls = ["nats-leaf://fleet-1:7422", "nats-leaf://fleet-2:7422"]
//	host = "web-7"                  # this host's name in the fleet (default: the hostname)
//	credentials = "/etc/nexus/fleet.creds"
//	domain = "fleet"
//	replicas = 3
//	max_bytes = "10G"
type File struct {
	VM struct {
		OverlayDiskMiB       int64   `toml:"overlay_disk_mib"`
		OverlayWarnFillRatio float64 `toml:"overlay_warn_fill_ratio"`
		Driver               string  `toml:"driver"`
		Kernel               string  `toml:"kernel"`
		Initramfs            string  `toml:"initramfs"`
		Cmdline              string  `toml:"cmdline"`
		Cpus                 int     `toml:"cpus"`
		Memory               string  `toml:"memory"`
		Root                 string  `toml:"root"`
	} `toml:"vm"`
	Fleet struct {
		URLs        []string `toml:"urls"`
		Host        string   `toml:"host"`
		Credentials string   `toml:"credentials"`
		Domain      string   `toml:"domain"`
		Replicas    int      `toml:"replicas"`
		MaxBytes    string   `toml:"max_bytes"`
	} `toml:"fleet"`
}

// Source is where the config came from: the file and which of its keys
// it set (the rest are defaults).
type Source struct {
	Path    string
	Named   bool // $NEXUS_CONFIG, which must exist
	Exists  bool
	Defined map[string]bool // "vm.overlay_disk_mib" → set in the file
}

// Load reads the config of the state root root and checks every setting
// it defines.
func Load(root string) (File, Source, error) {
	var c File
	path, named := os.Getenv("NEXUS_CONFIG"), true
	if path == "" {
		path, named = filepath.Join(root, lifecycle.ConfigFile), false
	}
	var md toml.MetaData
	var err error
	if named {
		md, err = toml.DecodeFile(path, &c)
	} else {
		// nexus's own file, read as every file under the root is.
		var data []byte
		if data, err = lifecycle.ReadConfig(root); err == nil {
			md, err = toml.Decode(string(data), &c)
		}
	}
	src := Source{Path: path, Named: named, Defined: map[string]bool{}}
	switch {
	case errors.Is(err, os.ErrNotExist) && !named:
		return File{}, src, nil
	case err != nil:
		return c, src, fmt.Errorf("config %s: %s", path, strings.ReplaceAll(err.Error(), "\n", " "))
	}
	src.Exists = true
	for _, k := range md.Keys() {
		src.Defined[k.String()] = true
	}
	if extra := md.Undecoded(); len(extra) > 0 {
		keys := make([]string, len(extra))
		for i, k := range extra {
			keys[i] = k.String()
		}
		return c, src, fmt.Errorf("config %s: unknown key %s", path, strings.Join(keys, ", "))
	}
	if v := c.VM.OverlayDiskMiB; md.IsDefined("vm", "overlay_disk_mib") && lifecycle.CheckOverlayMiB(v) != nil {
		return c, src, fmt.Errorf("config %s: [vm] overlay_disk_mib = %d: want %d to %d", path, v, lifecycle.MinOverlayMiB, lifecycle.MaxOverlayMiB)
	}
	if v := c.VM.OverlayWarnFillRatio; md.IsDefined("vm", "overlay_warn_fill_ratio") && lifecycle.CheckWarnFillRatio(v) != nil {
		return c, src, fmt.Errorf("config %s: [vm] overlay_warn_fill_ratio = %g: want a ratio in (0, 1]", path, v)
	}
	for key, v := range map[string]string{"initramfs": c.VM.Initramfs, "kernel": c.VM.Kernel} {
		if md.IsDefined("vm", key) && !filepath.IsAbs(v) {
			return c, src, fmt.Errorf("config %s: [vm] %s = %q: want an absolute path", path, key, v)
		}
	}
	if v := c.VM.Driver; md.IsDefined("vm", "driver") {
		if err := CheckDriver(v); err != nil {
			return c, src, fmt.Errorf("config %s: [vm] driver = %q: %v", path, v, err)
		}
	}
	if v := c.VM.Cpus; md.IsDefined("vm", "cpus") && v < 1 {
		return c, src, fmt.Errorf("config %s: [vm] cpus = %d: want at least 1", path, v)
	}
	if v := c.VM.Root; md.IsDefined("vm", "root") && v != events.RootOverlay && v != events.RootCopy {
		return c, src, fmt.Errorf("config %s: [vm] root = %q: want %s", path, v, OneOf([]string{events.RootOverlay, events.RootCopy}))
	}
	if v := c.VM.Memory; md.IsDefined("vm", "memory") {
		if _, err := ParseSize(v); err != nil {
			return c, src, fmt.Errorf("config %s: [vm] memory = %q: %v", path, v, err)
		}
	}
	return c, src, nil
}

// MemoryBytes is [vm] memory in bytes (0: not set); Load has checked that
// it parses.
func (c File) MemoryBytes() int64 {
	if c.VM.Memory == "" {
		return 0
	}
	n, _ := ParseSize(c.VM.Memory)
	return n
}

// RootMode is how a new sandbox's root is made, as asked ("": as its
// guest allows, core.RootMode): the environment overrides the file.
func (c File) RootMode() string {
	return cmp.Or(os.Getenv("NEXUS_VM_ROOT"), c.VM.Root)
}

// BootAssets are the kernel, initramfs and command line a new sandbox
// records: the environment overrides the file.
func (c File) BootAssets() (kernel, initramfs, cmdline string) {
	return cmp.Or(os.Getenv("NEXUS_KERNEL_PATH"), c.VM.Kernel),
		cmp.Or(os.Getenv("NEXUS_INITRAMFS_PATH"), c.VM.Initramfs),
		cmp.Or(os.Getenv("NEXUS_KERNEL_CMDLINE"), c.VM.Cmdline)
}

// DriverName is the driver a new sandbox is made with: asked (a flag, or
// NEXUS_DRIVER), else [vm] driver, else the default.
func (c File) DriverName(asked string) string {
	return Driver(cmp.Or(asked, c.VM.Driver))
}

// Manager is the manager of a command's flows: m (its root, backend,
// driver name and binary, and whatever the command sets) with real
// processes and the defaults of the file and the environment. The CLI and
// the Go client build theirs with it.
func (c File) Manager(m lifecycle.Manager) (*lifecycle.Manager, error) {
	m.Launcher = lifecycle.Spawner{}
	c.Defaults(&m)
	return lifecycle.New(m)
}

// Defaults sets what a new sandbox of m is made with and every boot of m
// runs, from the file and the environment: the driver's kernel,
// initramfs, command line and VMM binaries, the sizing, the root mode and
// the overlay's size and warning ratio. m's driver name is kept.
func (c File) Defaults(m *lifecycle.Manager) {
	m.Driver.Kernel, m.Driver.Initramfs, m.Driver.Cmdline = c.BootAssets()
	m.Driver.CHBinary = os.Getenv("NEXUS_CH_BINARY")
	m.Driver.QEMU = os.Getenv("NEXUS_QEMU_BINARY")
	m.Cpus, m.MemoryBytes, m.RootMode = c.VM.Cpus, c.MemoryBytes(), c.RootMode()
	m.OverlayMiB, m.WarnFillRatio = c.VM.OverlayDiskMiB, c.VM.OverlayWarnFillRatio
}

// OneOf lists names for a message: "a, b or c".
func OneOf(names []string) string {
	if len(names) < 2 {
		return strings.Join(names, "")
	}
	return strings.Join(names[:len(names)-1], ", ") + " or " + names[len(names)-1]
}
