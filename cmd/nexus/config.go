package main

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/BurntSushi/toml"

	"github.com/nexus-sandbox/nexus/host/fsx"
)

// Config is nexus's config file: $NEXUS_CONFIG, else <state-root>/config.toml.
// A missing default file means every default; a named file must exist.
//
//	[vm]
//	overlay_disk_mib = 256          # size of a NEW sandbox's overlay; existing ones keep theirs
//	overlay_warn_fill_ratio = 0.9   # start warns (OverlayNearlyFull) at this fill ratio
type Config struct {
	VM struct {
		OverlayDiskMiB       int64   `toml:"overlay_disk_mib"`
		OverlayWarnFillRatio float64 `toml:"overlay_warn_fill_ratio"`
	} `toml:"vm"`
}

func loadConfig(root string) (Config, error) {
	var c Config
	path, named := os.Getenv("NEXUS_CONFIG"), true
	if path == "" {
		path, named = filepath.Join(root, "config.toml"), false
	}
	var md toml.MetaData
	var err error
	if named {
		md, err = toml.DecodeFile(path, &c)
	} else {
		// nexus's own file: read through fsx, so a FIFO or a link planted
		// at <root>/config.toml is a one-line error, not a hang or a read
		// of something outside the root.
		var data []byte
		if data, err = fsx.ReadFile(root, "config.toml"); err == nil {
			md, err = toml.Decode(string(data), &c)
		}
	}
	switch {
	case errors.Is(err, os.ErrNotExist) && !named:
		return Config{}, nil
	case err != nil:
		return c, fmt.Errorf("config %s: %s", path, strings.ReplaceAll(err.Error(), "\n", " "))
	}
	if extra := md.Undecoded(); len(extra) > 0 {
		keys := make([]string, len(extra))
		for i, k := range extra {
			keys[i] = k.String()
		}
		return c, fmt.Errorf("config %s: unknown key %s", path, strings.Join(keys, ", "))
	}
	if v := c.VM.OverlayDiskMiB; md.IsDefined("vm", "overlay_disk_mib") && (v < 16 || v > 1<<20) {
		return c, fmt.Errorf("config %s: [vm] overlay_disk_mib = %d: want 16 to 1048576", path, v)
	}
	if v := c.VM.OverlayWarnFillRatio; md.IsDefined("vm", "overlay_warn_fill_ratio") && (v <= 0 || v > 1) {
		return c, fmt.Errorf("config %s: [vm] overlay_warn_fill_ratio = %g: want a ratio in (0, 1]", path, v)
	}
	return c, nil
}
