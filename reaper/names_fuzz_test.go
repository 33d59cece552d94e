package reaper

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/oklog/ulid/v2"

	"github.com/nexus-sandbox/nexus/events"
	"github.com/nexus-sandbox/nexus/layout"
)

func handleChars(s string) bool {
	if s == "" {
		return false
	}
	for _, c := range s {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || strings.ContainsRune("._/-", c)) {
			return false
		}
	}
	return true
}

// FuzzIdentifyRoundTrip: every name layout gives a handle's shadow disk,
// shadow intent or fork copy parses back to that handle (and child), so
// the reaper correlates it with the right sandbox; "a/b" and "a_b" never
// meet.
func FuzzIdentifyRoundTrip(f *testing.F) {
	for _, h := range []string{"a/b", "a_b", "dev/one", "x.shadow.y", "a_/b", "a/_b", "team_web"} {
		f.Add(h, "cfg")
	}
	child := ulid.Make().String()
	r := layout.Root("/r")
	f.Fuzz(func(t *testing.T, handle, name string) {
		if !handleChars(handle) || strings.ContainsAny(name, "./") || name == "" {
			t.Skip()
		}
		back := func(e Entry, what string) {
			t.Helper()
			safe := e.Handle
			if e.ID != "" {
				safe = strings.TrimPrefix(safe, e.ID+"-")
			}
			if h, ok := layout.HandleOf(safe); e.Unparsed || !ok || h != handle {
				t.Fatalf("%s of %q parsed back as %+v (handle %q)", what, handle, e, h)
			}
		}
		e := Identify("disks", filepath.Base(r.ShadowDisk(handle, name)), false)
		if e.Kind != events.KindShadowDisk || e.Legacy {
			t.Fatalf("shadow disk of %q: %+v", handle, e)
		}
		if !(len(handle) > 27 && handle[26] == '-' && layout.IsULID(handle[:26])) && e.ID != "" {
			t.Fatalf("shadow disk of %q attributed to sandbox %s", handle, e.ID)
		}
		if e.ID == "" {
			back(e, "shadow disk")
		}
		e = Identify("disks", filepath.Base(r.ShadowIntent(handle)), false)
		if e.Kind != events.KindShadowIntent {
			t.Fatalf("shadow intent of %q: %+v", handle, e)
		}
		back(e, "shadow intent")
		e = Identify("disks", filepath.Base(r.ForkShadowDisk(child, handle, name)), false)
		if e.Kind != events.KindShadowDisk || e.ID != child {
			t.Fatalf("fork copy of %q: %+v", handle, e)
		}
		back(e, "fork copy")
	})
}
