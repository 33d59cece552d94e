package config

import (
	"cmp"
	"fmt"
	"net/url"
	"os"
	"strings"

	"github.com/dustin/go-humanize"

	"github.com/nexus-sandbox/nexus/host/driver"
	"github.com/nexus-sandbox/nexus/lifecycle"
)

// Drivers are the VMM drivers a flag, NEXUS_DRIVER or [vm] driver may
// name.
var Drivers = driver.Names

// CheckDriver refuses a driver name nexus does not have.
func CheckDriver(name string) error {
	if !driver.Known(name) {
		return fmt.Errorf("want %s", OneOf(driver.Names))
	}
	return nil
}

// Driver is the driver asked for (a flag, or NEXUS_DRIVER), else the
// default.
func Driver(asked string) string { return cmp.Or(asked, driver.Default) }

// FormatSize prints bytes in binary units for a person (1.5 GiB).
func FormatSize(n int64) string {
	if n < 0 {
		return "-"
	}
	return humanize.IBytes(uint64(n))
}

// Setting is one effective setting and where its value came from.
type Setting struct {
	Name   string `json:"name"`
	Value  string `json:"value"`
	Source string `json:"source"`
}

// Asked is what the command's own flags and defaults say of the settings
// Settings reports.
type Asked struct {
	StateDirFlag bool    // --state-dir was given
	DriverFlag   *string // --driver's value when given
	DaemonIdle   string  // an on-demand daemon's idle time when NEXUS_DAEMON_IDLE is unset
}

// Settings reads the config of the state root root (a file nexus cannot
// use is the error) and reports every setting a command may read, each
// with where its value came from: flag, environment, file or default.
func Settings(root string, asked Asked) ([]Setting, error) {
	cfg, file, err := Load(root)
	if err != nil {
		return nil, err
	}
	fromEnv := func(name, env, def, defSource string) Setting {
		if v, ok := os.LookupEnv(env); ok && v != "" {
			return Setting{name, v, "env " + env}
		}
		return Setting{name, def, defSource}
	}
	fromFile := func(key string, v, def any) Setting {
		if file.Defined[key] {
			return Setting{key, fmt.Sprint(v), "file " + file.Path}
		}
		return Setting{key, fmt.Sprint(def), "default"}
	}
	stateDir := Setting{"state_dir", root, "default"}
	switch {
	case asked.StateDirFlag:
		stateDir.Source = "flag --state-dir"
	case os.Getenv("NEXUS_STATE_DIR") != "":
		stateDir.Source = "env NEXUS_STATE_DIR"
	case os.Getenv("XDG_STATE_HOME") != "":
		stateDir.Source = "env XDG_STATE_HOME"
	}
	drv := fromEnv("driver", "NEXUS_DRIVER", driver.Default, "default")
	switch {
	case asked.DriverFlag != nil:
		drv = Setting{"driver", *asked.DriverFlag, "flag --driver"}
	case drv.Source == "default" && file.Defined["vm.driver"]:
		drv = Setting{"driver", cfg.VM.Driver, "file " + file.Path}
	}
	configPath := Setting{"config_file", file.Path, "default (absent: every default)"}
	switch {
	case file.Named:
		configPath.Source = "env NEXUS_CONFIG"
	case file.Exists:
		configPath.Source = "default"
	}
	fileOrEnv := func(key, env, v, def string) Setting {
		if e := os.Getenv(env); e != "" {
			return Setting{key, e, "env " + env}
		}
		return fromFile(key, v, def)
	}
	return []Setting{
		stateDir,
		drv,
		configPath,
		fromFile("vm.overlay_disk_mib", cfg.VM.OverlayDiskMiB, lifecycle.DefaultOverlayMiB),
		fromFile("vm.overlay_warn_fill_ratio", cfg.VM.OverlayWarnFillRatio, lifecycle.DefaultWarnFillRatio),
		fileOrEnv("vm.kernel", "NEXUS_KERNEL_PATH", cfg.VM.Kernel, ""),
		fileOrEnv("vm.initramfs", "NEXUS_INITRAMFS_PATH", cfg.VM.Initramfs, ""),
		fileOrEnv("vm.cmdline", "NEXUS_KERNEL_CMDLINE", cfg.VM.Cmdline, lifecycle.DefaultCmdline),
		fromFile("vm.cpus", cfg.VM.Cpus, lifecycle.DefaultCpus),
		fromFile("vm.memory", cfg.VM.Memory, FormatSize(lifecycle.DefaultMemory)),
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
		fromEnv("daemon_idle", "NEXUS_DAEMON_IDLE", asked.DaemonIdle, "default"),
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
