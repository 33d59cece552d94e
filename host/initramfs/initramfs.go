// Package initramfs builds a guest's initramfs: a newc cpio archive with
// nexus-agent as /init, the kernel modules it loads (in modules.dep order)
// and the few nodes a Go /init needs before devtmpfs is mounted.
package initramfs

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"strings"
)

// ModuleList is where the agent, as PID 1, reads the modules to load, one
// path a line, in load order.
const ModuleList = "etc/nexus/modules"

// GuestModules are the modules a distro kernel needs for nexus's devices,
// when they are not built in: virtio over PCI, its disks, the
// virtio-serial port and vsock.
var GuestModules = []string{"virtio_pci", "virtio_blk", "virtio_console", "vmw_vsock_virtio_transport"}

// Entry is one archive member.
type Entry struct {
	Name  string // path inside the archive, no leading slash
	Mode  uint32 // type and permission bits (S_IFREG|0755, S_IFDIR|0755, S_IFCHR|0600)
	Data  []byte // regular files
	Major uint32 // character devices
	Minor uint32
}

// Mode type bits, as cpio stores them.
const (
	TypeReg = 0o100000
	TypeDir = 0o040000
	TypeChr = 0o020000
)

// Write writes entries as a newc cpio archive, ending with the trailer.
func Write(w io.Writer, entries []Entry) error {
	bw := bufio.NewWriter(w)
	for i, e := range entries {
		if err := writeEntry(bw, uint32(i+1), e.Name, e.Mode, e.Data, e.Major, e.Minor); err != nil {
			return err
		}
	}
	if err := writeEntry(bw, 0, "TRAILER!!!", 0, nil, 0, 0); err != nil {
		return err
	}
	return bw.Flush()
}

func writeEntry(w *bufio.Writer, ino uint32, name string, mode uint32, data []byte, major, minor uint32) error {
	nlink := uint32(1)
	if mode&TypeDir == TypeDir && mode&TypeReg == 0 {
		nlink = 2
	}
	// newc: magic, then 13 fields of 8 hex digits (ino, mode, uid, gid,
	// nlink, mtime, filesize, devmajor, devminor, rdevmajor, rdevminor,
	// namesize, check), the name with its NUL, padded to 4, the data padded
	// to 4.
	hdr := fmt.Sprintf("070701%08x%08x%08x%08x%08x%08x%08x%08x%08x%08x%08x%08x%08x",
		ino, mode, 0, 0, nlink, 0, len(data), 0, 0, major, minor, len(name)+1, 0)
	if _, err := w.WriteString(hdr); err != nil {
		return err
	}
	w.WriteString(name)
	w.WriteByte(0)
	pad(w, len(hdr)+len(name)+1)
	w.Write(data)
	return pad(w, len(data))
}

func pad(w *bufio.Writer, n int) error {
	for ; n%4 != 0; n++ {
		if err := w.WriteByte(0); err != nil {
			return err
		}
	}
	return nil
}

// ResolveModules lists the module files (relative to modDir, the kernel's
// /lib/modules/<release>) that loading names needs, dependencies first,
// each once, from modDir's modules.dep. A name built into the kernel
// (listed in modules.builtin) needs nothing; one found in neither is an
// error.
func ResolveModules(modDir string, names []string) ([]string, error) {
	deps, err := readDep(filepath.Join(modDir, "modules.dep"))
	if err != nil {
		return nil, err
	}
	builtin := map[string]bool{}
	if f, err := os.Open(filepath.Join(modDir, "modules.builtin")); err == nil {
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			builtin[modName(sc.Text())] = true
		}
		f.Close()
	}
	byName := map[string]string{}
	for file := range deps {
		byName[modName(file)] = file
	}
	var out []string
	seen := map[string]bool{}
	var visit func(file string)
	visit = func(file string) {
		if seen[file] {
			return
		}
		seen[file] = true
		// modules.dep lists a module's dependencies in an order that
		// loads correctly from last to first.
		d := deps[file]
		for i := len(d) - 1; i >= 0; i-- {
			visit(d[i])
		}
		out = append(out, file)
	}
	for _, n := range names {
		n = strings.ReplaceAll(n, "-", "_")
		if file, ok := byName[n]; ok {
			visit(file)
			continue
		}
		if builtin[n] {
			continue
		}
		return nil, fmt.Errorf("module %s: neither in %s/modules.dep nor built in", n, modDir)
	}
	return out, nil
}

func readDep(p string) (map[string][]string, error) {
	f, err := os.Open(p)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	deps := map[string][]string{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		file, rest, ok := strings.Cut(sc.Text(), ":")
		if !ok {
			continue
		}
		deps[file] = strings.Fields(rest)
	}
	return deps, sc.Err()
}

// modName is a module's name from its file path: base name without
// .ko[.xz|.zst|.gz], dashes as underscores.
func modName(file string) string {
	base := path.Base(file)
	if i := strings.Index(base, ".ko"); i >= 0 {
		base = base[:i]
	}
	return strings.ReplaceAll(base, "-", "_")
}

// Build assembles an initramfs: agent as /init, the modules (files under
// modDir) and the list the agent loads them from, /dev/console, the mount
// points PID 1 uses, and any extra entries (after the rest, so their
// directories may be among them or the standard ones).
func Build(w io.Writer, agent []byte, modDir string, modules []string, extra ...Entry) error {
	entries := []Entry{
		{Name: "dev", Mode: TypeDir | 0o755},
		{Name: "dev/console", Mode: TypeChr | 0o600, Major: 5, Minor: 1},
		{Name: "proc", Mode: TypeDir | 0o755},
		{Name: "sys", Mode: TypeDir | 0o755},
		{Name: "tmp", Mode: TypeDir | 0o1777},
		{Name: "workspace", Mode: TypeDir | 0o755},
		{Name: "etc", Mode: TypeDir | 0o755},
		{Name: "etc/nexus", Mode: TypeDir | 0o755},
		{Name: "init", Mode: TypeReg | 0o755, Data: agent},
	}
	dirs := map[string]bool{}
	var mods []Entry
	var list strings.Builder
	for _, m := range modules {
		data, err := os.ReadFile(filepath.Join(modDir, m))
		if err != nil {
			return err
		}
		name := path.Join("lib/modules", m)
		for d := path.Dir(name); d != "." && !dirs[d]; d = path.Dir(d) {
			dirs[d] = true
		}
		mods = append(mods, Entry{Name: name, Mode: TypeReg | 0o644, Data: data})
		fmt.Fprintln(&list, "/"+name)
	}
	var dirEntries []Entry
	for d := range dirs {
		dirEntries = append(dirEntries, Entry{Name: d, Mode: TypeDir | 0o755})
	}
	// Directories precede what they hold, parents before children.
	sortByLen(dirEntries)
	entries = append(entries, dirEntries...)
	entries = append(entries, mods...)
	entries = append(entries, Entry{Name: ModuleList, Mode: TypeReg | 0o644, Data: []byte(list.String())})
	return Write(w, append(entries, extra...))
}

func sortByLen(es []Entry) {
	for i := 1; i < len(es); i++ {
		for j := i; j > 0 && (len(es[j].Name) < len(es[j-1].Name) || len(es[j].Name) == len(es[j-1].Name) && es[j].Name < es[j-1].Name); j-- {
			es[j], es[j-1] = es[j-1], es[j]
		}
	}
}
