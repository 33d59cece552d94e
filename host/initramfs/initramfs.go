// Package initramfs builds a guest initramfs from the host's installed
// kernel modules: the virtio modules a distro kernel lacks (found with
// their dependencies through modules.dep), a static /init, and the list of
// modules /init loads, in order, as a gzipped newc cpio.
package initramfs

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"debug/elf"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/cavaliergopher/cpio"
	"github.com/klauspost/compress/zstd"
	"github.com/ulikunitz/xz"

	"github.com/nexus-sandbox/nexus/host/fsx"
)

// ModuleList is where /init finds the modules to load: one path inside the
// initramfs per line, each after every module it needs.
const ModuleList = "etc/nexus/modules"

// Wanted are the modules a guest needs to reach its disks and the host:
// virtio over PCI, the block and console (virtio-serial) drivers, ext4,
// and overlay (an overlay root over the shared read-only OS disk). A
// kernel that builds one in needs nothing for it.
var Wanted = []string{"virtio_pci", "virtio_blk", "virtio_console", "ext4", "overlay"}

// Optional are loaded when the kernel has them: the vsock transport
// (Cloud Hypervisor's agent channel; QEMU here uses virtio-serial).
var Optional = []string{"vmw_vsock_virtio_transport"}

// Options say what to build.
type Options struct {
	ModulesDir string // /lib/modules/<release>
	Init       string // a static binary, copied as /init
	Out        string // the archive, written to a temporary name then renamed
	Wanted     []string
	Optional   []string
	// Programs are more executables for the guest: path inside the
	// archive → file on the host, copied 0755.
	Programs map[string]string
}

// Result is what went into the archive.
type Result struct {
	Modules []string // paths inside the initramfs, in load order
	Builtin []string // wanted modules the kernel builds in
	Missing []string // optional modules the kernel does not have
}

// Build writes the archive. It refuses an /init that is not a static ELF
// executable: the initramfs has no dynamic loader, and the kernel's only
// report of a failed /init is a panic on the console.
func Build(o Options) (Result, error) {
	var res Result
	if err := staticELF(o.Init); err != nil {
		return res, fmt.Errorf("init %s: %w", o.Init, err)
	}
	dep, err := readDep(filepath.Join(o.ModulesDir, "modules.dep"))
	if err != nil {
		return res, err
	}
	builtin, err := readBuiltin(filepath.Join(o.ModulesDir, "modules.builtin"))
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return res, err
	}
	order, b, missing, err := Closure(dep, builtin, o.Wanted, o.Optional)
	if err != nil {
		return res, fmt.Errorf("%s: %w", o.ModulesDir, err)
	}
	res.Builtin, res.Missing = b, missing
	release := filepath.Base(filepath.Clean(o.ModulesDir))

	var buf bytes.Buffer
	gz := gzip.NewWriter(&buf)
	w := cpio.NewWriter(gz)
	now := time.Now()
	dirs := map[string]bool{}
	var addDir func(string) error
	addDir = func(d string) error {
		if d == "." || d == "/" || dirs[d] {
			return nil
		}
		if err := addDir(path.Dir(d)); err != nil {
			return err
		}
		dirs[d] = true
		return w.WriteHeader(&cpio.Header{Name: d, Mode: cpio.TypeDir | 0o755, ModTime: now, Links: 2})
	}
	addFile := func(name string, mode cpio.FileMode, data []byte) error {
		if err := addDir(path.Dir(name)); err != nil {
			return err
		}
		if err := w.WriteHeader(&cpio.Header{Name: name, Mode: cpio.TypeReg | mode, Size: int64(len(data)), ModTime: now, Links: 1}); err != nil {
			return err
		}
		_, err := w.Write(data)
		return err
	}
	// Mount points /init uses; /dev/console is made by devtmpfs, which
	// /init mounts before it writes a byte (the cpio writer here has no
	// device numbers, so the archive carries no device node).
	for _, d := range []string{"dev", "proc", "sys", "workspace", "mnt", "tmp"} {
		if err := addDir(d); err != nil {
			return res, err
		}
	}
	initData, err := os.ReadFile(o.Init)
	if err != nil {
		return res, err
	}
	if err := addFile("init", 0o755, initData); err != nil {
		return res, err
	}
	for _, name := range slices.Sorted(maps.Keys(o.Programs)) {
		data, err := os.ReadFile(o.Programs[name])
		if err != nil {
			return res, err
		}
		if err := addFile(strings.TrimPrefix(name, "/"), 0o755, data); err != nil {
			return res, err
		}
	}
	for _, rel := range order {
		data, err := readModule(filepath.Join(o.ModulesDir, rel))
		if err != nil {
			return res, err
		}
		name := path.Join("lib/modules", release, stripCompression(rel))
		if err := addFile(name, 0o644, data); err != nil {
			return res, err
		}
		res.Modules = append(res.Modules, "/"+name)
	}
	list := strings.Join(res.Modules, "\n")
	if list != "" {
		list += "\n"
	}
	if err := addFile(ModuleList, 0o644, []byte(list)); err != nil {
		return res, err
	}
	if err := w.Close(); err != nil {
		return res, err
	}
	if err := gz.Close(); err != nil {
		return res, err
	}
	out, err := filepath.Abs(o.Out)
	if err != nil {
		return res, err
	}
	// The output is the user's file, anywhere: published durably as every
	// file nexus writes is, under its own directory.
	if err := fsx.WriteFile(filepath.Dir(out), filepath.Base(out), buf.Bytes(), 0o644); err != nil {
		return res, err
	}
	return res, nil
}

// Dep is modules.dep: a module's path (relative to the modules directory)
// to the paths of every module it needs.
type Dep map[string][]string

// ModuleName is a module's name as modprobe spells it: base name, no .ko
// or compression suffix, dashes as underscores.
func ModuleName(rel string) string {
	base := path.Base(stripCompression(rel))
	return strings.ReplaceAll(strings.TrimSuffix(base, ".ko"), "-", "_")
}

func stripCompression(rel string) string {
	for _, ext := range []string{".xz", ".zst", ".gz"} {
		if strings.HasSuffix(rel, ".ko"+ext) {
			return strings.TrimSuffix(rel, ext)
		}
	}
	return rel
}

// Closure is the load order for wanted and optional (each module after
// every one it needs), the wanted ones the kernel builds in, and the
// optional ones it lacks. A wanted module that is neither a module nor
// built in is an error.
func Closure(dep Dep, builtin map[string]bool, wanted, optional []string) (order, inKernel, missing []string, err error) {
	byName := map[string]string{}
	for rel := range dep {
		byName[ModuleName(rel)] = rel
	}
	seen := map[string]bool{}
	var visit func(rel string, trail []string) error
	visit = func(rel string, trail []string) error {
		if seen[rel] {
			return nil
		}
		if slices.Contains(trail, rel) {
			return fmt.Errorf("modules.dep: dependency cycle through %s", rel)
		}
		needs, ok := dep[rel]
		if !ok {
			return fmt.Errorf("modules.dep: %s is needed but has no entry", rel)
		}
		for _, d := range needs {
			if err := visit(d, append(trail, rel)); err != nil {
				return err
			}
		}
		seen[rel] = true
		order = append(order, rel)
		return nil
	}
	for i, name := range append(slices.Clone(wanted), optional...) {
		name = strings.ReplaceAll(name, "-", "_")
		rel, ok := byName[name]
		switch {
		case ok:
			if err := visit(rel, nil); err != nil {
				return nil, nil, nil, err
			}
		case builtin[name]:
			inKernel = append(inKernel, name)
		case i >= len(wanted):
			missing = append(missing, name)
		default:
			return nil, nil, nil, fmt.Errorf("module %s: neither in modules.dep nor built in (modules.builtin)", name)
		}
	}
	return order, inKernel, missing, nil
}

// ParseDep reads modules.dep's "path: dep dep ..." lines.
func ParseDep(r io.Reader) (Dep, error) {
	dep := Dep{}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		mod, rest, ok := strings.Cut(line, ":")
		if !ok || mod == "" {
			return nil, fmt.Errorf("modules.dep line %d: no \"module:\" in %q", n, line)
		}
		dep[mod] = strings.Fields(rest)
	}
	return dep, sc.Err()
}

func readDep(p string) (Dep, error) {
	f, err := os.Open(p)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return ParseDep(f)
}

func readBuiltin(p string) (map[string]bool, error) {
	data, err := os.ReadFile(p)
	if err != nil {
		return nil, err
	}
	b := map[string]bool{}
	for _, line := range strings.Fields(string(data)) {
		b[ModuleName(line)] = true
	}
	return b, nil
}

// readModule returns a module's ELF bytes: /init loads them with
// finit_module, which takes compressed files only on kernels built to.
func readModule(p string) ([]byte, error) {
	f, err := os.Open(p)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var r io.Reader = f
	switch {
	case strings.HasSuffix(p, ".ko.xz"):
		if r, err = xz.NewReader(f); err != nil {
			return nil, fmt.Errorf("%s: %w", p, err)
		}
	case strings.HasSuffix(p, ".ko.zst"):
		d, err := zstd.NewReader(f)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", p, err)
		}
		defer d.Close()
		r = d
	case strings.HasSuffix(p, ".ko.gz"):
		g, err := gzip.NewReader(f)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", p, err)
		}
		r = g
	}
	data, err := io.ReadAll(r)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", p, err)
	}
	if !bytes.HasPrefix(data, []byte(elf.ELFMAG)) {
		return nil, fmt.Errorf("%s: not an ELF module", p)
	}
	return data, nil
}

// staticELF refuses what the kernel could not run as /init from an
// initramfs: anything but an ELF executable without a program interpreter.
func staticELF(p string) error {
	f, err := elf.Open(p)
	if err != nil {
		return fmt.Errorf("not an ELF executable: %w", err)
	}
	defer f.Close()
	if f.Type != elf.ET_EXEC && f.Type != elf.ET_DYN {
		return fmt.Errorf("ELF type %s, want an executable", f.Type)
	}
	for _, prog := range f.Progs {
		if prog.Type == elf.PT_INTERP {
			return errors.New("dynamically linked (it has a program interpreter): build it static, e.g. CGO_ENABLED=0")
		}
	}
	return nil
}
