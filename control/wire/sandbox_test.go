package wire

import (
	"encoding/json"
	"reflect"
	"testing"
	"time"

	"github.com/nexus-sandbox/nexus/events"
	"github.com/nexus-sandbox/nexus/projections"
)

// A sandbox crosses the wire whole: the view with every field set, one
// with empty lists, and one with nothing but an ID come back from
// SandboxOf, JSON and View as they went in (nil and empty lists kept
// apart), so the daemon's client reads what a store in process reads.
func TestSandboxCrossesTheWireWhole(t *testing.T) {
	at := time.Date(2026, 12, 4, 19, 16, 2, 123456789, time.UTC)
	full := projections.Sandbox{
		ID: "01JF00000000000000000000AA", Handle: "team/one", Image: "/img/os.raw", Driver: "process",
		Parent: "01JF00000000000000000000PP", Snapshot: "01JF00000000000000000000SS",
		State: projections.StateRunning, Saga: "01JF00000000000000000000GG",
		CreatedAt: at, UpdatedAt: at.Add(time.Second),
		VMM:        &projections.Process{Pid: 41, StartTicks: 4242, Exited: true},
		Supervisor: &projections.Process{Pid: 42, StartTicks: 4343},
		Volumes:    []projections.Attachment{{Name: "data", GuestPath: "/data", ReadOnly: true}, {Name: "cache", GuestPath: "/cache"}},
		Conditions: []projections.Condition{{Type: "Ready", Status: "False", Reason: "VMMExited", Message: "the VMM ended"}},
		Snapshots:  []string{"01JF00000000000000000000S1"},
		Resources:  []events.Resource{{Kind: "disk", Path: "disks/01JF00000000000000000000AA.raw"}},
		Bootstrap:  events.Bootstrap{CacheID: "c1", Identity: "i1"},
		BootConfig: events.BootConfig{Kernel: "/k", Initramfs: "/i", Cmdline: "console=ttyS0", Cpus: 2, MemoryBytes: 1 << 30},
		LastRun:    "01JF00000000000000000000R1", FlushedRun: "01JF00000000000000000000R0",
		Seq: 77, Rev: 76, BootAt: at.Add(2 * time.Second), ReadyAt: at.Add(9 * time.Second), Labels: events.Labels{"team": "web"},
	}
	v := reflect.ValueOf(full)
	for i := range v.NumField() {
		if v.Field(i).IsZero() {
			t.Errorf("the full sandbox leaves %s unset: set it, so the wire is tested to carry it", v.Type().Field(i).Name)
		}
	}
	empty := projections.Sandbox{ID: "01JF00000000000000000000BB", State: projections.StateStopped,
		Volumes: []projections.Attachment{}, Conditions: []projections.Condition{}, Snapshots: []string{}, Resources: []events.Resource{}}
	bare := projections.Sandbox{ID: "01JF00000000000000000000CC"}
	list := []projections.Sandbox{full, empty, bare}

	data, err := json.Marshal(SandboxesOf(list))
	if err != nil {
		t.Fatal(err)
	}
	var got []Sandbox
	if err := json.Unmarshal(data, &got); err != nil {
		t.Fatal(err)
	}
	if back := Views(got); !reflect.DeepEqual(back, list) {
		t.Fatalf("the sandboxes came back as\n%+v\nwant\n%+v", back, list)
	}

	data, err = json.Marshal(SandboxAnswer{Found: true, Sandbox: SandboxOf(full)})
	if err != nil {
		t.Fatal(err)
	}
	var one SandboxAnswer
	if err := json.Unmarshal(data, &one); err != nil {
		t.Fatal(err)
	}
	if back := one.Sandbox.View(); !one.Found || !reflect.DeepEqual(back, full) {
		t.Fatalf("one sandbox came back as %+v (found %v), want %+v", back, one.Found, full)
	}
}
