package lifecycle

import (
	"reflect"
	"testing"

	"github.com/nexus-sandbox/nexus/events"
)

func TestOutermost(t *testing.T) {
	res := func(paths ...string) []events.Resource {
		var out []events.Resource
		for _, p := range paths {
			out = append(out, events.Resource{Path: p})
		}
		return out
	}
	got := outermost(res("snapshots/A/S1", "disks/A.raw", "snapshots/A", "snapshots/A/S2/", "snapshots/AB", "disks/A.raw"))
	want := []string{"disks/A.raw", "snapshots/A", "snapshots/AB"}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("outermost = %v, want %v (each byte counted once, a sibling with a common prefix kept)", got, want)
	}
}
