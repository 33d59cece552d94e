package lifecycle

import (
	"errors"
	"fmt"

	"github.com/nexus-sandbox/nexus/host/driver"
)

// The bounds of a Manager's settings. New holds a Manager to them, and the
// config file's reader names the offending key with the same rule
// (CheckOverlayMiB, CheckWarnFillRatio), so a value is judged in one place.
const (
	MinOverlayMiB = 16
	MaxOverlayMiB = 1 << 20
)

// CheckOverlayMiB refuses a new overlay size nexus will not make.
func CheckOverlayMiB(v int64) error {
	if v < MinOverlayMiB || v > MaxOverlayMiB {
		return fmt.Errorf("overlay size %d MiB: want %d to %d", v, MinOverlayMiB, MaxOverlayMiB)
	}
	return nil
}

// CheckWarnFillRatio refuses a warning ratio outside (0, 1].
func CheckWarnFillRatio(v float64) error {
	if v <= 0 || v > 1 {
		return fmt.Errorf("overlay warn fill ratio %g: want a ratio in (0, 1]", v)
	}
	return nil
}

// New returns a Manager for cfg, or why cfg is not one: every flow can
// then rely on its settings instead of each re-checking them. A zero
// setting means its default; a Launcher may be nil only for a Manager that
// never starts a process (a flow that would is refused with ErrNoLauncher).
func New(cfg Manager) (*Manager, error) {
	var errs []error
	if cfg.Root == "" {
		errs = append(errs, errors.New("no state root"))
	}
	if cfg.B == nil {
		errs = append(errs, errors.New("no backend"))
	}
	if cfg.Driver.Name != "" && !driver.Known(cfg.Driver.Name) {
		errs = append(errs, fmt.Errorf("unknown driver %q", cfg.Driver.Name))
	}
	if cfg.OverlayMiB != 0 {
		errs = append(errs, CheckOverlayMiB(cfg.OverlayMiB))
	}
	if cfg.WarnFillRatio != 0 {
		errs = append(errs, CheckWarnFillRatio(cfg.WarnFillRatio))
	}
	if cfg.Cpus < 0 || cfg.MemoryBytes < 0 {
		errs = append(errs, fmt.Errorf("negative size: %d vCPUs, %d bytes", cfg.Cpus, cfg.MemoryBytes))
	}
	for name, d := range map[string]int64{
		"start timeout": int64(cfg.StartTimeout), "flush deadline": int64(cfg.FlushDeadline), "freeze deadline": int64(cfg.FreezeDeadline),
	} {
		if d < 0 {
			errs = append(errs, fmt.Errorf("negative %s", name))
		}
	}
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("lifecycle: %w", err)
	}
	m := cfg
	return &m, nil
}
