package main

import (
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/dustin/go-humanize"
)

// Sizes and ages: every flag that takes one reads it here, and every table
// prints it here, so one spelling means one thing everywhere.
//
// A size is what truncate(1) and qemu-img take: a bare K, M, G, T or P is
// binary (512M = 512 MiB), so is KiB..PiB; KB..PB are decimal (2GB = 2e9
// bytes). Fractions are allowed (1.5G). go-humanize does the parsing once
// the bare suffix has been spelled out as the binary unit it means.

// parseSize reads a positive size.
func parseSize(s string) (int64, error) {
	n, err := parseBytes(s)
	if err != nil {
		return 0, err
	}
	if n == 0 {
		return 0, errors.New("want a positive size such as 512M, 1.5G or 2GiB")
	}
	return n, nil
}

// parseBytes reads a size that may be zero (a limit such as --max-bytes 0).
func parseBytes(s string) (int64, error) {
	t := strings.TrimSpace(s)
	if n := len(t); n > 0 && strings.ContainsRune("kKmMgGtTpP", rune(t[n-1])) {
		t += "iB"
	}
	v, err := humanize.ParseBytes(t)
	if err != nil || t == "" || strings.HasPrefix(t, "-") || v > math.MaxInt64/2 {
		return 0, errors.New("want a size such as 512M, 1.5G, 2GiB or 2GB (K, M, G, T alone are binary)")
	}
	return int64(v), nil
}

// formatSize prints bytes in binary units for humans (1.5 GiB); JSON keeps
// the integer.
func formatSize(n int64) string {
	if n < 0 {
		return "-"
	}
	return humanize.IBytes(uint64(n))
}

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
