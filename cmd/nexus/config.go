package main

import (
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"strings"

	"github.com/spf13/cobra"

	"github.com/nexus-sandbox/nexus/config"
	"github.com/nexus-sandbox/nexus/host/driver"
	"github.com/nexus-sandbox/nexus/lifecycle"
)

// driverName is the driver a new sandbox is made with: --driver, else
// NEXUS_DRIVER (both in g.driver), else [vm] driver, else the default.
func driverName(g *globals, cfg config.File) string { return cfg.DriverName(g.driver) }

// configReaders are the commands that read a config setting (both size
// and warn ratio apply to new overlays and to start's overlay check; the
// boot assets to every cold boot, a fork of a stopped parent's too). Only
// they are refused by a broken config file: a typo in a setting for new
// sandboxes must not stop stop, rm, recover or ls.
var configReaders = map[string]bool{"create": true, "start": true, "fork": true, "restore": true}

func loadConfig(root string) (config.File, error) {
	c, _, err := config.Load(root)
	return c, err
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
	cfg, file, err := config.Load(root)
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
