package main

import (
	"cmp"
	"errors"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"strings"

	"github.com/BurntSushi/toml"
	"github.com/spf13/cobra"

	"github.com/nexus-sandbox/nexus/events"
	"github.com/nexus-sandbox/nexus/host/driver"
	"github.com/nexus-sandbox/nexus/lifecycle"
)

// Config is nexus's config file: $NEXUS_CONFIG, else <state-root>/config.toml.
// A missing default file means every default; a named file must exist.
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
type Config struct {
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

// rootMode is how a new sandbox's root is made, as asked ("": as its
// guest allows, core.RootMode): the environment overrides the file.
func rootMode(cfg Config) string {
	if v := os.Getenv("NEXUS_VM_ROOT"); v != "" {
		return v
	}
	return cfg.VM.Root
}

// bootAssets is the kernel, initramfs and command line a new sandbox
// records: the environment overrides the file.
func bootAssets(cfg Config) (kernel, initramfs, cmdline string) {
	kernel, initramfs, cmdline = cfg.VM.Kernel, cfg.VM.Initramfs, cfg.VM.Cmdline
	if v := os.Getenv("NEXUS_KERNEL_PATH"); v != "" {
		kernel = v
	}
	if v := os.Getenv("NEXUS_INITRAMFS_PATH"); v != "" {
		initramfs = v
	}
	if v := os.Getenv("NEXUS_KERNEL_CMDLINE"); v != "" {
		cmdline = v
	}
	return kernel, initramfs, cmdline
}

// driverName is the driver a new sandbox is made with: --driver, else
// NEXUS_DRIVER (both in g.driver), else [vm] driver, else the default.
func driverName(g *globals, cfg Config) string {
	return cmp.Or(g.driver, cfg.VM.Driver, driver.Default)
}

// configReaders are the commands that read a config setting (both size
// and warn ratio apply to new overlays and to start's overlay check; the
// boot assets to every cold boot, a fork of a stopped parent's too). Only
// they are refused by a broken config file: a typo in a setting for new
// sandboxes must not stop stop, rm, recover or ls.
var configReaders = map[string]bool{"create": true, "start": true, "fork": true, "restore": true}

// configFile is where the config came from: the file and which of its
// keys it set (the rest are defaults).
type configFile struct {
	Path    string
	Named   bool // $NEXUS_CONFIG, which must exist
	Exists  bool
	Defined map[string]bool // "vm.overlay_disk_mib" → set in the file
}

func loadConfig(root string) (Config, error) {
	c, _, err := loadConfigFile(root)
	return c, err
}

func loadConfigFile(root string) (Config, configFile, error) {
	var c Config
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
	src := configFile{Path: path, Named: named, Defined: map[string]bool{}}
	switch {
	case errors.Is(err, os.ErrNotExist) && !named:
		return Config{}, src, nil
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
	if v := c.VM.Driver; md.IsDefined("vm", "driver") && !driver.Known(v) {
		return c, src, fmt.Errorf("config %s: [vm] driver = %q: want %s", path, v, oneOf(driver.Names))
	}
	if v := c.VM.Cpus; md.IsDefined("vm", "cpus") && v < 1 {
		return c, src, fmt.Errorf("config %s: [vm] cpus = %d: want at least 1", path, v)
	}
	if v := c.VM.Root; md.IsDefined("vm", "root") && v != events.RootOverlay && v != events.RootCopy {
		return c, src, fmt.Errorf("config %s: [vm] root = %q: want %s", path, v, oneOf([]string{events.RootOverlay, events.RootCopy}))
	}
	if v := c.VM.Memory; md.IsDefined("vm", "memory") {
		if _, err := parseSize(v); err != nil {
			return c, src, fmt.Errorf("config %s: [vm] memory = %q: %v", path, v, err)
		}
	}
	return c, src, nil
}

// memoryBytes is [vm] memory in bytes (0: not set); loadConfigFile has
// checked that it parses.
func (c Config) memoryBytes() int64 {
	if c.VM.Memory == "" {
		return 0
	}
	n, _ := parseSize(c.VM.Memory)
	return n
}

// setting is one effective setting and where its value came from.
type setting struct {
	Name   string `json:"name"`
	Value  string `json:"value"`
	Source string `json:"source"`
}

func configCmd(g *globals) *cobra.Command {
	c := &cobra.Command{Use: "config", Short: "Show nexus's effective settings"}
	var o *output
	show := &cobra.Command{
		Use:   "show",
		Short: "Print every effective setting and where it came from (flag, environment, config file or default)",
		Args:  noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			list, err := effectiveSettings(cmd, g)
			if err != nil {
				return err
			}
			return printList(cmd, o, list, func(s setting) string { return s.Name }, table[setting]{
				header: []string{"SETTING", "VALUE", "SOURCE"},
				row:    func(s setting) []string { return []string{s.Name, s.Value, s.Source} },
			})
		},
	}
	o = addOutput(show, true)
	c.AddCommand(show)
	return c
}

// effectiveSettings reads the config file (a file nexus cannot use is the
// command's error) and reports every setting a command may read.
func effectiveSettings(cmd *cobra.Command, g *globals) ([]setting, error) {
	root, err := filepath.Abs(g.stateDir)
	if err != nil {
		return nil, err
	}
	cfg, file, err := loadConfigFile(root)
	if err != nil {
		return nil, err
	}
	fromEnv := func(name, env, def, defSource string) setting {
		if v, ok := os.LookupEnv(env); ok && v != "" {
			return setting{name, v, "env " + env}
		}
		return setting{name, def, defSource}
	}
	fromFile := func(key string, v, def any) setting {
		if file.Defined[key] {
			return setting{key, fmt.Sprint(v), "file " + file.Path}
		}
		return setting{key, fmt.Sprint(def), "default"}
	}
	stateDir := setting{"state_dir", root, "default"}
	switch {
	case cmd.Flags().Changed("state-dir"):
		stateDir.Source = "flag --state-dir"
	case os.Getenv("NEXUS_STATE_DIR") != "":
		stateDir.Source = "env NEXUS_STATE_DIR"
	case os.Getenv("XDG_STATE_HOME") != "":
		stateDir.Source = "env XDG_STATE_HOME"
	}
	drv := fromEnv("driver", "NEXUS_DRIVER", driver.Default, "default")
	switch {
	case cmd.Flags().Changed("driver"):
		drv = setting{"driver", g.driver, "flag --driver"}
	case drv.Source == "default" && file.Defined["vm.driver"]:
		drv = setting{"driver", cfg.VM.Driver, "file " + file.Path}
	}
	configPath := setting{"config_file", file.Path, "default (absent: every default)"}
	switch {
	case file.Named:
		configPath.Source = "env NEXUS_CONFIG"
	case file.Exists:
		configPath.Source = "default"
	}
	fileOrEnv := func(key, env, v, def string) setting {
		if e := os.Getenv(env); e != "" {
			return setting{key, e, "env " + env}
		}
		return fromFile(key, v, def)
	}
	return []setting{
		stateDir,
		drv,
		configPath,
		fromFile("vm.overlay_disk_mib", cfg.VM.OverlayDiskMiB, lifecycle.DefaultOverlayMiB),
		fromFile("vm.overlay_warn_fill_ratio", cfg.VM.OverlayWarnFillRatio, lifecycle.DefaultWarnFillRatio),
		fileOrEnv("vm.kernel", "NEXUS_KERNEL_PATH", cfg.VM.Kernel, ""),
		fileOrEnv("vm.initramfs", "NEXUS_INITRAMFS_PATH", cfg.VM.Initramfs, ""),
		fileOrEnv("vm.cmdline", "NEXUS_KERNEL_CMDLINE", cfg.VM.Cmdline, lifecycle.DefaultCmdline),
		fromFile("vm.cpus", cfg.VM.Cpus, lifecycle.DefaultCpus),
		fromFile("vm.memory", cfg.VM.Memory, formatSize(lifecycle.DefaultMemory)),
		fileOrEnv("vm.root", "NEXUS_VM_ROOT", cfg.VM.Root, "overlay when the guest runs nexus's agent as init, else copy"),
		fromFile("fleet.urls", redactedURLs(cfg.Fleet.URLs), "none (the daemon mirrors only with --mirror or NEXUS_MIRROR)"),
		fromFile("fleet.host", cfg.Fleet.Host, "the hostname"),
		fromFile("fleet.credentials", cfg.Fleet.Credentials, ""),
		fromFile("fleet.domain", cfg.Fleet.Domain, "fleet"),
		fromFile("fleet.replicas", cfg.Fleet.Replicas, "3, or 1 on a fleet that cannot place 3"),
		fromFile("fleet.max_bytes", cfg.Fleet.MaxBytes, "0 (none)"),
		fromEnv("ch_binary", "NEXUS_CH_BINARY", driver.DefaultCHBinary, "default (looked up in PATH)"),
		fromEnv("qemu_binary", "NEXUS_QEMU_BINARY", driver.DefaultQEMUBinary, "default (looked up in PATH)"),
		fromEnv("qemu_accel", "NEXUS_QEMU_ACCEL", "", "unset (kvm when /dev/kvm answers, else tcg)"),
		fromEnv("daemon_idle", "NEXUS_DAEMON_IDLE", defaultIdle.String(), "default"),
		fromEnv("no_auto_daemon", "NEXUS_NO_AUTO_DAEMON", "", "unset (a daemon is started on demand)"),
		fromEnv("log_level", "NEXUS_LOG_LEVEL", "info", "default"),
	}, nil
}

// redactedURLs are urls with any password replaced, for printing.
func redactedURLs(urls []string) string {
	out := make([]string, len(urls))
	for i, s := range urls {
		if u, err := url.Parse(s); err == nil {
			out[i] = u.Redacted()
		} else {
			out[i] = "(unparsable)"
		}
	}
	return strings.Join(out, ",")
}
