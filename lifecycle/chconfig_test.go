package lifecycle

import (
	"context"
	"encoding/json"
	"reflect"
	"slices"
	"testing"

	"github.com/nexus-sandbox/nexus/agentproto"
	"github.com/nexus-sandbox/nexus/events"
	"github.com/nexus-sandbox/nexus/guest/agent"
	"github.com/nexus-sandbox/nexus/host/driver"
	"github.com/nexus-sandbox/nexus/host/vmm"
	"github.com/nexus-sandbox/nexus/layout"
	"github.com/nexus-sandbox/nexus/projections"
)

// TestCreateBodyConformsToCHOpenAPI checks the vm.create body nexus sends
// against the facts of Cloud Hypervisor's OpenAPI document
// (vmm/src/api/openapi/cloud-hypervisor.yaml), read as JSON the way CH's
// serde reads it, not through nexus's own types: VmConfig requires
// payload; CpusConfig boot_vcpus and max_vcpus (minimum 1); MemoryConfig
// size; VsockConfig cid (minimum 3) and socket; SerialConfig mode from
// ConsoleMode's enum; DiskConfig's image_type from ImageType's enum and its
// serial a string. And
// nexus's own rules on top: every disk typed Raw (CH v51+ refuses sector-0
// writes on a probed raw disk), serial to a File under logs/, the
// virtio-console Off.
func TestCreateBodyConformsToCHOpenAPI(t *testing.T) {
	root := layout.Root("/state")
	id := "01JDQ4Z6X1M9A3Y0C5TB2R8NKW"
	for _, d := range []driver.Driver{{Name: driver.Process}, {Name: driver.CloudHypervisor, Kernel: "/boot/vmlinux"}, {Name: driver.QEMU, Kernel: "/boot/vmlinuz"}} {
		disks := (&Manager{Root: root}).vmDisks(context.Background(), sandboxWithDisksAndVolume())
		body, err := json.Marshal(vmConfig(d, events.BootConfig{Cpus: 2, MemoryBytes: 1 << 30}, disks, guestMounts(sandboxWithDisksAndVolume()), root.VsockSocket(id), root.ConsoleLog(id)))
		if err != nil {
			t.Fatal(err)
		}
		var cfg map[string]any
		if err := json.Unmarshal(body, &cfg); err != nil {
			t.Fatal(err)
		}
		obj := func(m map[string]any, key string) map[string]any {
			t.Helper()
			o, ok := m[key].(map[string]any)
			if !ok {
				t.Fatalf("%s: %s missing or not an object: %s", d.Name, key, body)
			}
			return o
		}
		num := func(m map[string]any, key string, min float64) {
			t.Helper()
			if v, ok := m[key].(float64); !ok || v < min || v != float64(int64(v)) {
				t.Fatalf("%s: %s = %v, want an integer >= %v: %s", d.Name, key, m[key], min, body)
			}
		}
		payload := obj(cfg, "payload")
		if k, _ := payload["kernel"].(string); k == "" {
			t.Fatalf("%s: payload without a kernel: %s", d.Name, body)
		}
		cpus := obj(cfg, "cpus")
		num(cpus, "boot_vcpus", 1)
		num(cpus, "max_vcpus", 1)
		num(obj(cfg, "memory"), "size", 1)
		// The sandbox's size, as CH reads it: both vCPU counts, bytes.
		if cpus["boot_vcpus"] != 2.0 || cpus["max_vcpus"] != 2.0 || obj(cfg, "memory")["size"] != float64(1<<30) {
			t.Fatalf("%s: cpus %v memory %v, want 2 vCPUs and 1 GiB: %s", d.Name, cpus, cfg["memory"], body)
		}
		vsock := obj(cfg, "vsock")
		num(vsock, "cid", 3)
		if s, _ := vsock["socket"].(string); s != root.VsockSocket(id) {
			t.Fatalf("%s: vsock socket %v", d.Name, vsock["socket"])
		}
		serial := obj(cfg, "serial")
		if mode, _ := serial["mode"].(string); !slices.Contains([]string{"Off", "Pty", "Tty", "File", "Socket", "Null"}, mode) || mode != "File" || serial["file"] != root.ConsoleLog(id) {
			t.Fatalf("%s: serial %v, want mode File to %s", d.Name, serial, root.ConsoleLog(id))
		}
		// The virtio-console explicitly Off (CH's default is Tty).
		if console := obj(cfg, "console"); console["mode"] != "Off" {
			t.Fatalf("%s: console %v, want mode Off", d.Name, console)
		}
		list, _ := cfg["disks"].([]any)
		if len(list) != 3 || len(list) != len(disks) {
			t.Fatalf("%s: disks %v", d.Name, list)
		}
		for i, x := range list {
			disk := x.(map[string]any)
			if it, _ := disk["image_type"].(string); !slices.Contains([]string{"FixedVhd", "Qcow2", "Raw", "Vhdx", "Unknown"}, it) || it != "Raw" {
				t.Fatalf("%s: disk %d image_type %v, want Raw", d.Name, i, disk["image_type"])
			}
			if _, ok := disk["readonly"].(bool); !ok || disk["path"] != disks[i].Path {
				t.Fatalf("%s: disk %d %v", d.Name, i, disk)
			}
			// DiskConfig.serial is a string (the guest's virtio-blk serial).
			if serial, ok := disk["serial"].(string); !ok || serial == "" || len(serial) > 20 {
				t.Fatalf("%s: disk %d serial %v, want a string of 1-20 bytes", d.Name, i, disk["serial"])
			}
		}
	}
}

// TestVMDisksAreAllTyped: the disks a sandbox boots with, its volumes
// included, all carry image_type Raw.
func TestVMDisksAreAllTyped(t *testing.T) {
	m := &Manager{Root: layout.Root("/state")}
	sb := sandboxWithDisksAndVolume()
	disks := m.vmDisks(context.Background(), sb)
	if len(disks) != 3 {
		t.Fatalf("disks %+v", disks)
	}
	for _, d := range disks {
		if d.ImageType != vmm.ImageRaw {
			t.Fatalf("untyped disk %+v", d)
		}
	}
	// Each carries the serial the guest finds it by (docs/guest-agent.md).
	for i, want := range []string{"nexus-os", "nexus-workspace", "nexus-vol-data"} {
		if disks[i].Serial != want {
			t.Errorf("disk %s: serial %q, want %q", disks[i].Path, disks[i].Serial, want)
		}
	}
}

// TestCmdlineMountsVolumesAtTheirGuestPaths: the kernel command line of
// a sandbox with volumes carries nexus.mount=SERIAL:/path for each one
// attached with a guest path, after the configured command line, for every
// driver; the agent's own parser reads back each volume's serial at its
// path (and the workspace where it always is). The serial named is the
// one the volume's disk carries.
func TestCmdlineMountsVolumesAtTheirGuestPaths(t *testing.T) {
	sb := sandboxWithDisksAndVolume()
	sb.Volumes = append(sb.Volumes, projections.Attachment{Name: "cache", GuestPath: "/var/cache/x", ReadOnly: true})
	disks := (&Manager{Root: layout.Root("/state")}).vmDisks(context.Background(), sb)
	for _, d := range []driver.Driver{{Name: driver.Process}, {Name: driver.CloudHypervisor, Kernel: "/boot/vmlinux", Cmdline: "console=ttyS0 quiet"}, {Name: driver.QEMU, Kernel: "/boot/vmlinuz"}} {
		c := vmConfig(d, events.BootConfig{Cpus: 1, MemoryBytes: DefaultMemory}, disks, guestMounts(sb), "/state/run/v.vsock", "/state/logs/c.log")
		base := d.Cmdline
		if base == "" {
			base = DefaultCmdline
		}
		want := base + " nexus.mount=nexus-vol-data:/data nexus.mount=nexus-vol-cache:/var/cache/x"
		if d.Name == driver.CloudHypervisor {
			want += " " + agentproto.CmdlineVsockOnly
		}
		if c.Payload.Cmdline != want {
			t.Fatalf("%s: cmdline %q, want %q", d.Name, c.Payload.Cmdline, want)
		}
		// The agent waits for a virtio-serial port except under CH, which gives none.
		if only := agent.VsockOnly(c.Payload.Cmdline); only != (d.Name == driver.CloudHypervisor) {
			t.Fatalf("%s: the agent reads vsock-only %v from %q", d.Name, only, c.Payload.Cmdline)
		}
		mounts, err := agent.ParseCmdline(c.Payload.Cmdline, agentproto.SerialWorkspace)
		if err != nil {
			t.Fatalf("%s: the agent cannot parse %q: %v", d.Name, c.Payload.Cmdline, err)
		}
		wantMounts := map[string]string{"nexus-workspace": "/workspace", "nexus-vol-data": "/data", "nexus-vol-cache": "/var/cache/x"}
		if !reflect.DeepEqual(mounts, wantMounts) {
			t.Fatalf("%s: the agent reads %v, want %v", d.Name, mounts, wantMounts)
		}
		for serial := range wantMounts {
			if serial != agentproto.SerialWorkspace && !slices.ContainsFunc(disks, func(d vmm.Disk) bool { return d.Serial == serial }) {
				t.Fatalf("%s: cmdline mounts %s, which no disk carries: %+v", d.Name, serial, disks)
			}
		}
	}
	// Without volumes the command line is the configured one, untouched.
	sb.Volumes = nil
	if c := vmConfig(driver.Driver{Name: driver.Process}, events.BootConfig{Cpus: 1, MemoryBytes: DefaultMemory}, nil, guestMounts(sb), "v", "c"); c.Payload.Cmdline != DefaultCmdline {
		t.Fatalf("cmdline without volumes %q", c.Payload.Cmdline)
	}
}

func sandboxWithDisksAndVolume() projections.Sandbox {
	id := "01JDQ4Z6X1M9A3Y0C5TB2R8NKW"
	return projections.Sandbox{ID: id,
		Resources: []events.Resource{
			{Kind: events.KindRawDisk, Path: "disks/" + id + ".raw"},
			{Kind: events.KindWorkspaceDisk, Path: "disks/" + id + "-workspace.ext4"},
			{Kind: events.KindAPISocket, Path: "run/sb-" + id + ".sock"},
		},
		Volumes: []projections.Attachment{{Name: "data", GuestPath: "/data"}},
	}
}

// TestBootAssetsReachThePayload: the initramfs and command line reach
// vm.create's payload for every driver, the kernel for every driver that
// boots one, and an unset command line is the default. Under Cloud
// Hypervisor the command line also tells the agent that it has vsock and
// no virtio-serial port, so it does not wait for one.
func TestBootAssetsReachThePayload(t *testing.T) {
	for _, d := range []driver.Driver{
		{Name: driver.Process, Initramfs: "/i.cpio.gz", Cmdline: "console=ttyS0 quiet"},
		{Name: driver.CloudHypervisor, Kernel: "/boot/vmlinuz", Initramfs: "/i.cpio.gz", Cmdline: "console=ttyS0 quiet"},
		{Name: driver.QEMU, Kernel: "/boot/vmlinuz", Initramfs: "/i.cpio.gz", Cmdline: "console=ttyS0 quiet"},
	} {
		tail := ""
		if d.Name == driver.CloudHypervisor {
			tail = " " + agentproto.CmdlineVsockOnly
		}
		p := vmConfig(d, events.BootConfig{Cpus: 1, MemoryBytes: DefaultMemory}, nil, nil, "/v", "/c").Payload
		if p.Initramfs != d.Initramfs || p.Cmdline != d.Cmdline+tail {
			t.Errorf("%s: payload %+v, want initramfs %s cmdline %q", d.Name, p, d.Initramfs, d.Cmdline+tail)
		}
		if d.Kernel != "" && p.Kernel != d.Kernel {
			t.Errorf("%s: kernel %q, want %q", d.Name, p.Kernel, d.Kernel)
		}
		d.Cmdline, d.Initramfs = "", ""
		if p := vmConfig(d, events.BootConfig{Cpus: 1, MemoryBytes: DefaultMemory}, nil, nil, "/v", "/c").Payload; p.Cmdline != DefaultCmdline+tail || p.Initramfs != "" {
			t.Errorf("%s: payload without assets %+v, want cmdline %q and no initramfs", d.Name, p, DefaultCmdline+tail)
		}
	}
}
