package vmm

import (
	"encoding/json"
	"os"
	"reflect"
	"strings"
	"testing"
)

// TestEditSnapshotConfigKeepsWhatCHWrote runs the restore edit over a
// config.json in the shape CH serializes its VmConfig (field names from
// vmm/src/vm_config.rs: device ids flattened into each device, image_type,
// queue settings, serial, console, rng, platform, ...), written by hand
// rather than by nexus's stand-in VMM: only the disk paths, the vsock
// socket and the serial file may change.
func TestEditSnapshotConfigKeepsWhatCHWrote(t *testing.T) {
	in, err := os.ReadFile("testdata/ch-snapshot-config.json")
	if err != nil {
		t.Fatal(err)
	}
	const parent, child = "01PARENT0000000000000000AA", "01CHILD00000000000000000BB"
	edit := SnapshotEdit{
		Disks: map[string]string{
			"/state/disks/" + parent + ".raw":            "/state/disks/" + child + ".raw",
			"/state/disks/" + parent + "-workspace.ext4": "/state/disks/" + child + "-workspace.ext4",
		},
		VsockSocket: "/state/run/sb-" + child + ".vsock",
		SerialFile:  "/state/logs/" + child + ".console.log",
	}
	out, err := EditSnapshotConfig(in, edit)
	if err != nil {
		t.Fatal(err)
	}
	var before, after map[string]any
	json.Unmarshal(in, &before)
	if err := json.Unmarshal(out, &after); err != nil {
		t.Fatal(err)
	}
	// Undo the three edits in the output; what remains must equal the input.
	for _, d := range after["disks"].([]any) {
		p := d.(map[string]any)["path"].(string)
		if !strings.Contains(p, child) {
			t.Fatalf("disk path %s not re-pointed", p)
		}
		d.(map[string]any)["path"] = strings.ReplaceAll(p, child, parent)
	}
	for _, obj := range []string{"vsock", "serial"} {
		m := after[obj].(map[string]any)
		for k, v := range m {
			if s, ok := v.(string); ok && strings.Contains(s, child) {
				m[k] = strings.ReplaceAll(s, child, parent)
			}
		}
	}
	if !reflect.DeepEqual(before, after) {
		t.Fatalf("edit changed more than paths:\n in %s\nout %s", in, out)
	}
	if strings.Contains(string(out), parent) {
		t.Fatalf("the source sandbox is still named: %s", out)
	}

	// A disk the edit does not re-point is refused, never left pointing
	// at the source's file.
	delete(edit.Disks, "/state/disks/"+parent+".raw")
	if _, err := EditSnapshotConfig(in, edit); err == nil || !strings.Contains(err.Error(), "no replacement") {
		t.Fatalf("unmapped disk: %v", err)
	}
	disks, err := SnapshotDisks(in)
	if err != nil || len(disks) != 2 || disks[1].ID != "_disk1" || disks[1].ImageType != ImageRaw {
		t.Fatalf("SnapshotDisks = %+v, %v", disks, err)
	}
}
