package agent

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/nexus-sandbox/nexus/agentproto"
)

// Kernel command-line keys PID 1 mode reads (from /proc/cmdline, where
// dotted keys the kernel does not know stay visible).
const (
	// CmdlineWorkspace moves the workspace mount: nexus.workspace=/path.
	CmdlineWorkspace = "nexus.workspace="
	// CmdlineMount mounts a disk by serial: nexus.mount=SERIAL:/path
	// (repeatable), for volumes at their guest paths.
	CmdlineMount = "nexus.mount="
	// CmdlineInit hands PID 1 to the image's init, a path in the OS root:
	// nexus.init=/sbin/init.
	CmdlineInit = "nexus.init="
)

// VsockOnly reports whether a kernel command line carries
// agentproto.CmdlineVsockOnly.
func VsockOnly(cmdline string) bool {
	return slices.Contains(strings.Fields(cmdline), agentproto.CmdlineVsockOnly)
}

// InitPath returns the init a kernel command line hands PID 1 to, "" when
// it names none.
func InitPath(cmdline string) (string, error) {
	var init string
	for _, f := range strings.Fields(cmdline) {
		if p, ok := strings.CutPrefix(f, CmdlineInit); ok {
			if !filepath.IsAbs(p) {
				return "", fmt.Errorf("%s: want an absolute path", f)
			}
			init = filepath.Clean(p)
		}
	}
	return init, nil
}

// ParseCmdline returns the mounts a kernel command line asks for: the
// workspace (nexus-workspace at /workspace unless moved) and every
// nexus.mount. A malformed entry is an error, not a guess.
func ParseCmdline(cmdline, workspaceSerial string) (map[string]string, error) {
	mounts := map[string]string{workspaceSerial: "/workspace"}
	for _, f := range strings.Fields(cmdline) {
		switch {
		case strings.HasPrefix(f, CmdlineWorkspace):
			p := strings.TrimPrefix(f, CmdlineWorkspace)
			if !filepath.IsAbs(p) {
				return nil, fmt.Errorf("%s: want an absolute path", f)
			}
			mounts[workspaceSerial] = filepath.Clean(p)
		case strings.HasPrefix(f, CmdlineMount):
			serial, p, ok := strings.Cut(strings.TrimPrefix(f, CmdlineMount), ":")
			if !ok || serial == "" || !filepath.IsAbs(p) {
				return nil, fmt.Errorf("%s: want SERIAL:/path", f)
			}
			if _, dup := mounts[serial]; dup {
				return nil, fmt.Errorf("%s: disk %s is mounted twice", f, serial)
			}
			mounts[serial] = filepath.Clean(p)
		}
	}
	return mounts, nil
}

// MountPseudo mounts what an initramfs's PID 1 lacks: devtmpfs, proc,
// sysfs, and devpts (the terminals `exec` with tty allocates).
func MountPseudo() error {
	for _, m := range []struct{ src, dst, fstype string }{
		{"devtmpfs", "/dev", "devtmpfs"},
		{"proc", "/proc", "proc"},
		{"sysfs", "/sys", "sysfs"},
		{"devpts", "/dev/pts", "devpts"},
	} {
		os.MkdirAll(m.dst, 0o755)
		if err := unix.Mount(m.src, m.dst, m.fstype, 0, ""); err != nil && !errors.Is(err, unix.EBUSY) {
			return fmt.Errorf("mount %s: %w", m.dst, err)
		}
	}
	return nil
}

// LoadModules loads the modules a list file names, one path a line, in
// order (the initramfs builder writes it); a missing list loads nothing.
func LoadModules(list string) error { return loadModules(list) }

// MountDisks mounts each disk, found by its serial, on its directory
// (ext4; read-only when the VMM attached it read-only), waiting up to wait
// for the disks to appear. Shallower directories first, so a volume
// inside another mount lands on top of it, not beneath.
func MountDisks(mounts map[string]string, wait time.Duration) error {
	deadline := time.Now().Add(wait)
	for _, serial := range byDepth(mounts) {
		dir := mounts[serial]
		dev, err := waitDisk(serial, deadline)
		if err != nil {
			return err
		}
		os.MkdirAll(dir, 0o755)
		if err := unix.Mount(dev, dir, "ext4", readOnlyFlag(dev), ""); err != nil {
			return fmt.Errorf("mount %s (%s) on %s: %w", dev, serial, dir, err)
		}
	}
	return nil
}

// byDepth lists the serials of mounts by their directory, parents first.
func byDepth(mounts map[string]string) []string {
	serials := make([]string, 0, len(mounts))
	for s := range mounts {
		serials = append(serials, s)
	}
	slices.SortFunc(serials, func(a, b string) int {
		da, db := mounts[a], mounts[b]
		if c := strings.Count(da, "/") - strings.Count(db, "/"); c != 0 {
			return c
		}
		return strings.Compare(da, db)
	})
	return serials
}

// readOnlyFlag is MS_RDONLY for a disk the VMM attached read-only: an
// ext4 mounted read-write there would fail, and is never frozen.
func readOnlyFlag(dev string) uintptr {
	if ro, _ := os.ReadFile("/sys/block/" + filepath.Base(dev) + "/ro"); strings.TrimSpace(string(ro)) == "1" {
		return unix.MS_RDONLY
	}
	return 0
}

// SysRoot is where PID 1 mounts the OS disk: the root `exec` runs in, and
// the one a handed-over init gets.
const SysRoot = "/sysroot"

// RootOverlay says whether a kernel command line asks for the guest's root
// as an overlay over the read-only OS disk (agentproto.CmdlineRootOverlay).
func RootOverlay(cmdline string) bool {
	return slices.Contains(strings.Fields(cmdline), agentproto.CmdlineRootOverlay)
}

// OverlayDir is the directory, at the top of the writable disk an overlay
// root keeps its writes on (the workspace disk), that holds the overlay's
// upper layer (upper/) and overlayfs's work directory (work/). The guest
// sees it in the workspace as an empty, read-only directory: its content
// is the root's, reached through /.
const OverlayDir = ".nexus-root"

// overlayLower is where the read-only OS disk is mounted below an overlay
// root, in the initramfs: out of reach of the root's programs.
const overlayLower = "/run/nexus/lower"

// MountOSRoot mounts the disk whose serial is serial (the OS disk) at root,
// read-write unless the VMM attached it read-only, and makes visible inside
// it the kernel's filesystems (/dev, /proc, /sys) and every nexus mount at
// its path, so a program run in that root sees what the initramfs sees. It
// waits up to wait for the disk. With upperOn set (the mount point of a
// writable disk, the workspace's) the root is an overlay instead: the OS
// disk, read-only, below; OverlayDir on upperOn above, so every write to
// the root lands on that disk. On an error nothing stays mounted at
// root: a disk with no ext4 on it (an image nexus only copies) or a
// read-only root without a mount point is a guest without an OS root, not
// a failed boot.
func MountOSRoot(serial, root string, mounts map[string]string, upperOn string, wait time.Duration) error {
	dev, err := waitDisk(serial, time.Now().Add(wait))
	if err != nil {
		return err
	}
	os.MkdirAll(root, 0o755)
	if upperOn == "" {
		if err := unix.Mount(dev, root, "ext4", readOnlyFlag(dev), ""); err != nil {
			return fmt.Errorf("mount %s (%s) on %s: %w", dev, serial, root, err)
		}
	} else if err := mountOverlay(dev, serial, root, upperOn); err != nil {
		return err
	}
	undo := func() {
		unix.Unmount(root, unix.MNT_DETACH)
		if upperOn != "" {
			unix.Unmount(filepath.Join(upperOn, OverlayDir), unix.MNT_DETACH)
			unix.Unmount(overlayLower, unix.MNT_DETACH)
		}
	}
	binds := []string{"/dev", "/proc", "/sys"}
	for _, s := range byDepth(mounts) {
		binds = append(binds, mounts[s])
	}
	var bound []string
	for _, dir := range binds {
		// A recursive bind of a parent brought this one along.
		if slices.ContainsFunc(bound, func(b string) bool { return strings.HasPrefix(dir, b+"/") }) {
			continue
		}
		bound = append(bound, dir)
		at := filepath.Join(root, dir)
		if err := os.MkdirAll(at, 0o755); err != nil {
			undo()
			return fmt.Errorf("mount point %s in the OS root: %w", dir, err)
		}
		// Recursive, so /dev/pts (the terminals exec with tty uses) and
		// anything mounted below a nexus mount come along.
		if err := unix.Mount(dir, at, "", unix.MS_BIND|unix.MS_REC, ""); err != nil {
			undo()
			return fmt.Errorf("bind %s into the OS root: %w", dir, err)
		}
	}
	return nil
}

// mountOverlay mounts at root an overlay of the OS disk dev (read-only,
// at overlayLower) under OverlayDir on upperOn, then covers OverlayDir in
// upperOn with an empty read-only tmpfs: the layers are overlayfs's alone
// (a guest editing them directly would corrupt its root), and a copy of
// the workspace does not carry the root's files. The cover is mounted
// before the workspace is bound into the root, so the bind brings it.
func mountOverlay(dev, serial, root, upperOn string) error {
	dir := filepath.Join(upperOn, OverlayDir)
	// overlayfs splits its options on commas and its lower layers on
	// colons, and nexus puts none in these paths: one given on the kernel
	// command line (nexus.workspace=) is refused, not misread.
	if strings.ContainsAny(dir, ",:\\") {
		return fmt.Errorf("overlay root: %s has a comma, colon or backslash, which overlayfs options cannot carry", dir)
	}
	upper, work := filepath.Join(dir, "upper"), filepath.Join(dir, "work")
	for _, d := range []string{upper, work} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return fmt.Errorf("overlay root: %w", err)
		}
	}
	if err := os.Chmod(dir, 0o700); err != nil {
		return fmt.Errorf("overlay root: %w", err)
	}
	os.MkdirAll(overlayLower, 0o755)
	// Read-only whatever the VMM says: the entry is shared by every
	// sandbox of the image, and a lower layer must not change under an
	// overlay.
	if err := unix.Mount(dev, overlayLower, "ext4", unix.MS_RDONLY, ""); err != nil {
		return fmt.Errorf("mount %s (%s) on %s: %w", dev, serial, overlayLower, err)
	}
	opts := "lowerdir=" + overlayLower + ",upperdir=" + upper + ",workdir=" + work
	if err := unix.Mount("overlay", root, "overlay", 0, opts); err != nil {
		unix.Unmount(overlayLower, 0)
		return fmt.Errorf("mount the overlay root (%s) on %s: %w", opts, root, err)
	}
	if err := unix.Mount("tmpfs", dir, "tmpfs", unix.MS_RDONLY|unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, "size=4k,mode=0500"); err != nil {
		unix.Unmount(root, 0)
		unix.Unmount(overlayLower, 0)
		return fmt.Errorf("cover %s: %w", dir, err)
	}
	return nil
}

// SwitchRoot makes root the root of the mount tree and of this process
// and execs init there, as switch_root does: the initramfs stays beneath,
// unreachable, and init becomes PID 1 with the OS root's mounts. It
// returns only on failure.
func SwitchRoot(root, init string, env []string) error {
	if err := unix.Chdir(root); err != nil {
		return err
	}
	if err := unix.Mount(".", "/", "", unix.MS_MOVE, ""); err != nil {
		return fmt.Errorf("move %s to /: %w", root, err)
	}
	if err := unix.Chroot("."); err != nil {
		return err
	}
	if err := unix.Chdir("/"); err != nil {
		return err
	}
	// Checked here, in the new root, where an absolute symlink such as
	// /sbin/init -> /lib/systemd/systemd resolves.
	if fi, err := os.Stat(init); err != nil {
		return err
	} else if !fi.Mode().IsRegular() || fi.Mode().Perm()&0o111 == 0 {
		return fmt.Errorf("%s is not an executable file", init)
	}
	return unix.Exec(init, []string{init}, env)
}

// EnterRoot makes root this process's root and working directory (every
// thread's: Go's threads share one fs context), so exec, file paths and
// the freeze's mount table are all the OS root's.
func EnterRoot(root string) error {
	if err := unix.Chdir(root); err != nil {
		return err
	}
	if err := unix.Chroot("."); err != nil {
		return err
	}
	return unix.Chdir("/")
}

func loadModules(list string) error {
	f, err := os.Open(list)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil
		}
		return err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		p := strings.TrimSpace(sc.Text())
		if p == "" {
			continue
		}
		m, err := os.Open(p)
		if err != nil {
			return fmt.Errorf("module %s: %w", p, err)
		}
		err = unix.FinitModule(int(m.Fd()), "", 0)
		m.Close()
		if err != nil && !errors.Is(err, unix.EEXIST) {
			return fmt.Errorf("load module %s: %w", p, err)
		}
	}
	return sc.Err()
}

// DiskBySerial returns /dev/<name> of the block device whose virtio serial
// is serial, or "" when none is there (yet).
func DiskBySerial(serial string) string {
	paths, _ := filepath.Glob("/sys/block/*/serial")
	for _, p := range paths {
		b, err := os.ReadFile(p)
		if err == nil && strings.TrimSpace(string(b)) == serial {
			return "/dev/" + filepath.Base(filepath.Dir(p))
		}
	}
	return ""
}

func waitDisk(serial string, deadline time.Time) (string, error) {
	for {
		if dev := DiskBySerial(serial); dev != "" {
			return dev, nil
		}
		if time.Now().After(deadline) {
			return "", fmt.Errorf("no disk with serial %s appeared", serial)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// PortByName returns the /dev node of the virtio-serial port named name
// (what udev would link as /dev/virtio-ports/<name>; an initramfs has no
// udev), waiting until deadline.
func PortByName(name string, deadline time.Time) (string, error) {
	for {
		paths, _ := filepath.Glob("/sys/class/virtio-ports/*/name")
		for _, p := range paths {
			b, err := os.ReadFile(p)
			if err == nil && strings.TrimSpace(string(b)) == name {
				return "/dev/" + filepath.Base(filepath.Dir(p)), nil
			}
		}
		if time.Now().After(deadline) {
			return "", fmt.Errorf("no virtio-serial port named %s appeared", name)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
