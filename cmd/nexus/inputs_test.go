package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/nexus-sandbox/nexus/internal/testutil"
)

// Each odd input is judged once, before anything is written: an image
// must be a regular file with data, raw (not qcow2), outside the state root, and a link to
// one outside the root is resolved and the resolved path recorded; a
// handle must not read as a sandbox ID or as a prefix of a live one's.
func TestOddInputsAreRefusedOrResolved(t *testing.T) {
	testutil.StartsSandboxes(t)
	t.Parallel()
	root := shortRoot(t)
	image := makeImage(t)
	first := createJSON(t, root, "--image", image)

	dir := t.TempDir()
	empty := filepath.Join(dir, "empty.raw")
	if err := os.WriteFile(empty, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	// A qcow2 image: its header, then what would be its clusters.
	qcow2 := filepath.Join(dir, "base.qcow2")
	if err := os.WriteFile(qcow2, append([]byte("QFI\xfb\x00\x00\x00\x03"), make([]byte, 4096)...), 0o600); err != nil {
		t.Fatal(err)
	}
	ownDisk := filepath.Join(root, "disks", first.ID+"-workspace.ext4")
	linkIn := filepath.Join(dir, "own.raw")
	if err := os.Symlink(ownDisk, linkIn); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		args    []string
		mention string
	}{
		{[]string{"--image", empty}, "empty (0 bytes)"},
		{[]string{"--image", qcow2}, "is a qcow2 image; nexus boots raw images only"},
		{[]string{"--image", "/proc/self/mem"}, "kernel pseudo-file"},
		{[]string{"--image", dir}, "not a regular file (a directory)"},
		{[]string{"--image", ownDisk}, "inside the state root"},
		{[]string{"--image", linkIn}, "inside the state root"},
		{[]string{"--image", image, "--handle", first.ID[:8]}, "is a prefix of the ID or short ID of sandbox " + first.ID},
		{[]string{"--image", image, "--handle", strings.ToLower(first.ID[:6])}, "is a prefix of the ID or short ID of sandbox " + first.ID},
		{[]string{"--image", image, "--handle", first.ID[:25] + "Z"}, "reads as a sandbox ID"},
	} {
		r := proc(t, root, append([]string{"create"}, c.args...)...)
		wantFailure(t, r, 1, c.mention)
	}
	if n := len(sandboxes(t, root)); n != 1 {
		t.Fatalf("refused creates left %d sandboxes", n)
	}

	// images/current -> base.raw, the common layout: resolved once.
	current := filepath.Join(filepath.Dir(image), "current")
	if err := os.Symlink(filepath.Base(image), current); err != nil {
		t.Fatal(err)
	}
	sb := createJSON(t, root, "--image", current)
	if sb.Image != image {
		t.Fatalf("a linked image is recorded as %q, want the resolved %q", sb.Image, image)
	}
	journalMatchesDisk(t, root)
}

// Cloud Hypervisor binds its API socket by name: a state root too deep
// for run/sb-<ID>.sock to fit sun_path is refused before anything is
// written, naming the limit, whether or not CH is installed.
func TestCHRefusesAnAPISocketPathTooLong(t *testing.T) {
	t.Parallel()
	base := shortRoot(t)
	root := filepath.Join(base, strings.Repeat("d", 100))
	if err := os.Mkdir(root, 0o700); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { testutil.StopDaemons(root) })
	r := nexusEnv(t, root, []string{"NEXUS_KERNEL_PATH=" + makeImage(t)}, "--driver", "cloud-hypervisor", "create", "--image", makeImage(t))
	wantFailure(t, r, 1, "sun_path")
	if n := len(sandboxes(t, root)); n != 0 {
		t.Fatalf("a refused create left %d sandboxes", n)
	}
}
