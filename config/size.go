package config

import (
	"errors"
	"math"
	"strings"

	"github.com/dustin/go-humanize"
)

// Sizes, as every flag and the config file take them.
//
// A size is what truncate(1) and qemu-img take: a bare K, M, G, T or P is
// binary (512M = 512 MiB), so is KiB..PiB; KB..PB are decimal (2GB = 2e9
// bytes). Fractions are allowed (1.5G). go-humanize does the parsing once
// the bare suffix has been spelled out as the binary unit it means.

// ParseSize reads a positive size.
func ParseSize(s string) (int64, error) {
	n, err := ParseBytes(s)
	if err != nil {
		return 0, err
	}
	if n == 0 {
		return 0, errors.New("want a positive size such as 512M, 1.5G or 2GiB")
	}
	return n, nil
}

// ParseBytes reads a size that may be zero (a limit such as --max-bytes 0).
func ParseBytes(s string) (int64, error) {
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
