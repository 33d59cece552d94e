package main

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/nexus-sandbox/nexus/config"
)

// Sizes and ages: every flag that takes one reads it here (a size through
// config.ParseSize, as the config file's), and every table prints it here,
// so one spelling means one thing everywhere.

// formatSize prints bytes in binary units for humans (1.5 GiB); JSON keeps
// the integer.
func formatSize(n int64) string { return config.FormatSize(n) }

// parseAge reads a positive age: a Go duration (90m, 36h), whole or
// fractional days (7d, 1.5d), or days followed by a Go duration (1d12h).
func parseAge(s string) (time.Duration, error) {
	bad := fmt.Errorf("want a positive duration such as 30m, 36h, 7d or 1d12h")
	t := strings.TrimSpace(s)
	var total time.Duration
	if i := strings.IndexByte(t, 'd'); i >= 0 {
		days, err := strconv.ParseFloat(t[:i], 64)
		if err != nil || days < 0 || days > 100000 {
			return 0, bad
		}
		total, t = time.Duration(days*float64(24*time.Hour)), t[i+1:]
	}
	if t != "" {
		d, err := time.ParseDuration(t)
		if err != nil || d < 0 {
			return 0, bad
		}
		total += d
	}
	if total <= 0 {
		return 0, bad
	}
	return total, nil
}
