package core

import (
	"fmt"
	"strconv"
	"strings"
	"testing"
)

// TestOverlayPlan runs testdata/overlay.txt: each case is what start
// knows about a stopped sandbox's overlay, and what it does with it.
//
//	overlay [last=<run>] [flushed=<run>] [ended=<how>] size=<bytes> usable=<bytes> [fill=<ratio>]
//	        [clean] [needs-replay] [problems=<a; b>] [accept] [warn-ratio=<ratio>]
//
// Sizes take a K, M or G suffix (binary). The output is one of: boot,
// boot warn "<warning>", recover [grow], refuse <reason> "<message>".
func TestOverlayPlan(t *testing.T) {
	var outs []string
	runCases(t, "testdata/overlay.txt", func(t *testing.T, c testCase) string {
		if c.cmd != "overlay" {
			t.Fatalf("%s: unknown command %q", c.pos, c.cmd)
		}
		c.only(t, "last", "flushed", "ended", "size", "usable", "fill", "clean", "needs-replay", "problems", "accept", "warn-ratio")
		var ev OverlayEvidence
		ev.LastRun, _ = c.arg("last")
		ev.FlushedRun, _ = c.arg("flushed")
		ev.Ended, _ = c.arg("ended")
		ev.Check.Bytes = size(t, c, "size")
		ev.Check.UsableBytes = size(t, c, "usable")
		ev.Check.FillRatio = ratio(t, c, "fill")
		_, ev.Check.Clean = c.arg("clean")
		_, ev.Check.NeedsRecovery = c.arg("needs-replay")
		if p, ok := c.arg("problems"); ok {
			ev.Check.Problems = strings.Split(p, "; ")
		}
		_, ev.AcceptUnflushed = c.arg("accept")
		ev.WarnRatio = ratio(t, c, "warn-ratio")
		d := OverlayPlan(ev)
		var out string
		switch {
		case d.Refuse != "":
			if d.Recover || d.Grow || d.Warn != "" || d.Message == "" {
				t.Fatalf("%s: a refusal that also plans work, or says nothing: %+v", c.pos, d)
			}
			out = fmt.Sprintf("refuse %s %q", d.Refuse, d.Message)
		case d.Message != "":
			t.Fatalf("%s: a message without a refusal: %+v", c.pos, d)
		case d.Recover:
			if d.Warn != "" {
				t.Fatalf("%s: a recovery that also warns: %+v", c.pos, d)
			}
			out = "recover"
			if d.Grow {
				out += " grow"
			}
		case d.Grow:
			t.Fatalf("%s: growth without recovery: %+v", c.pos, d)
		case d.Warn != "":
			out = fmt.Sprintf("boot warn %q", d.Warn)
		default:
			out = "boot"
		}
		outs = append(outs, out)
		return out
	})
	// The file covers every outcome.
	for _, want := range []string{"boot", "boot warn ", "recover", "recover grow", "refuse " + ReasonOverlayDiskFull + " ", "refuse " + ReasonOverlayUnflushed + " "} {
		if !strings.Contains("\n"+strings.Join(outs, "\n")+"\n", "\n"+want) {
			t.Errorf("testdata/overlay.txt has no case whose outcome is %q", want)
		}
	}
}

// size reads a case's byte count, with an optional K, M or G suffix.
func size(t *testing.T, c testCase, key string) int64 {
	t.Helper()
	v, ok := c.arg(key)
	if !ok {
		t.Fatalf("%s: no %s=", c.pos, key)
	}
	shift := 0
	switch {
	case strings.HasSuffix(v, "K"):
		shift = 10
	case strings.HasSuffix(v, "M"):
		shift = 20
	case strings.HasSuffix(v, "G"):
		shift = 30
	}
	n, err := strconv.ParseInt(strings.TrimRight(v, "KMG"), 10, 64)
	if err != nil {
		t.Fatalf("%s: %s=%s: %v", c.pos, key, v, err)
	}
	return n << shift
}

// ratio reads a case's ratio (0 if the case gives none).
func ratio(t *testing.T, c testCase, key string) float64 {
	t.Helper()
	v, ok := c.arg(key)
	if !ok {
		return 0
	}
	r, err := strconv.ParseFloat(v, 64)
	if err != nil {
		t.Fatalf("%s: %s=%s: %v", c.pos, key, v, err)
	}
	return r
}
