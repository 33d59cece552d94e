package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nexus-sandbox/nexus/config"
	"github.com/nexus-sandbox/nexus/host/vmm"
	"github.com/nexus-sandbox/nexus/internal/testutil"
)

// vmmConfig is the configuration the sandbox's VMM was given, as it
// answers vm.info on its API socket (the stand-in keeps the vm.create
// body it accepted).
func vmmConfig(t *testing.T, root, id string) vmm.Config {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), testutil.Scale(30*time.Second))
	defer cancel()
	info, err := vmm.NewClient(filepath.Join(root, "run", "sb-"+id+".sock")).Info(ctx)
	if err != nil {
		t.Fatalf("vm.info of %s: %v", id, err)
	}
	return info.Config
}

// TestBootConfigIsRecordedAndUsed: create --cpus --memory records the
// sandbox's size and driver; the VMM's vm.create body carries the size as
// CH reads it (boot_vcpus = max_vcpus, memory.size in bytes); a start
// without --driver (the command's own default is cloud-hypervisor) boots
// under the recorded process driver at the recorded size, and fork and
// restore children inherit both.
func TestBootConfigIsRecordedAndUsed(t *testing.T) {
	testutil.StartsSandboxes(t)
	t.Parallel()
	root := shortRoot(t)
	cpus := min(2, runtime.NumCPU())
	sb := createJSON(t, root, "--image", makeImage(t), "--cpus", strconv.Itoa(cpus), "--memory", "1G")
	if sb.Driver != "process" || sb.Boot == nil || sb.Boot.Cpus != cpus || sb.Boot.MemoryBytes != 1<<30 || sb.Boot.Cmdline == "" {
		t.Fatalf("create --json: driver %q, boot %+v; want process, %d vCPUs, 1 GiB and the command line", sb.Driver, sb.Boot, cpus)
	}
	sized := func(id, when string) {
		t.Helper()
		c := vmmConfig(t, root, id)
		if c.Cpus.BootVcpus != cpus || c.Cpus.MaxVcpus != cpus || c.Memory.Size != 1<<30 {
			t.Fatalf("%s: the VMM was given cpus %+v, memory %d; want %d vCPUs and 1 GiB", when, c.Cpus, c.Memory.Size, cpus)
		}
	}
	sized(sb.ID, "create")
	mustOK(t, proc(t, root, "stop", sb.ID), "stop")
	r := nexusEnv(t, root, []string{"NEXUS_DRIVER="}, "start", sb.ID)
	mustOK(t, r, "start without --driver")
	sized(sb.ID, "start without --driver")
	if got := inspectJSON(t, root, sb.ID); got.State != "running" || got.Driver != "process" {
		t.Fatalf("after start: state %s, driver %s", got.State, got.Driver)
	}
	var children []jsonSandbox
	if err := json.Unmarshal([]byte(mustOK(t, nexusEnv(t, root, []string{"NEXUS_DRIVER="}, "fork", "--json", sb.ID), "fork").stdout), &children); err != nil || len(children) != 1 {
		t.Fatalf("fork --json: %v %+v", err, children)
	}
	child := children[0]
	if child.Driver != "process" || child.Boot == nil || *child.Boot != *sb.Boot {
		t.Fatalf("fork child: driver %q, boot %+v; want the parent's process, %+v", child.Driver, child.Boot, *sb.Boot)
	}
	sized(child.ID, "fork child")
	snap := strings.TrimSpace(mustOK(t, proc(t, root, "snapshot", sb.ID), "snapshot").stdout)
	var restored jsonSandbox
	if err := json.Unmarshal([]byte(mustOK(t, nexusEnv(t, root, []string{"NEXUS_DRIVER="}, "restore", "--json", snap), "restore").stdout), &restored); err != nil {
		t.Fatal(err)
	}
	if restored.Driver != "process" || restored.Boot == nil || *restored.Boot != *sb.Boot {
		t.Fatalf("restored: driver %q, boot %+v; want the source's process, %+v", restored.Driver, restored.Boot, *sb.Boot)
	}
	sized(restored.ID, "restored")
	mustOK(t, proc(t, root, "rm", "-f", "--with-snapshots", sb.ID, child.ID, restored.ID), "rm")
}

// TestStartRefusesAnotherDriver: an explicit --driver other than the
// sandbox's recorded one is refused, naming the recorded one, and the
// sandbox is left as it was; the same for fork.
func TestStartRefusesAnotherDriver(t *testing.T) {
	testutil.StartsSandboxes(t)
	t.Parallel()
	root := shortRoot(t)
	sb := createJSON(t, root, "--image", makeImage(t))
	mustOK(t, proc(t, root, "stop", sb.ID), "stop")
	wantFailure(t, nexus(t, root, "--driver", "qemu", "start", sb.ID), 1, "boots under the process driver")
	if got := inspectJSON(t, root, sb.ID); got.State != "stopped" || got.VMM != nil {
		t.Fatalf("a refused start changed the sandbox: state %s, vmm %+v", got.State, got.VMM)
	}
	wantFailure(t, nexus(t, root, "--driver", "cloud-hypervisor", "fork", sb.ID), 1, "boots under the process driver")
	if n := len(sandboxes(t, root)); n != 1 {
		t.Fatalf("a refused fork left %d sandboxes", n)
	}
	mustOK(t, proc(t, root, "rm", sb.ID), "rm")
}

// TestSizeBeyondTheHostIsRefused: more vCPUs than the host's CPUs, or
// more memory than it has, is a usage error naming both figures, from the
// flags or from [vm] settings, and writes nothing.
func TestSizeBeyondTheHostIsRefused(t *testing.T) {
	t.Parallel()
	root := shortRoot(t)
	img := makeImage(t)
	n := runtime.NumCPU()
	wantFailure(t, proc(t, root, "create", "--image", img, "--cpus", strconv.Itoa(n+1)), 2,
		fmt.Sprintf("%d vCPUs is more than this host's %d CPUs", n+1, n))
	wantFailure(t, proc(t, root, "create", "--image", img, "--memory", "64T"), 2, "memory 65536 GiB is more than this host's")
	wantFailure(t, proc(t, root, "create", "--image", img, "--memory", "lots"), 2, "--memory")
	wantFailure(t, proc(t, root, "create", "--image", img, "--cpus", "0"), 2, "--cpus 0")
	os.WriteFile(filepath.Join(root, "config.toml"), []byte(fmt.Sprintf("[vm]\ncpus = %d\n", n+1)), 0o600)
	wantFailure(t, proc(t, root, "create", "--image", img), 2, fmt.Sprintf("%d vCPUs is more than this host's %d CPUs", n+1, n))
	os.WriteFile(filepath.Join(root, "config.toml"), []byte("[vm]\nmemory = \"64T\"\n"), 0o600)
	wantFailure(t, proc(t, root, "create", "--image", img), 2, "memory 65536 GiB is more than this host's")
	// The flag wins over the setting.
	wantFailure(t, proc(t, root, "create", "--image", img, "--memory", "32M"), 2, "want at least 64 MiB")
	if list := sandboxes(t, root); len(list) != 0 {
		t.Fatalf("a refused size left sandboxes: %+v", list)
	}
	if left := untracked(t, root); len(left) > 0 {
		t.Fatalf("a refused size left files: %v", left)
	}
}

// TestBootSettingsInConfig: [vm] driver, kernel, cpus and memory are
// settings (no longer unknown keys), config show names them with their
// source, and a bad value is refused naming the key.
func TestBootSettingsInConfig(t *testing.T) {
	t.Parallel()
	root := shortRoot(t)
	file := filepath.Join(root, "config.toml")
	os.WriteFile(file, []byte("[vm]\ndriver = \"qemu\"\nkernel = \"/boot/vmlinuz-x\"\ncpus = 2\nmemory = \"1G\"\n"), 0o600)
	r := mustOK(t, nexusEnv(t, root, []string{"NEXUS_DRIVER=", "NEXUS_KERNEL_PATH="}, "config", "show", "--json"), "config show")
	var list []config.Setting
	if err := json.Unmarshal([]byte(r.stdout), &list); err != nil {
		t.Fatalf("config show --json: %v\n%s", err, r.stdout)
	}
	got := map[string]config.Setting{}
	for _, s := range list {
		got[s.Name] = s
	}
	for name, w := range map[string]config.Setting{
		"driver":       {Name: "driver", Value: "qemu", Source: "file " + file},
		"vm.kernel":    {Name: "vm.kernel", Value: "/boot/vmlinuz-x", Source: "file " + file},
		"vm.cpus":      {Name: "vm.cpus", Value: "2", Source: "file " + file},
		"vm.memory":    {Name: "vm.memory", Value: "1G", Source: "file " + file},
		"vm.cmdline":   {Name: "vm.cmdline", Value: "console=ttyS0 root=/dev/vda rw", Source: "default"},
		"vm.initramfs": {Name: "vm.initramfs", Value: "", Source: "default"},
	} {
		if got[name] != w {
			t.Errorf("%s: got %+v, want %+v", name, got[name], w)
		}
	}
	r = mustOK(t, nexusEnv(t, root, []string{"NEXUS_DRIVER=process", "NEXUS_KERNEL_PATH=/k"}, "config", "show", "--json"), "config show")
	if !strings.Contains(r.stdout, `"env NEXUS_DRIVER"`) || !strings.Contains(r.stdout, `"env NEXUS_KERNEL_PATH"`) {
		t.Errorf("the environment does not win over the file:\n%s", r.stdout)
	}
	for body, mention := range map[string]string{
		"[vm]\ndriver = \"firecracker\"\n": "[vm] driver",
		"[vm]\nkernel = \"vmlinuz\"\n":     "[vm] kernel",
		"[vm]\ncpus = 0\n":                 "[vm] cpus",
		"[vm]\nmemory = \"lots\"\n":        "[vm] memory",
	} {
		os.WriteFile(file, []byte(body), 0o600)
		wantFailure(t, proc(t, root, "create", "--image", makeImage(t)), 1, mention)
	}
}

// qemuArgs is the command line of the QEMU running under root.
func qemuArgs(t *testing.T, root string) string {
	t.Helper()
	for _, p := range testutil.ProcessesUnder(root) {
		if strings.Contains(p.Cmdline, " -smp ") {
			return p.Cmdline + " "
		}
	}
	t.Fatalf("no QEMU runs under %s: %+v", root, testutil.ProcessesUnder(root))
	return ""
}

// TestQEMUBootsAsRecorded: a sandbox created with --driver qemu, 2 vCPUs
// (1 on a 1-CPU host) and 1 GiB is handed to QEMU so (-smp, -m) and its
// guest sees that many CPUs and about that much memory. Once stopped,
// `--driver process start` is refused naming qemu, and a start with no
// --driver and no kernel or initramfs in the environment boots it under
// qemu again, from its record: its agent answers.
func TestQEMUBootsAsRecorded(t *testing.T) {
	testutil.StartsSandboxes(t)
	q := newRealGuest(t, 32)
	cpus := min(2, runtime.NumCPU())
	var sb jsonSandbox
	if err := json.Unmarshal([]byte(q.ok("create", "create", "--json", "--image", makeImage(t), "--cpus", strconv.Itoa(cpus), "--memory", "1G")), &sb); err != nil {
		t.Fatal(err)
	}
	if sb.Driver != "qemu" || sb.Boot == nil || sb.Boot.Kernel == "" || sb.Boot.Initramfs == "" {
		t.Fatalf("create --json: driver %q, boot %+v", sb.Driver, sb.Boot)
	}
	sizedArgs := func(when string) {
		t.Helper()
		if a := qemuArgs(t, q.root); !strings.Contains(a, fmt.Sprintf(" -smp %d ", cpus)) || !strings.Contains(a, " -m 1024 ") || !strings.Contains(a, " -kernel "+sb.Boot.Kernel+" ") {
			t.Fatalf("%s: QEMU runs as %s; want -smp %d, -m 1024 and the recorded kernel", when, a, cpus)
		}
	}
	sizedArgs("create")
	q.ready(sb.ID)
	if n := strings.Count(q.exec(sb.ID, "cat", "/proc/cpuinfo"), "processor\t:"); n != cpus {
		t.Errorf("the guest has %d CPUs, want %d", n, cpus)
	}
	var kib int64
	for _, line := range strings.Split(q.exec(sb.ID, "cat", "/proc/meminfo"), "\n") {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == "MemTotal:" {
			kib, _ = strconv.ParseInt(f[1], 10, 64)
		}
	}
	// The kernel keeps some of the 1 GiB for itself; 512 MiB (the default)
	// would be well below the floor.
	if kib < 768<<10 || kib > 1<<20 {
		t.Errorf("the guest's MemTotal is %d KiB, want about 1 GiB", kib)
	}
	q.ok("stop", "stop", sb.ID)
	bare := []string{"NEXUS_QEMU_ACCEL=tcg", "NEXUS_DRIVER=", "NEXUS_KERNEL_PATH=", "NEXUS_INITRAMFS_PATH="}
	wantFailure(t, nexusEnv(t, q.root, bare, "--driver", "process", "start", sb.ID), 1, "boots under the qemu driver")
	mustOK(t, nexusEnv(t, q.root, bare, "start", sb.ID), "start without --driver or a kernel in the environment")
	sizedArgs("start")
	if ev := q.ok("events", "events", "--sandbox", sb.ID, "--type", "sandbox.started", "--json"); strings.Count(ev, `"driver":"qemu"`) != 2 {
		t.Errorf("want two sandbox.started under qemu:\n%s", ev)
	}
	q.ready(sb.ID)
	q.finish(sb.ID)
}
