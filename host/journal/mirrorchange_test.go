package journal

import (
	"testing"
	"time"
)

// A flapping link is reported at most once per quiet period, with the
// flaps in between counted; a steady link is reported once per change.
func TestLinkLimiter(t *testing.T) {
	t0 := time.Date(2026, 12, 4, 0, 0, 0, 0, time.UTC)
	at := func(s float64) time.Time { return t0.Add(time.Duration(s * float64(time.Second))) }
	type want struct {
		report bool
		flaps  int
	}
	l := linkLimiter{quiet: 10 * time.Second}
	for i, c := range []struct {
		s  float64
		up bool
		want
	}{
		{0, false, want{}},       // down from the start: nothing changed
		{1, true, want{true, 0}}, // first link: reported at once
		{2, false, want{}},       // flapping within the quiet period
		{3, true, want{}},
		{4, false, want{}},
		{5, true, want{}},
		{6, false, want{}},
		{11, false, want{true, 4}}, // quiet over, down differs from "up": one event, 4 flaps not reported alone
		{12, false, want{}},        // steady
		{30, true, want{true, 0}},  // a single change after quiet
		{31, false, want{}},        // down and back up within quiet:
		{32, true, want{}},
		{45, true, want{}}, // ...nothing to report, the state is what was told
		{46, false, want{true, 2}},
	} {
		r, f := l.observe(at(c.s), c.up)
		if r != c.report || f != c.flaps {
			t.Fatalf("sample %d (t=%v up=%v): report %v flaps %d, want %+v", i, c.s, c.up, r, f, c.want)
		}
	}
}
