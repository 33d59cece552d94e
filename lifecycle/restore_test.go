package lifecycle

import (
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/nexus-sandbox/nexus/events"
	"github.com/nexus-sandbox/nexus/layout"
)

// chSnapshotDir lays out a snapshot directory as nexus's capture leaves
// it around a directory Cloud Hypervisor wrote: CH's config.json (the
// hand-written fixture in CH's VmConfig shape, whose paths are under
// /state), a state.json, a sparse memory-ranges and one file CH may add in
// a later version; beside them nexus's manifest and disk copies.
func chSnapshotDir(t *testing.T, root string) (string, manifest) {
	t.Helper()
	const parent = "01PARENT0000000000000000AA"
	dir := filepath.Join(root, "snapshots", parent, "snap")
	os.MkdirAll(filepath.Dir(dir), 0o700)
	os.Mkdir(dir, 0o700)
	cfg, err := os.ReadFile("../host/vmm/testdata/ch-snapshot-config.json")
	if err != nil {
		t.Fatal(err)
	}
	write := func(name string, data []byte) {
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write("config.json", cfg)
	write("state.json", []byte(`{"snapshots":{"device_manager":{"snapshots":{"_disk0":{},"_disk1":{},"_vsock2":{}}}}}`))
	write("memory-ranges", []byte("guest page"))
	os.Truncate(filepath.Join(dir, "memory-ranges"), 8<<20)
	write("future-ch-file", []byte("kept"))
	man := manifest{Sandbox: parent, VMState: true, Disks: []manifestDisk{
		{Kind: events.KindRawDisk, File: parent + ".raw"},
		{Kind: events.KindWorkspaceDisk, File: parent + "-workspace.ext4"},
	}}
	for _, d := range man.Disks {
		write(d.File, []byte("disk"))
	}
	data, _ := json.Marshal(man)
	write("manifest.json", data)
	return dir, man
}

func TestRestoreStagesEveryFileCHWrote(t *testing.T) {
	root := t.TempDir()
	dir, man := chSnapshotDir(t, root)
	m := &Manager{Root: layout.Root(root)}
	const child = "01CHILD00000000000000000BB"
	copies := []sourceDisk{{dst: m.Root.RawDisk(child)}, {dst: m.Root.WorkspaceDisk(child)}}

	files, err := vmStateFiles(dir, man)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Join(files, " ") != "config.json future-ch-file memory-ranges state.json" {
		t.Fatalf("VM state files %v", files)
	}
	edit, err := m.restoreEdit(dir, man, child, copies)
	if err != nil {
		t.Fatal(err)
	}
	stage := filepath.Join(root, "snapshots", child, "restore")
	if err := stageRestore(string(m.Root), dir, stage, files, edit); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"state.json", "memory-ranges", "future-ch-file"} {
		a, _ := os.ReadFile(filepath.Join(dir, name))
		b, err := os.ReadFile(filepath.Join(stage, name))
		if err != nil || !bytes.Equal(a, b) {
			t.Fatalf("%s not carried as is: %v", name, err)
		}
	}
	cfg, _ := os.ReadFile(filepath.Join(stage, "config.json"))
	for _, want := range []string{`"` + root + `/disks/` + child + `.raw"`, `"` + root + `/disks/` + child + `-workspace.ext4"`,
		`"` + root + `/run/sb-` + child + `.vsock"`, `"` + root + `/logs/` + child + `.console.log"`, `"_disk0"`, `"_disk1"`, `"_vsock2"`, `"image_type":"Raw"`, `"num_queues":2`, `"src":"/dev/urandom"`, `"iommu_address_width_bits":48`} {
		if !strings.Contains(string(cfg), want) {
			t.Fatalf("staged config.json lacks %s: %s", want, cfg)
		}
	}
	if strings.Contains(string(cfg), man.Sandbox) {
		t.Fatalf("staged config.json still names the source: %s", cfg)
	}
}

func TestRestoreRefusesWhatCannotBeRestored(t *testing.T) {
	root := t.TempDir()
	m := &Manager{Root: layout.Root(root)}
	const child = "01CHILD00000000000000000BB"
	copies := []sourceDisk{{dst: m.Root.RawDisk(child)}, {dst: m.Root.WorkspaceDisk(child)}}

	// No memory-ranges (what a restore staged by config.json and state.json
	// alone would give CH).
	dir, man := chSnapshotDir(t, root)
	os.Remove(filepath.Join(dir, "memory-ranges"))
	if _, err := vmStateFiles(dir, man); !errors.Is(err, ErrRefused) || !strings.Contains(err.Error(), "memory-ranges") {
		t.Fatalf("without memory-ranges: %v", err)
	}

	// A volume disk in the saved VM: refused, naming it.
	dir, man = chSnapshotDir(t, t.TempDir())
	m = &Manager{Root: layout.Root(filepath.Dir(filepath.Dir(filepath.Dir(dir))))}
	cfg, _ := os.ReadFile(filepath.Join(dir, "config.json"))
	var top map[string]any
	json.Unmarshal(cfg, &top)
	disks := top["disks"].([]any)
	vol := map[string]any{"id": "_disk2", "path": filepath.Join(string(m.Root), "volumes/data/disk.ext4"), "readonly": false, "image_type": "Raw"}
	top["disks"] = append(disks, vol)
	out, _ := json.Marshal(top)
	os.WriteFile(filepath.Join(dir, "config.json"), out, 0o600)
	if _, err := m.restoreEdit(dir, man, child, copies); !errors.Is(err, ErrRefused) || !strings.Contains(err.Error(), "named volume(s) data") {
		t.Fatalf("volume in the saved VM: %v", err)
	}

	// A disk the snapshot does not hold.
	vol["path"] = "/elsewhere/disk.img"
	out, _ = json.Marshal(top)
	os.WriteFile(filepath.Join(dir, "config.json"), out, 0o600)
	if _, err := m.restoreEdit(dir, man, child, copies); !errors.Is(err, ErrRefused) || !strings.Contains(err.Error(), "does not hold") {
		t.Fatalf("foreign disk: %v", err)
	}
}
