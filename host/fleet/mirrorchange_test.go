package fleet

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/oklog/ulid/v2"

	"github.com/nexus-sandbox/nexus/internal/testutil"
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

// awaitChange takes changes from the journal's feed until one of kind.
func awaitChange(t *testing.T, m *Mirror, kind string) MirrorChange {
	t.Helper()
	deadline := time.After(testutil.Scale(20 * time.Second))
	for {
		select {
		case c := <-m.Changes():
			if c.Kind == kind {
				return c
			}
		case <-deadline:
			t.Fatalf("no %s change reported", kind)
		}
	}
}

// The feed the daemon journals from reports each state change of the
// mirror: created and linked, an operator's setting kept, re-created after
// a delete, unlinked when the fleet goes, each naming the stream.
func TestMirrorChangesReported(t *testing.T) {
	leafPort, clientPort := freePort(t), freePort(t)
	fleet := startFleet(t, t.TempDir(), clientPort, leafPort)
	defer fleet.Shutdown()
	j, m, err := openHost(t, "host-a", ulid.Make().String(), nil, leafPort)
	if err != nil {
		t.Fatal(err)
	}
	if c := awaitChange(t, m, "created"); c.Stream != m.StreamName() || c.Domain != fleetDomain || c.Replicas != 1 {
		t.Fatalf("created: %+v", c)
	}
	appendN(t, j, 0, 2)
	awaitMirrored(t, fleet, m.StreamName(), 2)
	awaitReported(t, fleet, m.StreamName(), 2)

	nc, js := connectJS(t, fleet.ClientURL())
	defer nc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), testutil.Scale(20*time.Second))
	defer cancel()
	limitMirror(ctx, t, js, m.StreamName())
	if c := awaitChange(t, m, "settings_differ"); !strings.Contains(c.Detail, "max bytes 1073741824") {
		t.Fatalf("settings_differ: %+v", c)
	}
	if err := js.DeleteStream(ctx, m.StreamName()); err != nil {
		t.Fatal(err)
	}
	awaitChange(t, m, "recreated")
	fleet.Shutdown()
	if c := awaitChange(t, m, "unlinked"); c.Stream != m.StreamName() || len(c.URLs) != 1 || strings.Contains(c.URLs[0], leafPass) {
		t.Fatalf("unlinked: %+v", c)
	}
}
