package main

import (
	"testing"
	"time"

	"github.com/nexus-sandbox/nexus/config"
)

func TestParseSize(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		in   string
		want int64
	}{
		{"4096", 4096},
		{"512K", 512 << 10},
		{"64M", 64 << 20},
		{"64m", 64 << 20},
		{"64MiB", 64 << 20},
		{"64MB", 64_000_000},
		{"2G", 2 << 30},
		{"1.5G", 3 << 29},
		{"2GB", 2_000_000_000},
		{"1T", 1 << 40},
		{" 8M ", 8 << 20},
	} {
		got, err := config.ParseSize(c.in)
		if err != nil || got != c.want {
			t.Errorf("config.ParseSize(%q) = %d, %v; want %d", c.in, got, err, c.want)
		}
	}
	for _, bad := range []string{"", "0", "-1M", "M", "12Q", "1e3", "two", "99999999P"} {
		if n, err := config.ParseSize(bad); err == nil {
			t.Errorf("config.ParseSize(%q) = %d, want an error", bad, n)
		}
	}
	if n, err := config.ParseBytes("0"); err != nil || n != 0 {
		t.Errorf("config.ParseBytes(0) = %d, %v", n, err)
	}
}

func TestParseAge(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		in   string
		want time.Duration
	}{
		{"90m", 90 * time.Minute},
		{"36h", 36 * time.Hour},
		{"7d", 7 * 24 * time.Hour},
		{"1.5d", 36 * time.Hour},
		{"1d12h", 36 * time.Hour},
		{"0d30s", 30 * time.Second},
	} {
		got, err := parseAge(c.in)
		if err != nil || got != c.want {
			t.Errorf("parseAge(%q) = %v, %v; want %v", c.in, got, err, c.want)
		}
	}
	for _, bad := range []string{"", "0", "0d", "-1h", "d", "7", "7days", "1h2d"} {
		if d, err := parseAge(bad); err == nil {
			t.Errorf("parseAge(%q) = %v, want an error", bad, d)
		}
	}
}

func TestFormatSize(t *testing.T) {
	t.Parallel()
	if got := formatSize(3 << 29); got != "1.5 GiB" {
		t.Errorf("formatSize(1.5 GiB) = %q", got)
	}
	if got := formatSize(512); got != "512 B" {
		t.Errorf("formatSize(512) = %q", got)
	}
}
