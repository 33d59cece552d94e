package testutil

import (
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"testing"
)

// RequireQEMUEnv set to 1 makes a missing QEMU or guest kernel a test
// failure instead of a skip: `make test` sets it (and `make setup-test`
// installs both), so CI never passes by skipping the real-guest tests.
const RequireQEMUEnv = "NEXUS_REQUIRE_QEMU"

// Guest is what a real-guest test boots: a QEMU and a distro kernel whose
// modules are installed (an initramfs is built from them).
type Guest struct {
	QEMU    string
	Kernel  string // /boot/vmlinuz-<release>
	Release string
}

// RealGuest finds qemu-system-x86_64 and a kernel (NEXUS_TEST_KERNEL, else
// the newest /boot/vmlinuz-*-cloud-amd64) with modules under /lib/modules,
// and logs which it found, so each test says what it ran on.
func RealGuest(t testing.TB) Guest {
	t.Helper()
	// A software-emulated boot is seconds of CPU: not a unit test.
	SkipInShort(t, "boots a real guest under QEMU")
	missing := func(what string) {
		t.Helper()
		if os.Getenv(RequireQEMUEnv) == "1" {
			t.Fatalf("%s, and %s=1 (make setup-test installs qemu-system-x86 and linux-image-cloud-amd64)", what, RequireQEMUEnv)
		}
		t.Skipf("%s (make setup-test installs it; %s=1 makes this a failure)", what, RequireQEMUEnv)
	}
	q, err := exec.LookPath("qemu-system-x86_64")
	if err != nil {
		missing("no qemu-system-x86_64 in PATH")
	}
	kernel := os.Getenv("NEXUS_TEST_KERNEL")
	if kernel == "" {
		found, _ := filepath.Glob("/boot/vmlinuz-*-cloud-amd64")
		sort.Strings(found)
		if len(found) == 0 {
			missing("no /boot/vmlinuz-*-cloud-amd64")
		}
		kernel = found[len(found)-1]
	}
	release := strings.TrimPrefix(filepath.Base(kernel), "vmlinuz-")
	if _, err := os.Stat(filepath.Join("/lib/modules", release, "modules.dep")); err != nil {
		missing("kernel " + kernel + " has no /lib/modules/" + release + "/modules.dep")
	}
	ver, _ := exec.Command(q, "--version").Output()
	t.Logf("guest: kernel release %s (%s), %s", release, kernel, strings.SplitN(string(ver), "\n", 2)[0])
	return Guest{QEMU: q, Kernel: kernel, Release: release}
}

// StartsSandboxes marks a test that starts sandboxes' VMMs and supervisors,
// a real guest or a cluster: seconds of processes each, so -short (make
// test-fast) leaves it out and make test runs it.
func StartsSandboxes(t testing.TB) {
	t.Helper()
	SkipInShort(t, "starts sandboxes, guests or a cluster")
}
