package main

import (
	"bytes"
	"encoding/json"
	"os"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/oklog/ulid/v2"

	"github.com/nexus-sandbox/nexus/events"
	"github.com/nexus-sandbox/nexus/projections"
	"github.com/nexus-sandbox/nexus/replay"
)

// fullSandbox is a sandbox with every field of the journal's view set (a
// local time zone, so the output's UTC shows).
func fullSandbox() projections.Sandbox {
	at := time.Date(2026, 12, 4, 19, 16, 2, 123456789, time.FixedZone("X", 3600))
	return projections.Sandbox{
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
		BootConfig: events.BootConfig{Kernel: "/boot/vmlinuz", Initramfs: "/boot/initrd.img", Cmdline: "console=ttyS0 root=/dev/vda rw", Cpus: 2, MemoryBytes: 1 << 30, Root: events.RootOverlay},
		LastRun:    "01JF00000000000000000000R1", FlushedRun: "01JF00000000000000000000R0",
		Seq: 77, Rev: 76, BootAt: at.Add(2 * time.Second), ReadyAt: at.Add(9 * time.Second),
		Labels: events.Labels{"team": "web", "tier": "front"},
	}
}

// TestSandboxJSONKeepsItsBytes: the --json of a sandbox, full and bare,
// is byte for byte what testdata/sandbox-*.json hold (docs/json.md's
// Sandbox), and the full one sets every field of the view, so a field the
// view gains is printed only once the output type says so.
func TestSandboxJSONKeepsItsBytes(t *testing.T) {
	full := fullSandbox()
	v := reflect.ValueOf(full)
	for i := range v.NumField() {
		if v.Field(i).IsZero() {
			t.Errorf("fullSandbox leaves %s unset", v.Type().Field(i).Name)
		}
	}
	at := replay.State{Seq: 77, Time: full.UpdatedAt, Sandboxes: []*projections.Sandbox{&full}}
	bare := projections.Sandbox{ID: "01JF00000000000000000000BB", State: projections.StateCreating}
	for name, v := range map[string]any{"full": sandboxJSON(full), "bare": sandboxJSON(bare), "replay-at": replayStateJSON(at)} {
		var got bytes.Buffer
		if err := printJSON(&got, v); err != nil {
			t.Fatal(err)
		}
		want, err := os.ReadFile("testdata/sandbox-" + name + ".json")
		if err != nil {
			t.Fatal(err)
		}
		if got.String() != string(want) {
			t.Errorf("%s sandbox prints\n%s\nwant\n%s", name, got.String(), strings.TrimSpace(string(want)))
		}
	}
}

// owns reports whether the printed sandbox lists the resource at path, as
// projections.Sandbox.Owns does for the view.
func owns(sb jsonSandbox, path string) bool {
	return slices.ContainsFunc(sb.Resources, func(r events.Resource) bool { return r.Path == path })
}

// TestListItemIsASandboxsJSON: the bytes the store keeps for a listing
// (projections.ListItem) are, for a full sandbox and a bare one, what
// --json prints for it as one item of an indented array, so `ls --json`
// copying them prints what every other command prints.
func TestListItemIsASandboxsJSON(t *testing.T) {
	for _, sb := range []projections.Sandbox{fullSandbox(), {ID: "01JF00000000000000000000BB", State: projections.StateStopped}} {
		want, err := json.MarshalIndent(normalize(reflect.ValueOf(sandboxJSON(sb))).Interface(), "  ", "  ")
		if err != nil {
			t.Fatal(err)
		}
		got, err := projections.ListItem(sb)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, want) {
			t.Errorf("ListItem of %s:\n%s\nwant\n%s", sb.ID, got, want)
		}
	}
}

// TestEventJSONKeepsItsBytes: `events --json` prints each event as the
// line testdata/events.jsonl holds (docs/json.md's Event), its payload's
// lists as lists and its times in UTC, whether or not it is of a saga.
func TestEventJSONKeepsItsBytes(t *testing.T) {
	at := time.Date(2026, 12, 4, 19, 16, 2, 123456789, time.FixedZone("X", 3600))
	created := events.New(ulid.MustParse("01JF000000000000000000000E"), at, "01JF00000000000000000000AA",
		events.SandboxCreatedEvent{Handle: "team/one", Image: "/img/os.raw", Driver: "process", Labels: events.Labels{"team": "web"}})
	created.Saga, created.Step = "01JF00000000000000000000GG", "create"
	renamed := events.New(ulid.MustParse("01JF000000000000000000000F"), at.Add(time.Second), "01JF00000000000000000000AA",
		events.SandboxRenamedEvent{Handle: "team/two"})
	var got bytes.Buffer
	for i, e := range []events.Event{created, renamed} {
		r := events.Record{Seq: uint64(41 + i), Event: e}
		if err := printStreamed(&got, &output{json: true}, eventJSON(r), e.ID.String(), nil); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile("testdata/events.jsonl")
	if err != nil {
		t.Fatal(err)
	}
	if got.String() != string(want) {
		t.Errorf("events print\n%s\nwant\n%s", got.String(), want)
	}
}
