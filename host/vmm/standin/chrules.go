package standin

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"

	"golang.org/x/sys/unix"

	"github.com/nexus-sandbox/nexus/host/vmm"
)

// The rules below are Cloud Hypervisor's, as its sources state them; the
// stand-in VMM enforces each so that a host that breaks one fails on the
// process driver as it would on CH:
//
//   - device ids (vmm/src/device_manager.rs): a disk without an id is named
//     "_disk<n>", the vsock "_vsock<n>", n from one counter shared by all
//     devices in creation order (disks before vsock), skipping ids already
//     given; CH writes the names into its configuration, so vm.info and a
//     snapshot's config.json carry them.
//   - image type (device_manager.rs, virtio-devices/src/block.rs, v51+): a
//     disk without image_type is probed; a probed Raw or FixedVhd disk has
//     its sector-0 writes refused (VIRTIO_BLK_S_IOERR); the probed type is
//     written into the configuration; a given type that differs from the
//     probed one is an error.
//   - disk locks (block/src/io/fcntl.rs, v46+): an OFD lock on each image,
//     a write lock when read-write, a read lock when read-only, over
//     [0, size) by default; a conflicting lock fails the boot.
//   - snapshots (vmm/src/vm.rs, memory_manager.rs): config.json, state.json
//     and memory-ranges, each created exclusively (O_EXCL) in a directory
//     that must exist; memory-ranges is sized to the sum of the saved
//     memory ranges and may be sparse. None is synced, nor the directory:
//     whoever records a snapshot syncs it. Restore reads all three.
//
// One rule is stricter than CH: a restore whose configured device ids do
// not match the saved device state is refused. CH would create fresh
// devices under the guest's feet (its state lookup by id finds nothing);
// refusing turns that silent corruption into a test failure.

const (
	diskIDPrefix  = "_disk"
	vsockIDPrefix = "_vsock"
	sectorSize    = 512
)

// vmConfig is a VM configuration as CH holds it: the JSON object as sent
// (or as a snapshot stored it), decoded with numbers kept verbatim, plus
// its typed view for the fields the stand-in acts on.
type vmConfig struct {
	raw map[string]any
	cfg vmm.Config
}

func parseVMConfig(data []byte) (*vmConfig, error) {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	var raw map[string]any
	if err := dec.Decode(&raw); err != nil {
		return nil, err
	}
	if raw == nil {
		return nil, errors.New("configuration is not a JSON object")
	}
	// CH's serde: a given cpus needs both counts and a given memory its
	// size (no serde default on them, vm_config.rs at v53.0); only an
	// absent cpus or memory takes CH's default.
	for obj, keys := range map[string][]string{"cpus": {"boot_vcpus", "max_vcpus"}, "memory": {"size"}} {
		m, given := raw[obj].(map[string]any)
		for _, k := range keys {
			if _, ok := m[k]; given && !ok {
				return nil, fmt.Errorf("%s: missing field `%s`", obj, k)
			}
		}
	}
	vc := &vmConfig{raw: raw}
	if err := vc.sync(); err != nil {
		return nil, err
	}
	return vc, nil
}

// sync re-derives the typed view after raw changed.
func (vc *vmConfig) sync() error {
	data, err := json.Marshal(vc.raw)
	if err != nil {
		return err
	}
	var cfg vmm.Config
	if err := json.Unmarshal(data, &cfg); err != nil {
		return err
	}
	vc.cfg = cfg
	return nil
}

func (vc *vmConfig) disks() []map[string]any {
	list, _ := vc.raw["disks"].([]any)
	var out []map[string]any
	for _, d := range list {
		if m, ok := d.(map[string]any); ok {
			out = append(out, m)
		}
	}
	return out
}

func (vc *vmConfig) vsock() map[string]any {
	m, _ := vc.raw["vsock"].(map[string]any)
	return m
}

// assignIDs names every id-less disk and vsock as CH's device manager does.
func (vc *vmConfig) assignIDs() {
	used := map[string]bool{}
	devs := vc.disks()
	if v := vc.vsock(); v != nil {
		devs = append(devs, v)
	}
	for _, d := range devs {
		if id, _ := d["id"].(string); id != "" {
			used[id] = true
		}
	}
	n := 0
	next := func(prefix string) string {
		for {
			id := prefix + strconv.Itoa(n)
			n++
			if !used[id] {
				used[id] = true
				return id
			}
		}
	}
	for _, d := range vc.disks() {
		if id, _ := d["id"].(string); id == "" {
			d["id"] = next(diskIDPrefix)
		}
	}
	if v := vc.vsock(); v != nil {
		if id, _ := v["id"].(string); id == "" {
			v["id"] = next(vsockIDPrefix)
		}
	}
}

// deviceIDs lists the ids of the configured disks and vsock, sorted.
func (vc *vmConfig) deviceIDs() []string {
	var ids []string
	for _, d := range vc.disks() {
		id, _ := d["id"].(string)
		ids = append(ids, id)
	}
	if v := vc.vsock(); v != nil {
		id, _ := v["id"].(string)
		ids = append(ids, id)
	}
	sort.Strings(ids)
	return ids
}

// probeImageType reads what CH's open_disk looks at: the QCOW and VHDX
// magic at offset 0, a fixed VHD's "conectix" footer in the last sector;
// anything else is Raw.
func probeImageType(f *os.File) (vmm.ImageType, error) {
	head := make([]byte, 8)
	n, err := f.ReadAt(head, 0)
	if err != nil && !errors.Is(err, io.EOF) {
		return "", err
	}
	head = head[:n]
	switch {
	case bytes.HasPrefix(head, []byte("QFI\xfb")):
		return vmm.ImageQcow2, nil
	case bytes.HasPrefix(head, []byte("vhdxfile")):
		return vmm.ImageVhdx, nil
	}
	fi, err := f.Stat()
	if err != nil {
		return "", err
	}
	if fi.Size() >= sectorSize {
		foot := make([]byte, 8)
		if _, err := f.ReadAt(foot, fi.Size()-sectorSize); err == nil && string(foot) == "conectix" {
			return vmm.ImageFixedVhd, nil
		}
	}
	return vmm.ImageRaw, nil
}

// openDisks opens every configured disk as CH's device manager does at
// boot: never creating one (a missing image is an error), probing and
// recording the image type, and taking the image's OFD lock. vc.raw gains
// the ids and probed types, as CH's configuration does.
func openDisks(vc *vmConfig) ([]disk, error) {
	vc.assignIDs()
	var disks []disk
	fail := func(err error) ([]disk, error) {
		for _, d := range disks {
			d.f.Close()
		}
		return nil, err
	}
	for _, raw := range vc.disks() {
		path, _ := raw["path"].(string)
		ro, _ := raw["readonly"].(bool)
		if path == "" {
			return fail(failed("invalid VM config: a disk has no path"))
		}
		flag := os.O_RDWR
		if ro {
			flag = os.O_RDONLY
		}
		f, err := os.OpenFile(path, flag|unix.O_CLOEXEC, 0)
		if err != nil {
			return fail(failed("cannot open disk: %v", err))
		}
		d := disk{f: f, writable: !ro, path: path}
		disks = append(disks, d)
		probed, err := probeImageType(f)
		if err != nil {
			return fail(failed("cannot open disk %s: probe image type: %v", path, err))
		}
		given, _ := raw["image_type"].(string)
		switch vmm.ImageType(given) {
		case "", vmm.ImageUnknown:
			raw["image_type"] = string(probed)
			disks[len(disks)-1].sector0Refused = probed == vmm.ImageRaw || probed == vmm.ImageFixedVhd
		case probed:
		default:
			return fail(failed("cannot open disk %s: image_type %s given, %s detected", path, given, probed))
		}
		if err := lockImage(f, ro); err != nil {
			return fail(failed("cannot open disk %s: %v", path, err))
		}
	}
	if err := vc.sync(); err != nil {
		return fail(failed("invalid VM config: %v", err))
	}
	return disks, nil
}

// lockImage takes CH's default (ByteRange) lock on an image: F_OFD_SETLK
// over [0, size), a write lock for a read-write disk, a read lock for a
// read-only one. The lock lives as long as the open file description.
func lockImage(f *os.File, readonly bool) error {
	fi, err := f.Stat()
	if err != nil {
		return err
	}
	lk := unix.Flock_t{Type: unix.F_WRLCK, Whence: io.SeekStart, Start: 0, Len: fi.Size()}
	kind := "write"
	if readonly {
		lk.Type, kind = unix.F_RDLCK, "read"
	}
	for {
		err = unix.FcntlFlock(f.Fd(), unix.F_OFD_SETLK, &lk)
		if !errors.Is(err, unix.EINTR) {
			break
		}
	}
	if errors.Is(err, unix.EAGAIN) || errors.Is(err, unix.EACCES) {
		return fmt.Errorf("cannot take a %s lock on the image: it is locked by another VMM", kind)
	}
	return err
}

// writeGuestSector0 is what a guest's superblock commit does to a disk
// whose filesystem keeps its superblock in block 0 (ext4 with 4 KiB
// blocks): it rewrites sector 0, here with the bytes already there.
func writeGuestSector0(d disk) error {
	if !d.writable {
		return nil
	}
	if d.sector0Refused {
		return fmt.Errorf("write to sector 0 of %s refused (VIRTIO_BLK_S_IOERR): image type auto-detected as raw, not given", d.path)
	}
	buf := make([]byte, sectorSize)
	n, err := d.f.ReadAt(buf, 0)
	if err != nil && !errors.Is(err, io.EOF) {
		return err
	}
	if n == 0 {
		return nil
	}
	_, err = d.f.WriteAt(buf[:n], 0)
	return err
}

// snapshotState is the stand-in's state.json, shaped like CH's Snapshot
// tree: per-component snapshots keyed by id, the device manager's keyed by
// device id, the memory manager's carrying the table of guest memory
// ranges that memory-ranges holds back to back.
type snapshotState struct {
	Snapshots map[string]snapshotNode `json:"snapshots"`
}

type snapshotNode struct {
	Snapshots map[string]snapshotNode `json:"snapshots,omitempty"`
	Data      json.RawMessage         `json:"snapshot_data,omitempty"`
}

type memoryRange struct {
	GPA    uint64 `json:"gpa"`
	Length uint64 `json:"length"`
}

type memoryState struct {
	MemoryRanges []memoryRange `json:"memory_ranges"`
}

// vmState is the stand-in's own record of the VM at snapshot time.
type vmState struct {
	State   vmm.State `json:"state"`
	TakenAt string    `json:"taken_at"`
}

// writeSnapshot writes CH's three snapshot files into dir, which must
// exist; each is created exclusively and left unsynced, as CH does.
func writeSnapshot(dir string, vc *vmConfig, st vmState) error {
	fi, err := os.Stat(dir)
	if err != nil {
		return err
	}
	if !fi.IsDir() {
		return fmt.Errorf("%s is not a directory", dir)
	}
	cfgData, err := json.Marshal(vc.raw)
	if err != nil {
		return err
	}
	mem := memoryState{MemoryRanges: []memoryRange{{GPA: 0, Length: uint64(vc.cfg.Memory.Size)}}}
	devices := map[string]snapshotNode{}
	for _, raw := range vc.disks() {
		id, _ := raw["id"].(string)
		data, _ := json.Marshal(map[string]any{"disk_path": raw["path"], "avail_features": 0})
		devices[id] = snapshotNode{Data: data}
	}
	if v := vc.vsock(); v != nil {
		id, _ := v["id"].(string)
		data, _ := json.Marshal(map[string]any{"cid": v["cid"]})
		devices[id] = snapshotNode{Data: data}
	}
	memData, _ := json.Marshal(mem)
	vmData, _ := json.Marshal(st)
	state := snapshotState{Snapshots: map[string]snapshotNode{
		"vm":             {Data: vmData},
		"memory_manager": {Data: memData},
		"device_manager": {Snapshots: devices},
	}}
	stateData, err := json.Marshal(state)
	if err != nil {
		return err
	}
	if err := createExclusive(filepath.Join(dir, vmm.SnapshotConfigFile), cfgData, 0); err != nil {
		return err
	}
	if err := createExclusive(filepath.Join(dir, vmm.SnapshotStateFile), stateData, 0); err != nil {
		return err
	}
	// Guest memory: the ranges back to back, sparse where the guest never
	// wrote, as CH's sparse layout leaves them; the stand-in's guest has
	// written its first page.
	page := bytes.Repeat([]byte("nexus stand-in guest memory\n"), 4096/28+1)[:4096]
	return createExclusive(filepath.Join(dir, vmm.SnapshotMemoryFile), page, int64(mem.MemoryRanges[0].Length))
}

func createExclusive(path string, data []byte, size int64) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return err
	}
	if size > 0 {
		if err := f.Truncate(size); err != nil {
			f.Close()
			return err
		}
	}
	if _, err := f.Write(data); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// readSnapshot reads what CH's vm.restore reads: the configuration, the
// state, and the guest memory, which must hold every saved range.
func readSnapshot(dir string) (*vmConfig, error) {
	data, err := os.ReadFile(filepath.Join(dir, vmm.SnapshotConfigFile))
	if err != nil {
		return nil, err
	}
	vc, err := parseVMConfig(data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", vmm.SnapshotConfigFile, err)
	}
	if err := validateConfig(&vc.cfg); err != nil {
		return nil, fmt.Errorf("%s: %w", vmm.SnapshotConfigFile, err)
	}
	data, err = os.ReadFile(filepath.Join(dir, vmm.SnapshotStateFile))
	if err != nil {
		return nil, err
	}
	var st snapshotState
	if err := json.Unmarshal(data, &st); err != nil {
		return nil, fmt.Errorf("%s: %w", vmm.SnapshotStateFile, err)
	}
	var vs vmState
	if err := json.Unmarshal(st.Snapshots["vm"].Data, &vs); err != nil || vs.State != vmm.StatePaused {
		return nil, fmt.Errorf("%s: not the snapshot of a paused VM (CH snapshots only paused ones): %v", vmm.SnapshotStateFile, err)
	}
	var mem memoryState
	if err := json.Unmarshal(st.Snapshots["memory_manager"].Data, &mem); err != nil {
		return nil, fmt.Errorf("%s: memory manager state: %w", vmm.SnapshotStateFile, err)
	}
	var want uint64
	for _, r := range mem.MemoryRanges {
		want += r.Length
	}
	if want > 0 {
		fi, err := os.Stat(filepath.Join(dir, vmm.SnapshotMemoryFile))
		if err != nil {
			return nil, fmt.Errorf("guest memory: %w", err)
		}
		if uint64(fi.Size()) < want {
			return nil, fmt.Errorf("guest memory: %s holds %d bytes, the saved ranges %d", vmm.SnapshotMemoryFile, fi.Size(), want)
		}
	}
	vc.assignIDs()
	if err := vc.sync(); err != nil {
		return nil, err
	}
	var saved []string
	for id := range st.Snapshots["device_manager"].Snapshots {
		saved = append(saved, id)
	}
	sort.Strings(saved)
	if got := vc.deviceIDs(); !slices.Equal(got, saved) {
		return nil, fmt.Errorf("device ids %v in %s do not match the saved device state %v: the guest would get fresh devices", got, vmm.SnapshotConfigFile, saved)
	}
	return vc, nil
}
