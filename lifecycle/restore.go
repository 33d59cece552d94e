package lifecycle

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/nexus-sandbox/nexus/host/disk"
	"github.com/nexus-sandbox/nexus/host/fsx"
	"github.com/nexus-sandbox/nexus/host/vmm"
)

// vmStateFiles lists the files of a snapshot directory that the VMM wrote
// (for Cloud Hypervisor config.json, state.json and memory-ranges; any
// other file it adds is carried too): every regular file except nexus's
// manifest and the disk copies the manifest names. It refuses a directory
// that lacks one of the three files CH's restore reads.
func vmStateFiles(dir string, man manifest) ([]string, error) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	skip := map[string]bool{"manifest.json": true}
	for _, d := range man.Disks {
		skip[d.File] = true
	}
	var files []string
	have := map[string]bool{}
	for _, e := range ents {
		if skip[e.Name()] || !e.Type().IsRegular() {
			continue
		}
		files = append(files, e.Name())
		have[e.Name()] = true
	}
	for _, want := range []string{vmm.SnapshotConfigFile, vmm.SnapshotStateFile, vmm.SnapshotMemoryFile} {
		if !have[want] {
			return nil, fmt.Errorf("%w: snapshot %s holds no %s: the VMM's restore reads config.json, state.json and memory-ranges", ErrRefused, filepath.Base(dir), want)
		}
	}
	return files, nil
}

// restoreEdit decides how the snapshot's config.json is re-pointed at the
// child: each of the source's own disks at the child's copy of it (the
// manifest's copies, matched by file name), the vsock and serial log at
// the child's. A disk that is one of the source's named volumes refuses
// the restore: the saved guest expects that device, a restored child never
// takes over a volume (a volume is never shared writable), and dropping
// the disk would hand the guest fresh devices under different ids.
func (m *Manager) restoreEdit(dir string, man manifest, child string, copies []sourceDisk) (vmm.SnapshotEdit, error) {
	snap := filepath.Base(dir)
	cfg, err := fsx.ReadFile(string(m.Root), filepath.Join(dir, vmm.SnapshotConfigFile))
	if err != nil {
		return vmm.SnapshotEdit{}, err
	}
	disks, err := vmm.SnapshotDisks(cfg)
	if err != nil {
		return vmm.SnapshotEdit{}, err
	}
	edit := vmm.SnapshotEdit{Disks: map[string]string{}, VsockSocket: m.Root.VsockSocket(child), SerialFile: m.Root.ConsoleLog(child)}
	var volumes []string
	for _, d := range disks {
		if rel, err := filepath.Rel(m.Root.Volumes(), d.Path); err == nil && !strings.HasPrefix(rel, "..") {
			volumes = append(volumes, strings.SplitN(rel, string(filepath.Separator), 2)[0])
			continue
		}
		if d.Readonly && man.Bootstrap.CacheID != "" && d.Path == m.Root.ImageDisk(man.Bootstrap.CacheID) {
			// An overlay root's OS disk: the shared cache entry, which the
			// child boots on too (the snapshot holds no copy of it).
			edit.Disks[d.Path] = d.Path
			continue
		}
		found := false
		for i, md := range man.Disks {
			if md.File == filepath.Base(d.Path) && i < len(copies) {
				edit.Disks[d.Path], found = copies[i].dst, true
				break
			}
		}
		if !found {
			return edit, fmt.Errorf("%w: snapshot %s: its VM configuration names disk %s, which the snapshot does not hold", ErrRefused, snap, d.Path)
		}
	}
	if len(volumes) > 0 {
		return edit, fmt.Errorf("%w: snapshot %s holds the running guest of sandbox %s with named volume(s) %s attached; a restored guest needs those disks and a restored sandbox never takes over a volume (snapshot the sandbox stopped: that restore boots cold, without the volumes)",
			ErrRefused, snap, man.Sandbox, strings.Join(volumes, ", "))
	}
	return edit, nil
}

// stageRestore copies the VM state files of snapshot dir into stage,
// config.json edited (generic JSON: only paths change), the others cloned
// as they are (memory-ranges sparse or reflinked, as disk.Clone does).
func stageRestore(root, dir, stage string, files []string, edit vmm.SnapshotEdit) error {
	if err := fsx.MkdirAll(root, stage, 0o700); err != nil {
		return err
	}
	for _, name := range files {
		src, dst := filepath.Join(dir, name), filepath.Join(stage, name)
		if name != vmm.SnapshotConfigFile {
			if _, err := disk.Clone(src, dst); err != nil {
				return err
			}
			continue
		}
		data, err := fsx.ReadFile(root, src)
		if err != nil {
			return err
		}
		out, err := vmm.EditSnapshotConfig(data, edit)
		if err != nil {
			return err
		}
		if err := fsx.WriteFile(root, dst, out, 0o600); err != nil {
			return err
		}
	}
	return nil
}

// filesAllocated is the space files in dir take on disk.
func filesAllocated(dir string, files []string) int64 {
	var n int64
	for _, f := range files {
		if size, err := disk.Stat(filepath.Join(dir, f)); err == nil {
			n += size.Allocated
		}
	}
	return n
}
