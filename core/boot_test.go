package core

import (
	"strconv"
	"testing"

	"github.com/dustin/go-humanize"

	"github.com/nexus-sandbox/nexus/events"
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

// TestRootMode: an overlay root wherever the guest runs nexus's agent as
// init, unless a copy is asked; a private copy for a guest without it, and
// an overlay asked for such a guest, or an unknown mode, refused.
func TestRootMode(t *testing.T) {
	for _, c := range []struct {
		asked   string
		agent   bool
		want    string
		refused bool
	}{
		{"", true, events.RootOverlay, false},
		{"", false, events.RootCopy, false},
		{events.RootCopy, true, events.RootCopy, false},
		{events.RootCopy, false, events.RootCopy, false},
		{events.RootOverlay, true, events.RootOverlay, false},
		{events.RootOverlay, false, "", true},
		{"shared", true, "", true},
	} {
		got, err := RootMode(c.asked, c.agent)
		if got != c.want || (err != nil) != c.refused {
			t.Errorf("RootMode(%q, agent %v) = %q, %v; want %q, refused %v", c.asked, c.agent, got, err, c.want, c.refused)
		}
	}
}
