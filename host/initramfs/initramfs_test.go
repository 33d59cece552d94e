package initramfs

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"

	"github.com/klauspost/compress/zstd"
	"github.com/ulikunitz/xz"
)

const depText = `kernel/drivers/virtio/virtio_ring.ko:
kernel/drivers/virtio/virtio.ko: kernel/drivers/virtio/virtio_ring.ko
kernel/drivers/virtio/virtio_pci_modern_dev.ko:
kernel/drivers/virtio/virtio_pci.ko: kernel/drivers/virtio/virtio_pci_modern_dev.ko kernel/drivers/virtio/virtio.ko kernel/drivers/virtio/virtio_ring.ko
kernel/drivers/block/virtio_blk.ko.xz: kernel/drivers/virtio/virtio.ko kernel/drivers/virtio/virtio_ring.ko
kernel/drivers/char/virtio_console.ko.zst: kernel/drivers/virtio/virtio.ko kernel/drivers/virtio/virtio_ring.ko
kernel/fs/unrelated.ko:
`

// TestClosureOrdersDependencies: every module comes after each one it
// needs, each once; built-ins are named, missing optional ones listed, a
// missing wanted one and a cycle are errors.
func TestClosureOrdersDependencies(t *testing.T) {
	dep, err := ParseDep(strings.NewReader(depText))
	if err != nil {
		t.Fatal(err)
	}
	order, builtin, missing, err := Closure(dep, map[string]bool{"ext4": true},
		[]string{"virtio_pci", "virtio-blk", "virtio_console", "ext4"}, []string{"vmw_vsock_virtio_transport"})
	if err != nil {
		t.Fatal(err)
	}
	pos := map[string]int{}
	for i, rel := range order {
		if _, dup := pos[rel]; dup {
			t.Fatalf("%s twice in %v", rel, order)
		}
		pos[rel] = i
	}
	for rel, needs := range dep {
		if _, in := pos[rel]; !in {
			continue
		}
		for _, d := range needs {
			if p, ok := pos[d]; !ok || p > pos[rel] {
				t.Errorf("%s loads before its dependency %s: %v", rel, d, order)
			}
		}
	}
	if len(order) != 6 || slices.Contains(order, "kernel/fs/unrelated.ko") {
		t.Errorf("order %v: want the 6 modules of the closure only", order)
	}
	if !slices.Equal(builtin, []string{"ext4"}) || !slices.Equal(missing, []string{"vmw_vsock_virtio_transport"}) {
		t.Errorf("builtin %v missing %v", builtin, missing)
	}
	if _, _, _, err := Closure(dep, nil, []string{"ext4"}, nil); err == nil || !strings.Contains(err.Error(), "ext4") {
		t.Errorf("a wanted module the kernel lacks: %v", err)
	}
	cyc := Dep{"a.ko": {"b.ko"}, "b.ko": {"a.ko"}}
	if _, _, _, err := Closure(cyc, nil, []string{"a"}, nil); err == nil || !strings.Contains(err.Error(), "cycle") {
		t.Errorf("a cycle: %v", err)
	}
	if _, _, _, err := Closure(Dep{"a.ko": {"gone.ko"}}, nil, []string{"a"}, nil); err == nil {
		t.Error("a dependency without its own entry was accepted")
	}
}

// TestBuildIsANewcArchiveCpioReads builds from a modules directory with a
// plain, an xz and a zstd module and checks the archive with the real
// cpio: /init is the binary given, every module of the closure is there
// decompressed, and the module list names them in load order.
func TestBuildIsANewcArchiveCpioReads(t *testing.T) {
	if _, err := exec.LookPath("cpio"); err != nil {
		t.Fatal("cpio is not installed (make setup-fast installs it)")
	}
	dir := t.TempDir()
	mods := filepath.Join(dir, "6.1.0-test")
	elfOf := func(name string) []byte { return append([]byte("\x7fELF"), []byte(name+strings.Repeat("x", 100))...) }
	for rel := range mustDep(t) {
		p := filepath.Join(mods, rel)
		os.MkdirAll(filepath.Dir(p), 0o755)
		plain := elfOf(ModuleName(rel))
		var data []byte
		switch {
		case strings.HasSuffix(rel, ".xz"):
			var b bytes.Buffer
			w, _ := xz.NewWriter(&b)
			w.Write(plain)
			w.Close()
			data = b.Bytes()
		case strings.HasSuffix(rel, ".zst"):
			e, _ := zstd.NewWriter(nil)
			data = e.EncodeAll(plain, nil)
		default:
			data = plain
		}
		if err := os.WriteFile(p, data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	os.WriteFile(filepath.Join(mods, "modules.dep"), []byte(depText), 0o644)
	os.WriteFile(filepath.Join(mods, "modules.builtin"), []byte("kernel/fs/ext4/ext4.ko\nkernel/fs/overlayfs/overlay.ko\n"), 0o644)
	init := staticInit(t)
	out := filepath.Join(dir, "initrd.gz")
	res, err := Build(Options{ModulesDir: mods, Init: init, Out: out, Wanted: Wanted, Optional: Optional})
	if err != nil {
		t.Fatal(err)
	}
	x := filepath.Join(dir, "x")
	os.Mkdir(x, 0o755)
	list := cpioRun(t, out, x, "-t")
	for _, want := range []string{"init", "dev", "proc", "sys", "workspace", ModuleList,
		"lib/modules/6.1.0-test/kernel/drivers/block/virtio_blk.ko", "lib/modules/6.1.0-test/kernel/drivers/char/virtio_console.ko"} {
		if !slices.Contains(list, want) {
			t.Errorf("cpio -t lacks %s: %v", want, list)
		}
	}
	cpioRun(t, out, x, "-id")
	got, _ := os.ReadFile(filepath.Join(x, "init"))
	want, _ := os.ReadFile(init)
	if !bytes.Equal(got, want) {
		t.Error("/init is not the binary given")
	}
	if fi, err := os.Stat(filepath.Join(x, "init")); err != nil || fi.Mode().Perm()&0o111 == 0 {
		t.Errorf("/init not executable: %v %v", fi, err)
	}
	listed, _ := os.ReadFile(filepath.Join(x, ModuleList))
	lines := strings.Fields(string(listed))
	if !slices.Equal(lines, res.Modules) || len(lines) != 6 {
		t.Fatalf("module list %q, want %v", listed, res.Modules)
	}
	for _, m := range lines {
		data, err := os.ReadFile(filepath.Join(x, m))
		if err != nil || !bytes.Equal(data, elfOf(ModuleName(m))) {
			t.Errorf("%s: not the decompressed module (%v)", m, err)
		}
	}
}

// TestBuildRefusesADynamicInit: an /init with a program interpreter could
// never run from the initramfs; Build says so and writes nothing.
func TestBuildRefusesADynamicInit(t *testing.T) {
	// Any dynamically linked program serves; cpio is one the tests need.
	dynamic, err := exec.LookPath("cpio")
	if err != nil {
		t.Fatal("cpio is not installed (make setup-fast installs it)")
	}
	dir := t.TempDir()
	out := filepath.Join(dir, "initrd.gz")
	_, err = Build(Options{ModulesDir: dir, Init: dynamic, Out: out, Wanted: Wanted})
	if err == nil || !strings.Contains(err.Error(), "dynamically linked") {
		t.Fatalf("dynamic /init: %v", err)
	}
	if _, err := os.Stat(out); !os.IsNotExist(err) {
		t.Fatalf("an archive was written: %v", err)
	}
}

func mustDep(t *testing.T) Dep {
	dep, err := ParseDep(strings.NewReader(depText))
	if err != nil {
		t.Fatal(err)
	}
	return dep
}

// staticInit builds cmd/nexus-init as a user would (CGO off).
func staticInit(t *testing.T) string {
	t.Helper()
	_, file, _, _ := runtime.Caller(0)
	out := filepath.Join(t.TempDir(), "nexus-init")
	cmd := exec.Command("go", "build", "-o", out, "./cmd/nexus-init")
	cmd.Dir = filepath.Join(filepath.Dir(file), "..", "..")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build nexus-init: %v\n%s", err, b)
	}
	return out
}

func cpioRun(t *testing.T, archive, dir string, mode string) []string {
	t.Helper()
	cmd := exec.Command("sh", "-c", "gzip -dc \"$1\" | cpio --quiet "+mode, "sh", archive)
	cmd.Dir = dir
	b, err := cmd.Output()
	if err != nil {
		t.Fatalf("cpio %s: %v", mode, err)
	}
	return strings.Fields(string(b))
}
