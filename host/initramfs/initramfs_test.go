package initramfs

import (
	"bytes"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"testing"
)

func writeFile(t *testing.T, p, data string) {
	t.Helper()
	os.MkdirAll(filepath.Dir(p), 0o755)
	if err := os.WriteFile(p, []byte(data), 0o644); err != nil {
		t.Fatal(err)
	}
}

func TestResolveModules(t *testing.T) {
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "modules.dep"), `kernel/a/virtio_ring.ko:
kernel/a/virtio.ko: kernel/a/virtio_ring.ko
kernel/a/virtio_pci.ko: kernel/a/legacy.ko kernel/a/virtio.ko kernel/a/virtio_ring.ko
kernel/a/legacy.ko:
kernel/b/virtio_blk.ko: kernel/a/virtio.ko kernel/a/virtio_ring.ko
`)
	writeFile(t, filepath.Join(dir, "modules.builtin"), "kernel/fs/ext4/ext4.ko\n")
	got, err := ResolveModules(dir, []string{"virtio_pci", "virtio-blk", "ext4"})
	if err != nil {
		t.Fatal(err)
	}
	// Dependencies first, each once; a built-in module needs no file.
	want := []string{"kernel/a/virtio_ring.ko", "kernel/a/virtio.ko", "kernel/a/legacy.ko", "kernel/a/virtio_pci.ko", "kernel/b/virtio_blk.ko"}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("got %v, want %v", got, want)
	}
	if _, err := ResolveModules(dir, []string{"vsock"}); err == nil {
		t.Fatal("a module in neither list was accepted")
	}
}

// readNewc parses a newc archive back: name -> (mode, data).
func readNewc(t *testing.T, b []byte) map[string][2]string {
	t.Helper()
	out := map[string][2]string{}
	for off := 0; ; {
		if string(b[off:off+6]) != "070701" {
			t.Fatalf("bad magic at %d", off)
		}
		field := func(i int) int {
			v, err := strconv.ParseUint(string(b[off+6+8*i:off+14+8*i]), 16, 32)
			if err != nil {
				t.Fatal(err)
			}
			return int(v)
		}
		mode, size, namesize := field(1), field(6), field(11)
		name := string(b[off+110 : off+110+namesize-1])
		off = (off + 110 + namesize + 3) &^ 3
		data := string(b[off : off+size])
		off = (off + size + 3) &^ 3
		if name == "TRAILER!!!" {
			return out
		}
		out[name] = [2]string{strconv.FormatUint(uint64(mode), 8), data}
	}
}

func TestBuild(t *testing.T) {
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "kernel/a/virtio.ko"), "module bytes")
	var b bytes.Buffer
	if err := Build(&b, []byte("agent"), dir, []string{"kernel/a/virtio.ko"}); err != nil {
		t.Fatal(err)
	}
	got := readNewc(t, b.Bytes())
	for name, want := range map[string][2]string{
		"init":                           {"100755", "agent"},
		"dev/console":                    {"20600", ""},
		"lib/modules/kernel/a":           {"40755", ""},
		"lib/modules/kernel/a/virtio.ko": {"100644", "module bytes"},
		ModuleList:                       {"100644", "/lib/modules/kernel/a/virtio.ko\n"},
	} {
		if got[name] != want {
			t.Errorf("%s: %v, want %v", name, got[name], want)
		}
	}
}
