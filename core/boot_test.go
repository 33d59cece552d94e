package core

import (
	"strconv"
	"testing"

	"github.com/dustin/go-humanize"

	"github.com/nexus-sandbox/nexus/projections"
)

// TestBootCases runs testdata/boot.txt: which driver a sandbox's boot may
// be asked for, and which sizes a host holds.
//
//	driver cmd=<command> recorded=<driver or empty> [asked=<driver>]
//	sizing cpus=N memory=SIZE host-cpus=N host-memory=SIZE
func TestBootCases(t *testing.T) {
	size := func(c testCase, key string) int64 {
		t.Helper()
		n, err := humanize.ParseBytes(c.args[key])
		if err != nil {
			t.Fatalf("%s: %s=%q: %v", c.pos, key, c.args[key], err)
		}
		return int64(n)
	}
	num := func(c testCase, key string) int {
		t.Helper()
		n, err := strconv.Atoi(c.args[key])
		if err != nil {
			t.Fatalf("%s: %s=%q: %v", c.pos, key, c.args[key], err)
		}
		return n
	}
	runCases(t, "testdata/boot.txt", func(t *testing.T, c testCase) string {
		switch c.cmd {
		case "driver":
			c.only(t, "cmd", "recorded", "asked")
			sb := projections.Sandbox{ID: "A", Driver: c.args["recorded"]}
			return decided(DecideDriver(Command(c.args["cmd"]), sb, c.args["asked"]))
		case "sizing":
			c.only(t, "cpus", "memory", "host-cpus", "host-memory")
			if err := CheckSizing(num(c, "cpus"), size(c, "memory"), num(c, "host-cpus"), size(c, "host-memory")); err != nil {
				return "refused: " + err.Error()
			}
			return "ok"
		}
		t.Fatalf("%s: unknown command %q", c.pos, c.cmd)
		return ""
	})
}
